"""Row usage bookkeeping for the constructive policies (static, greedy) and the MIP's
admission floor."""

from __future__ import annotations

import numpy as np

from slurm_elastic.policy.compiled import Compiled, FloatArray

_EPS = 1e-9


class Ledger:
    """Usage of every row under a choice that starts at every job's floor (index 0)."""

    def __init__(self, compiled: Compiled) -> None:
        self._jobs = compiled.jobs
        self.rhs: FloatArray = compiled.rhs
        self.usage: FloatArray = compiled.floor_usage()
        self.choice: list[int] = [0] * len(compiled.jobs)

    def violated(self, i: int, to: int) -> int | None:
        """First row (global index) that moving job ``i`` to candidate ``to`` would overfill."""
        job = self._jobs[i]
        delta = job.coef[:, to] - job.coef[:, self.choice[i]]
        over = self.usage[job.rows] + delta > self.rhs[job.rows] + _EPS
        hit = np.flatnonzero(over & (delta > 0))
        return int(job.rows[hit[0]]) if hit.size else None

    def fits(self, i: int, to: int) -> bool:
        return self.violated(i, to) is None

    def move(self, i: int, to: int) -> None:
        job = self._jobs[i]
        self.usage[job.rows] += job.coef[:, to] - job.coef[:, self.choice[i]]
        self.choice[i] = to


def admit_fifo_minimums(compiled: Compiled, ledger: Ledger) -> list[int]:
    """Optimus' first step: in FIFO order, every pending job whose minimum still fits is
    moved to it in ``ledger``; returns the jobs admitted.

    Greedy starts from it; the MIP's admission floor (``PolicyOptions.fair_floor``) makes
    the jobs it admits start.  Running and frozen jobs stay at their floor (a frozen job
    has one candidate, so it is never moved).
    """
    jobs = compiled.jobs
    admitted: list[int] = []
    for i in sorted(range(len(jobs)), key=lambda i: jobs[i].fifo):
        job = jobs[i]
        if not job.demand.is_running and len(job.sizes) > 1 and ledger.fits(i, 1):
            ledger.move(i, 1)
            admitted.append(i)
    return admitted
