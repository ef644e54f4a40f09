"""``mip``: the default policy, an exact integer program solved by HiGHS.

Variables
    ``x[j,k] in {0,1}``: job ``j`` gets its candidate size ``k`` (see ``compiled``: the
    candidates already encode min/max/step, no preemption, frozen jobs and payback).
Objective
    maximise ``sum_jk value[j,k] x[j,k]``: weighted progress over the horizon, capped at
    remaining work, net of resize costs (``compiled`` defines the value).
Constraints
    ``sum_k x[j,k] = 1`` for every job (one size each);
    ``sum_jk a[r,j,k] x[j,k] <= rhs[r]`` for every capacity row (Hall sets over partition
    classes: shared nodes are exact) and FIFO-reservation row (``capacity``);
    admission floor (``PolicyOptions.fair_floor``, on by default): pending jobs that the
    FIFO minimum pass (running jobs at their minimum, frozen ones at their size) can start
    must start (``x[j,0] = 0``).  This is Optimus' own first step.  Why it belongs in the
    model: (1) with concave speed-ups a job's first nodes are its most efficient ones, and
    a waiting job loses a second of JCT per second while a job held at its minimum loses
    only ``1 - f(min) / f(s)``; (2) Slurm starts pending jobs in FIFO order and grows go
    through companion jobs queued behind them, so a plan that grows running jobs while an
    older pending job that fits stays pending is not what Slurm will carry out.

The model is built straight into arrays (rows dense: they are few).  Before HiGHS sees
it, ``lagrange`` computes the LP bound from the Lagrangian dual and a near-optimal
incumbent.  When the bound already proves the incumbent within
``PolicyOptions.mip_rel_gap`` (HiGHS's own stopping rule) that is the answer; otherwise
every candidate that provably cannot beat the incumbent is removed (exact reduced-cost
fixing) and HiGHS (``highspy``, presolve off, warm-started with the incumbent) solves
what is left.

pulp was the named modelling layer.  Building its per-variable Python objects alone
takes about 1 s at 10,000 jobs, and pulp + HiGHS on the full model about 1 s at 1,000
jobs (``scripts/bench_policies.py`` measures both; figures in docs/benchmarks.md), against a
0.2 s budget, so ``pulp_model.py`` keeps the same model in pulp for cross-checks only.
Everything is deterministic for a given model, so the same problem gives the same plan
(unless the time limit cuts the search short).

Time limit: the solve runs in a forked child (``isolate``) that is killed at the budget;
inside it the bound gets at most half of the budget and HiGHS is asked to stop at 80%.
An incumbent at the time limit (the Lagrangian one, or HiGHS's if better) is used with
status ``feasible`` and its proven gap; with none (the child was killed) or on any
error, greedy's plan is used (status ``fallback``) and ``Plan.note`` says why.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np

from slurm_elastic.policy.compiled import Compiled, IntArray
from slurm_elastic.policy.lagrange import FlatModel, fix, solve_dual
from slurm_elastic.policy.ledger import Ledger, admit_queue_minimums


@dataclass(frozen=True, slots=True)
class MipInput:
    """The MIP's flat model after the admission floor, with each candidate's local index.

    A demand placed in several partitions is one job of the flat model (its placements'
    candidates side by side): choosing one candidate per job is then choosing one
    placement, and the admission floor makes the job start in whichever one.  ``variant``
    says which compiled job each candidate belongs to; None when every flat job is one.
    """

    model: FlatModel
    local: IntArray  # candidate index within its (compiled) job, per flat candidate
    variant: IntArray | None = None  # compiled job of each flat candidate
    n_variants: int = 0  # compiled jobs (with ``variant``)

    def choice(self, pick: IntArray) -> list[int]:
        """Candidate index per compiled job, from one flat candidate per flat job; the
        placements not chosen stay pending (their candidate 0)."""
        if self.variant is None:
            return self.local[pick].tolist()
        out = [0] * self.n_variants
        for job, index in zip(self.variant[pick].tolist(), self.local[pick].tolist(), strict=True):
            out[job] = index
        return out


@dataclass(frozen=True, slots=True)
class MipResult:
    """What a MIP solve found: a choice (or none), its proven gap and HiGHS's message."""

    choice: list[int] | None  # candidate index per job
    optimal: bool
    gap: float
    message: str
    free_jobs: int = 0  # jobs left to HiGHS after fixing
    bound: float = 0.0  # Lagrangian upper bound on the objective


