"""Independent checks of a finished simulation (used by the tests and the benchmark).

``replayed_work`` recomputes a job's progress from its recorded allocations alone —
its own node periods, its companions' periods, and its no-progress intervals (restarts,
checkpoint holds) — so it does not share the engine's incremental accounting.  On a
cluster with typed partitions it needs the type of each partition (``ClusterSpec.gpu_types``):
a job progresses at the speed of the GPUs of the partition it ran in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from slurm_elastic.sim.engine import SimJob


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlap(a: float, b: float, paused: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in paused)


def replayed_work(job: SimJob, companions: Iterable[SimJob], gpu_type: str = "") -> float:
    """Steps the job made according to its allocation history (rate × productive time) on
    GPUs of ``gpu_type`` ("": untyped)."""
    assert job.spec is not None
    periods = [(p.start, p.end, len(p.nodes)) for p in job.periods]
    periods += [(p.start, p.end, len(p.nodes)) for c in companions for p in c.periods]
    cuts = sorted({t for s, e, _ in periods for t in (s, e) if t is not None})
    paused = _union(job.pauses)
    work = 0.0
    for a, b in itertools.pairwise(cuts):
        world = sum(n for s, e, n in periods if s <= a and e is not None and e >= b)
        if world == 0 or b <= a:
            continue
        work += job.spec.rate_at(world, gpu_type) * ((b - a) - _overlap(a, b, paused))
    return work


def conservation_errors(
    jobs: Iterable[SimJob], rel_tol: float = 1e-6, gpu_types: Mapping[str, str] | None = None
) -> list[str]:
    """One line per finished trace job whose replayed work differs from its demand
    (``gpu_types``: partition -> GPU type, for a typed cluster)."""
    types = gpu_types or {}
    everyone = list(jobs)
    by_parent: dict[int, list[SimJob]] = {}
    for j in everyone:
        if j.parent is not None:
            by_parent.setdefault(j.parent, []).append(j)
    errors = []
    for j in everyone:
        if j.spec is None or j.state.value != "COMPLETED":
            continue
        done = replayed_work(j, by_parent.get(j.job_id, ()), types.get(j.partition, ""))
        if abs(done - j.spec.work) > rel_tol * max(1.0, j.spec.work):
            errors.append(f"job {j.job_id}: replayed {done:.6g} steps, demanded {j.spec.work:.6g}")
    return errors
