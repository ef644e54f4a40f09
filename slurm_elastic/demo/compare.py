"""The same job mix under the static policy: simulated with the simulator's own code.

Each demo job becomes a ``sim.workload.JobSpec`` with what the demo measured: its arrival
offset, its node range, its work (training steps for an elastic job, seconds of sleep for
a rigid one) and, for an elastic job, its speed at every size it was observed at (steps
per second from its own progress reports; ``Profile.rate_at`` interpolates between them
and stays flat outside them, so no speed-up is assumed that was not seen).  Under
``static`` an elastic job is the rigid job it would be without the daemon: it asks for its
maximum and keeps it.  The same workload is also simulated under ``mip`` (the daemon's
policy, with the demo's guard settings) so that the two simulated columns differ only in
the policy.  Everything here is simulated and is labelled so by the callers.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_elastic.config import Config

RESTART_S = 15.0  # SLURM-FACTS: grow 12-19 s, shrink 9-13 s with tuned rendezvous timeouts
CHECKPOINT_S = 1.0  # the example's checkpoint is a few kB


@dataclass(frozen=True, slots=True)
class MixJob:
    """One job of the demo's mix as the simulator replays it, with its measured rates."""

    name: str
    submit_s: float  # seconds after the first submission
    min_nodes: int
    max_nodes: int
    elastic: bool
    work: float  # steps (elastic) or seconds (rigid)
    rates: Mapping[int, float]  # nodes -> steps/s measured (elastic); empty for rigid


def simulate_mix(
    jobs: Sequence[MixJob],
    nodes: int,
    config: Config,
    policies: Sequence[str] = ("static", "mip"),
    *,
    resize_s: float | None = None,
    stop_free: bool = False,
) -> dict[str, dict[str, Any]]:
    """Policy -> {"jobs": {name: {"jct_s", "start_s", "end_s", "sizes"}}, "summary": {...}}.

    ``resize_s``: what one resize of an elastic job costs it: a restart (default
    ``RESTART_S``), or in the stop-free mode the survivors' pause, with no checkpoint
    written (default the simulator's measured ``STOP_FREE_PAUSE_S``)."""
    # The simulator (numpy/scipy/highspy) loads only when a comparison is made.
    from slurm_elastic.sim.engine import ClusterSpec, PartitionSpec
    from slurm_elastic.sim.metrics import summarize
    from slurm_elastic.sim.runner import ORIGIN, ControllerDriver, SimSettings, simulate
    from slurm_elastic.sim.workload import STOP_FREE_PAUSE_S, Workload

    if resize_s is None:
        resize_s = STOP_FREE_PAUSE_S if stop_free else RESTART_S
    specs = tuple(_spec(i, j, resize_s, stop_free) for i, j in enumerate(jobs, 1))
    workload = Workload(jobs=specs, rejected=())
    spec = ClusterSpec(partitions=(PartitionSpec("batch", nodes),), gpus_per_node=1)
    names = {i: j.name for i, j in enumerate(jobs, 1)}
    first = min(j.submit_s for j in jobs)

    def driver(backend: Any, cluster: Any, settings: SimSettings) -> ControllerDriver:
        d = ControllerDriver(backend, cluster, settings)
        # The demo's own guards and interval, with the policy under study.
        policy = config.policy.model_copy(update={"name": settings.policy})
        d.controller.reconfigure(config.model_copy(update={"policy": policy}))
        return d

    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        settings = SimSettings(
            policy=policy, interval_s=config.interval_s, refresh_s=30.0, report_every_s=5.0
        )
        outcome = simulate(workload, spec, settings, driver_factory=driver)
        per_job: dict[str, dict[str, Any]] = {}
        for job in outcome.jobs:
            base = ORIGIN + first
            per_job[names[job.job_id]] = {
                "state": job.state.value,
                "start_s": None if job.start is None else round(job.start - base, 1),
                "end_s": None if job.end is None else round(job.end - base, 1),
                "jct_s": None if job.end is None else round(job.end - job.submit, 1),
                "sizes": [[round(p.start - base, 1), len(p.nodes)] for p in job.periods],
            }
        results[policy] = {"jobs": per_job, "summary": summarize(outcome)}
    return results


def _spec(sim_id: int, job: MixJob, resize_s: float, stop_free: bool) -> Any:
    from slurm_elastic.sim.profiles import Curve, Profile
    from slurm_elastic.sim.workload import JobSpec

    rates = dict(job.rates) if job.elastic and job.rates else {job.max_nodes: 1.0}
    sizes = sorted(rates)
    profile = Profile(
        model=job.name,
        batch=1,
        gpus=tuple(float(n) for n in sizes),
        rate=tuple(rates[n] for n in sizes),
        # Only the shape matters to the daemon's convergence model; the work is exact.
        curve=Curve(fraction=(0.0, 1.0), metric=(1.0, 0.05), higher_is_better=False),
        checkpoint_s=CHECKPOINT_S,
        source="slurm-elastic demo (measured)",
    )
    return JobSpec(
        sim_id=sim_id,
        trace_id=job.name,
        submit_s=job.submit_s,
        user="root",
        partition="batch",
        req_gpus=job.max_nodes,
        req_nodes=job.max_nodes,
        elastic=job.elastic,
        min_nodes=job.min_nodes,
        max_nodes=job.max_nodes,
        step=1,
        profile=profile,
        work=job.work,
        restart_s=resize_s,
        checkpoint_s=0.0 if stop_free else CHECKPOINT_S,
        stop_free=stop_free,
    )


def measured_rates(
    progress: Sequence[tuple[float, int]],
    sizes: Sequence[tuple[float, int]],
    *,
    settle_s: float = 8.0,
    min_span_s: float = 6.0,
) -> dict[int, float]:
    """Steps/s per size from a job's reports ``(reported_at, step)`` and its observed
    size changes ``(t, nodes)``: the step slope over each stretch at one size, leaving out
    the first ``settle_s`` seconds after a change (the restart); the longest stretch wins."""
    best: dict[int, tuple[float, float]] = {}  # nodes -> (span, rate)
    bounds = [*sizes, (float("inf"), 0)]
    for (t0, n), (t1, _) in itertools.pairwise(bounds):
        if n <= 0:
            continue
        inside = sorted((t, s) for t, s in progress if t0 + settle_s <= t <= t1)
        if len(inside) < 2:
            continue
        span = inside[-1][0] - inside[0][0]
        gained = inside[-1][1] - inside[0][1]
        if span >= min_span_s and gained > 0 and span > best.get(n, (0.0, 0.0))[0]:
            best[n] = (span, gained / span)
    return {n: rate for n, (_, rate) in sorted(best.items())}