def fair_floor_jobs(compiled: Compiled) -> set[int]:
    """Pending jobs the FIFO minimum pass starts with running jobs at their floor.

    The ledger starts every job at its floor (candidate 0): a running job's minimum, a
    frozen job's current size, a pending job's "stay pending"; the jobs it admits are
    therefore always feasible together.
    """
    return set(admit_queue_minimums(compiled, Ledger(compiled)))


def _merged_input(compiled: Compiled, job: IntArray, local: IntArray, floor: set[int]) -> MipInput:
    """``build_input`` where demands have placements: each demand is one flat job whose
    candidates are its placements', the admitted one first (the FIFO pass proved its
    minimum fits beside every other floor: index 0 stays a feasible floor for the
    incumbent's repair), with one "stay pending" (none when admitted)."""
    by_demand: dict[int, list[int]] = {}
    for j, demand in enumerate(compiled.owner):
        by_demand.setdefault(demand, []).append(j)
    start = compiled.start
    order: list[int] = []
    counts: list[int] = []
    for variants in by_demand.values():
        admitted = [v for v in variants if v in floor]
        ranked = admitted + [v for v in variants if v not in admitted]
        taken = 0
        for rank, v in enumerate(ranked):
            # The pending column: the first placement's only, none once admitted.
            skip = 1 if admitted or rank > 0 else 0
            cols = range(int(start[v]) + skip, int(start[v + 1]))
            order.extend(cols)
            taken += len(cols)
        counts.append(taken)
    at = np.array(order, dtype=np.int64)
    new_start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_start[1:])
    model = FlatModel.make(compiled.value[at], new_start, compiled.coef[:, at], compiled.rhs)
    return MipInput(model, local[at], job[at], len(compiled.jobs))


def build_input(compiled: Compiled) -> MipInput:
    """Flatten every job's candidates; the fairness floor removes "stay pending"."""
    n_jobs = len(compiled.jobs)
    start = compiled.start
    job = np.repeat(np.arange(n_jobs), np.diff(start))
    local = np.arange(start[-1]) - start[job]
    if compiled.placed:
        floored = fair_floor_jobs(compiled) if compiled.options.fair_floor else set()
        return _merged_input(compiled, job, local, floored)
    cols = np.ones(local.size, dtype=bool)
    if compiled.options.fair_floor:
        floor = np.array(sorted(fair_floor_jobs(compiled)), dtype=np.int64)
        cols[start[floor]] = False
    counts = np.bincount(job[cols], minlength=n_jobs)
    new_start = np.zeros(n_jobs + 1, dtype=np.int64)
    np.cumsum(counts, out=new_start[1:])
    model = FlatModel.make(compiled.value[cols], new_start, compiled.coef[:, cols], compiled.rhs)
    return MipInput(model, local[cols])


