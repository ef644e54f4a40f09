"""Per-policy figures from a finished simulation (the ``results.json`` schema).

On a cluster with typed partitions, ``util_by_type`` adds the utilisation of each GPU
type, defined as the overall figure is (allocated GPU-time on that type's nodes over its
GPUs × the makespan); ``results.json`` carries it as ``gpu_util_by_type`` for such
clusters only, so an untyped cluster's results are what they always were."""

from __future__ import annotations

import numpy as np

from slurm_elastic.sim.runner import ORIGIN, Outcome

FIELDS = (
    "jobs_finished",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "makespan_s",
    "gpu_util",
    "resizes",
    "gpu_hours",
)


def summarize(outcome: Outcome) -> dict[str, float | int]:
    """JCT = end − submit; queueing = first start − submit; makespan = last end − first
    submit; utilisation = allocated GPU-time / (GPUs × makespan); GPU-hours count every
    allocated GPU, companions included; resizes = world-size changes of running jobs."""
    jobs = [j for j in outcome.jobs if j.state.value == "COMPLETED"]
    if not jobs:
        return dict.fromkeys(FIELDS, 0)
    jct = np.array([j.end - j.submit for j in jobs])  # type: ignore[operator]
    queue = np.array([j.start - j.submit for j in jobs])  # type: ignore[operator]
    makespan = _makespan(outcome)
    g = outcome.gpus_per_node
    node_seconds = sum(j.node_seconds for j in outcome.all_jobs)
    capacity = outcome.total_nodes * makespan
    return {
        "jobs_finished": len(jobs),
        "avg_jct_s": round(float(jct.mean()), 1),
        "p50_jct_s": round(float(np.percentile(jct, 50)), 1),
        "p95_jct_s": round(float(np.percentile(jct, 95)), 1),
        "p99_jct_s": round(float(np.percentile(jct, 99)), 1),
        "avg_queue_s": round(float(queue.mean()), 1),
        "makespan_s": round(makespan, 1),
        "gpu_util": round(node_seconds / capacity, 4) if capacity > 0 else 0.0,
        "resizes": int(sum(j.resizes for j in jobs)),
        "gpu_hours": round(node_seconds * g / 3600.0, 1),
    }


def _makespan(outcome: Outcome) -> float:
    first = min(j.submit for j in outcome.jobs)
    last = max(j.end or 0.0 for j in outcome.all_jobs)
    return last - first


def util_by_type(outcome: Outcome) -> dict[str, float]:
    """GPU type -> allocated GPU-time on its nodes / (its GPUs × makespan), as ``gpu_util``
    (the allocation unit is the same on every node, so node-time gives the ratio); empty
    for an untyped cluster.  A job's periods, companions' included, all lie in the
    partition it ran in."""
    nodes: dict[str, int] = {}
    for part in outcome.partitions:
        if part.gpu_type:
            nodes[part.gpu_type] = nodes.get(part.gpu_type, 0) + part.nodes
    if not nodes:
        return {}
    busy = dict.fromkeys(nodes, 0.0)
    types = {p.name: p.gpu_type for p in outcome.partitions}
    for job in outcome.all_jobs:
        if types[job.partition]:
            busy[types[job.partition]] += job.node_seconds
    span = _makespan(outcome) if outcome.jobs else 0.0
    return {t: round(busy[t] / (n * span), 4) if span > 0 else 0.0 for t, n in nodes.items()}


def timeline(outcome: Outcome) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hours since the first submission, busy GPUs, queued jobs) at every event."""
    if not outcome.samples:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    first = min((j.submit for j in outcome.jobs), default=ORIGIN)
    t = np.array([s.time for s in outcome.samples])
    busy = np.array([s.busy_nodes for s in outcome.samples]) * outcome.gpus_per_node
    queued = np.array([s.queued for s in outcome.samples])
    return (t - first) / 3600.0, busy, queued
