"""Row usage bookkeeping for the constructive policies (static, greedy)."""

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