@functools.cache
def quiet_solver_banner() -> None:
    """Make the process's first ``Highs()`` with the C-level stdout pointed at /dev/null.

    HiGHS prints a two-line banner ("Running HiGHS ...") from the first ``Highs()`` of a
    process, before any option (``output_flag``) can be set, and never again.  On the
    daemon it landed between the JSON log lines of the journal (systemd merges stdout and
    stderr).  Called once: by the service at start-up, before its API threads exist (a line
    they wrote to stdout meanwhile would be lost), and before every solve (then a no-op).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _highs(
    model: FlatModel, free: IntArray, alive: IntArray, warm: IntArray, limit: float, gap: float
) -> tuple[highspy.Highs, IntArray]:
    """HiGHS on the free jobs' surviving candidates; fixed jobs' usage leaves the rows."""
    fixed = np.ones(model.n_jobs, dtype=bool)
    fixed[free] = False
    b = model.b - model.a[:, warm[fixed]].sum(axis=1)
    cols = alive[~fixed[model.job[alive]]]
    n = cols.size
    # Column-wise matrix, built straight from the dense rows: each column holds its job's
    # "one size" row (rows 0..free-1, in job order) then its capacity rows' nonzeros.
    _, eq_row = np.unique(model.job[cols], return_inverse=True)
    cap_col, cap_row = np.nonzero(model.a[:, cols].T)  # column-major: by column, then row
    per_col = 1 + np.bincount(cap_col, minlength=n)
    col_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_col, out=col_start[1:])
    index = np.empty(col_start[-1], dtype=np.int64)
    value = np.ones(col_start[-1])
    eq_at = col_start[:-1]
    index[eq_at] = eq_row
    rest = np.ones(col_start[-1], dtype=bool)
    rest[eq_at] = False
    index[rest] = free.size + cap_row
    value[rest] = model.a[cap_row, cols[cap_col]]
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, free.size + b.size
    lp.col_cost_ = -model.value[cols]
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.concatenate([np.ones(free.size), np.full(b.size, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(free.size), b])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = col_start
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    quiet_solver_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")  # measured: presolve costs more than it saves here
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    # The feasibility-jump primal heuristic costs 4-14 ms on every MIP, even a two-column
    # one (measured with highspy 1.15: 0.4 ms without it), and its job, a first feasible
    # point, is already done: the Lagrangian incumbent is passed in as the start.  On the
    # 364 remainders of a 1,000-job simulation it cut HiGHS time 3.4x, same solutions.
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    h.setOptionValue("time_limit", max(limit, 1e-3))
    h.setOptionValue("mip_rel_gap", gap)
    h.passModel(lp)
    start_sol = highspy.HighsSolution()
    start_sol.col_value = np.isin(cols, warm).astype(float).tolist()
    start_sol.value_valid = True
    h.setSolution(start_sol)
    h.run()
    return h, cols


def _ignore(_: MipResult) -> None:
    return None


def solve_input(
    data: MipInput,
    time_limit_s: float,
    rel_gap: float,
    report: Callable[[MipResult], None] = _ignore,
) -> MipResult:
    """Bound, incumbent, fixing, then HiGHS on the rest (plain data in and out).

    ``report`` receives the Lagrangian incumbent before HiGHS starts, so a kill at the
    deadline still leaves a plan with a proven gap.
    """
    t0 = time.perf_counter()
    model = data.model
    if model.n_jobs == 0:
        return MipResult([], True, 0.0, "empty")
    # Half the budget for the bound at most, the rest for HiGHS on what is left open.
    lam, warm, _ = solve_dual(model, rel_gap, deadline=t0 + 0.5 * time_limit_s)
    alive_mask, upper = fix(model, lam, warm)
    per_job = np.bincount(model.job[alive_mask], minlength=model.n_jobs)
    free = np.flatnonzero(per_job > 1)
    best = float(model.value[warm].sum())
    gap = max(0.0, upper - best) / max(abs(best), 1e-9)
    choice = data.choice(warm)
    if free.size == 0 or gap <= rel_gap:
        # Proven within the requested gap by the Lagrangian bound: HiGHS would stop here too.
        return MipResult(choice, True, gap, "proven by the Lagrangian bound", int(free.size), upper)
    report(MipResult(choice, False, gap, "Lagrangian incumbent", int(free.size), upper))
    limit = time_limit_s - (time.perf_counter() - t0)
    if limit < 0.3 * time_limit_s:  # not enough left for HiGHS: the incumbent, with its gap
        return MipResult(choice, False, gap, "time limit: Lagrangian incumbent", free.size, upper)
    h, cols = _highs(model, free, np.flatnonzero(alive_mask), warm, limit, rel_gap)
    status = h.getModelStatus()
    info = h.getInfo()
    pick = warm.copy()
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value)
        chosen = cols[x > 0.5]
        pick[model.job[chosen]] = chosen
    if float(model.value[pick].sum()) < best:
        pick = warm  # never return worse than the proven incumbent
    optimal = status == highspy.HighsModelStatus.kOptimal
    # HiGHS's bound covers the free jobs only; the fixed ones add their (fixed) value.
    fixed = np.ones(model.n_jobs, dtype=bool)
    fixed[free] = False
    highs_upper = float(model.value[warm[fixed]].sum()) - float(info.mip_dual_bound)
    final = float(model.value[pick].sum())
    upper = min(upper, highs_upper) if np.isfinite(highs_upper) else upper
    gap = max(0.0, upper - final) / max(abs(final), 1e-9)
    message = h.modelStatusToString(status)
    return MipResult(data.choice(pick), optimal, gap, message, int(free.size), upper)
