"""Row usage bookkeeping for the constructive policies (static, greedy) and the MIP's
admission floor."""

from __future__ import annotations

from slurm_elastic.policy.compiled import Compiled

_EPS = 1e-9


class Ledger:
    """Usage of every row under a choice that starts at every job's floor (index 0).

    Plain Python floats, not numpy arrays: a job is in one or two rows, where each numpy
    call (about 1 us) costs more than the arithmetic.  The numbers are read one at a time
    (``item``) rather than converted to lists per job: on 10,000 jobs those lists would
    set off the garbage collector, which walks the whole problem.  The sums are the same
    IEEE operations in the same order, so the results are identical.
    """

    def __init__(self, compiled: Compiled) -> None:
        self._jobs = compiled.jobs
        self._rhs: list[float] = compiled.rhs.tolist()
        self.usage: list[float] = compiled.floor_usage().tolist()
        self.choice: list[int] = [0] * len(compiled.jobs)
        # Per job placed in several partitions, the other placements of its demand: it
        # may not start while one of them has (``Compiled.placements``).
        self._others: dict[int, tuple[int, ...]] = {
            j: tuple(k for k in group if k != j) for group in compiled.placements for j in group
        }

    def violated(self, i: int, to: int) -> int | None:
        """First row (global index) that moving job ``i`` to candidate ``to`` would overfill."""
        job = self._jobs[i]
        coef, rows, now = job.coef.item, job.rows.item, self.choice[i]
        usage, rhs = self.usage, self._rhs
        for k in range(job.rows.size):
            delta = coef(k, to) - coef(k, now)
            if delta > 0:
                r = rows(k)
                if usage[r] + delta > rhs[r] + _EPS:
                    return r
        return None

    def fits(self, i: int, to: int) -> bool:
        if to > 0 and self.choice[i] == 0 and self._sibling_started(i):
            return False
        return self.violated(i, to) is None

    def _sibling_started(self, i: int) -> bool:
        choice = self.choice
        return any(choice[k] > 0 for k in self._others.get(i, ()))

    def move(self, i: int, to: int) -> None:
        job = self._jobs[i]
        coef, rows, now = job.coef.item, job.rows.item, self.choice[i]
        usage = self.usage
        for k in range(job.rows.size):
            usage[rows(k)] += coef(k, to) - coef(k, now)
        self.choice[i] = to


def admit_queue_minimums(compiled: Compiled, ledger: Ledger) -> list[int]:
    """Optimus' first step: in Slurm's queue order, every pending job whose minimum still
    fits is moved to it in ``ledger``; returns the jobs admitted.

    Greedy starts from it; the MIP's admission floor (``PolicyOptions.fair_floor``) makes
    the jobs it admits start.  Running and frozen jobs stay at their floor (only pending
    jobs are moved).
    """
    jobs = compiled.jobs
    admitted: list[int] = []
    for i in sorted(range(len(jobs)), key=lambda i: jobs[i].queue):
        job = jobs[i]
        if not job.demand.is_running and len(job.sizes) > 1 and ledger.fits(i, 1):
            ledger.move(i, 1)
            admitted.append(i)
    return admitted
