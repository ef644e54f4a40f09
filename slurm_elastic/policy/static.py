"""``static``: the baseline.  Nothing is resized.

Running jobs keep their size.  Pending jobs are treated as the rigid jobs they would be
without this daemon: each asks for ``requested_nodes`` (snapped down to the allowed grid,
else its max) and nothing else.  In FIFO order a pending job starts when that whole size
fits the same capacity and FIFO-reservation rows every policy uses (computed for the
rigid requests, so an older static job is ahead of a younger pending rigid job with its
whole request, as in Slurm); otherwise it stays pending.
"""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.policy.compiled import Compiled, compile_problem
from slurm_elastic.policy.ledger import Ledger, admit_queue_minimums
from slurm_elastic.types import AllocationProblem


def rigidified(problem: AllocationProblem) -> AllocationProblem:
    """Running jobs frozen (loans kept), pending jobs allowed only their requested size."""
    demands = []
    for d in problem.elastic:
        if d.is_running or d.frozen:
            # Nothing is resized, a loan included: a frozen job that would yield its loan to
            # a reclaim under the other policies keeps it here (its floor is then its size).
            demands.append(replace(d, frozen=True, loan_yields=False))
            continue
        want = d.requested_nodes if d.requested_nodes is not None else d.max_nodes
        # A job of several partitions asks the same in each; Slurm starts it in the first
        # where that fits (the admission pass tries its placements in the job's order).
        options = tuple(
            replace(o, allowed_sizes=(_asked(o.allowed_sizes, want),)) for o in d.options
        )
        size = _asked(d.allowed_sizes, want)
        demands.append(replace(d, allowed_sizes=(size,), requested_nodes=size, options=options))
    return replace(problem, elastic=tuple(demands))


def _asked(allowed: tuple[int, ...], want: int) -> int:
    """The request snapped down to the allowed grid (its smallest size when below it)."""
    fitting = [s for s in allowed if s <= want]
    return fitting[-1] if fitting else allowed[0]


def solve_static(compiled: Compiled) -> list[int]:
    """Candidate indices (into ``compiled``'s jobs) of the static plan."""
    rigid = compile_problem(rigidified(compiled.problem), compiled.options)
    ledger = Ledger(rigid)
    admit_queue_minimums(rigid, ledger)  # a pending job's minimum is its whole request here
    choice = []
    for job, r, k in zip(compiled.jobs, rigid.jobs, ledger.choice, strict=True):
        idx = job.index(int(r.sizes[k]))
        if idx is None:  # the static size is protected from pruning in compile
            raise AssertionError(f"job {job.job_id}: static size missing from candidates")
        choice.append(idx)
    return choice
