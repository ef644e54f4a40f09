"""Harm per job: how much longer each job waited under a policy than under ``static``.

Averages hide who pays for elasticity: a policy can halve the average completion time while
a few rigid jobs wait hours longer behind nodes lent to elastic ones.  So the same workload
is replayed under the policy and under ``static`` (the daemon never resizes: plain Slurm's
FIFO and backfill over the sizes jobs asked for), each trace job is matched with itself
(``JobSpec.sim_id``), and the figures are per class (rigid jobs, elastic jobs):

* ``avg_queue_over_static``: mean queue time (first start - submit) under the policy over
  the mean under static (1.0 when both are 0);
* ``p95_queue_s`` and ``static_p95_queue_s``;
* ``late_10min_share``, ``late_1h_share``: the share of jobs that waited more than 10 min
  (1 h) longer than under static;
* ``worst_extra_wait_h``: the largest extra wait of one job, in hours (0 when none waited
  longer);
* ``avg_jct_over_static``: mean completion time (end - submit) over static's.

Only jobs that finished in both runs count (``jobs``).

How much of a policy's per-job harm is the policy's?  On an overloaded queue, FIFO and
backfill amplify any change: one job ending early changes which job takes its nodes, which
moves the backfill windows of the jobs behind it, and so on.  ``elastic_work_scaled`` gives
the yardstick: the same workload with every elastic job's work scaled (0.999: each finishes
0.1 % sooner, and nothing else differs), to be replayed under ``static`` and compared with
``static`` by ``harm``.  What it shows is what static scheduling itself does to each job
when the elastic jobs do no more than finish a little sooner, with no daemon at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from slurm_elastic.sim.engine import SimJob
from slurm_elastic.sim.runner import Outcome
from slurm_elastic.sim.workload import Workload
from slurm_elastic.types import JobState

LATE_S = {"late_10min_share": 600.0, "late_1h_share": 3600.0}


@dataclass(frozen=True, slots=True)
class Harm:
    """One class of jobs (rigid or elastic) under a policy, against static."""

    jobs: int
    avg_queue_over_static: float
    p95_queue_s: float
    static_p95_queue_s: float
    late_10min_share: float
    late_1h_share: float
    worst_extra_wait_h: float
    avg_jct_over_static: float

    def to_json(self) -> dict[str, float | int]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _finished(outcome: Outcome, elastic: bool) -> dict[int, SimJob]:
    return {
        j.spec.sim_id: j
        for j in outcome.jobs
        if j.spec is not None
        and j.spec.elastic is elastic
        and j.state is JobState.COMPLETED
        and j.start is not None
        and j.end is not None
    }


def _ratio(value: float, base: float) -> float:
    if base > 0:
        return value / base
    return 1.0 if value <= 0 else float("inf")


def harm(outcome: Outcome, static: Outcome, *, elastic: bool) -> Harm | None:
    """The figures for the rigid (``elastic=False``) or elastic jobs of ``outcome`` against
    the same jobs under ``static``; None when no such job finished in both."""
    mine, base = _finished(outcome, elastic), _finished(static, elastic)
    both = sorted(mine.keys() & base.keys())
    if not both:
        return None

    def queue(job: SimJob) -> float:
        return float(job.start - job.submit)  # type: ignore[operator]

    def jct(job: SimJob) -> float:
        return float(job.end - job.submit)  # type: ignore[operator]

    q = np.array([queue(mine[i]) for i in both])
    q0 = np.array([queue(base[i]) for i in both])
    extra = q - q0
    late = {name: float(np.mean(extra > limit)) for name, limit in LATE_S.items()}
    return Harm(
        jobs=len(both),
        avg_queue_over_static=_ratio(float(q.mean()), float(q0.mean())),
        p95_queue_s=float(np.percentile(q, 95)),
        static_p95_queue_s=float(np.percentile(q0, 95)),
        late_10min_share=late["late_10min_share"],
        late_1h_share=late["late_1h_share"],
        worst_extra_wait_h=max(0.0, float(extra.max())) / 3600.0,
        avg_jct_over_static=_ratio(
            float(np.mean([jct(mine[i]) for i in both])),
            float(np.mean([jct(base[i]) for i in both])),
        ),
    )


def elastic_work_scaled(workload: Workload, factor: float) -> Workload:
    """``workload`` with every elastic job's work times ``factor``; rigid jobs unchanged."""
    if not factor > 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    jobs = tuple(replace(j, work=j.work * factor) if j.elastic else j for j in workload.jobs)
    return replace(workload, jobs=jobs)
