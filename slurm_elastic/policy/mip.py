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
    optional fairness floor: pending jobs that the FIFO minimum pass (running jobs kept
    at their current size) can start must start (``x[j,0] = 0``).

The model is built straight into sparse arrays and handed to ``scipy.optimize.milp``
(HiGHS).  pulp was the named modelling layer; its per-variable Python objects cost far
more than the latency budget at 10,000 jobs (measured by ``scripts/bench_policies.py``,
figures in the README), so ``pulp_model.py`` keeps the same model in pulp for comparison
only.  HiGHS is deterministic for a given model, so the same problem gives the same plan
(unless the time limit cuts the search short).

Time limit: the solve runs in a forked child (``isolate``) that HiGHS is asked to end at
80% of the remaining budget and that is killed at the budget.  With an incumbent at the
time limit, the better of it and greedy is used (status ``feasible``); with none, or on
any error, greedy's plan is used (status ``fallback``) and ``Plan.note`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from slurm_elastic.policy.compiled import Compiled, FloatArray, IntArray
from slurm_elastic.policy.ledger import Ledger


@dataclass(frozen=True, slots=True)
class MipArrays:
    cost: FloatArray  # minimised: -value
    offsets: IntArray  # job j's variables are offsets[j]:offsets[j+1]
    a_eq: sp.csr_array
    a_ub: sp.csr_array
    b_ub: FloatArray
    upper: FloatArray  # variable upper bounds (0 removes a candidate: fairness floor)


@dataclass(frozen=True, slots=True)
class MipResult:
    choice: list[int] | None
    optimal: bool
    gap: float
    message: str


def fair_floor_jobs(compiled: Compiled) -> set[int]:
    """Pending jobs the FIFO minimum pass starts with running jobs at their current size."""
    ledger = Ledger(compiled)
    jobs = compiled.jobs
    for i, job in enumerate(jobs):
        ledger.move(i, job.keep)
    started: set[int] = set()
    for i in sorted(range(len(jobs)), key=lambda i: jobs[i].fifo):
        job = jobs[i]
        if not job.demand.is_running and len(job.sizes) > 1 and ledger.fits(i, 1):
            ledger.move(i, 1)
            started.add(i)
    return started


def build_arrays(compiled: Compiled) -> MipArrays:
    jobs = compiled.jobs
    counts = np.array([len(j.sizes) for j in jobs], dtype=np.int64)
    offsets = np.zeros(len(jobs) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    n = int(offsets[-1])
    cost = -np.concatenate([j.value for j in jobs]) if jobs else np.zeros(0)
    eq_rows = np.repeat(np.arange(len(jobs)), counts)
    a_eq = sp.csr_array((np.ones(n), (eq_rows, np.arange(n))), shape=(len(jobs), n))

    rows, cols, vals = [], [], []
    for j, off in zip(jobs, offsets[:-1], strict=False):
        if not j.rows.size:
            continue
        k = len(j.sizes)
        rows.append(np.repeat(j.rows, k))
        cols.append(np.tile(np.arange(off, off + k), j.rows.size))
        vals.append(j.coef.ravel())
    if rows:
        a_ub = sp.csr_array(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(len(compiled.rows), n),
        )
    else:
        a_ub = sp.csr_array((len(compiled.rows), n))
    upper = np.ones(n)
    if compiled.options.fair_floor:
        for i in fair_floor_jobs(compiled):
            upper[offsets[i]] = 0.0
    return MipArrays(cost, offsets, a_eq, a_ub, compiled.rhs, upper)


def solve_arrays(arrays: MipArrays, time_limit_s: float, rel_gap: float) -> MipResult:
    """Solve with HiGHS; safe to run in a child process (returns plain data)."""
    n = arrays.cost.size
    if n == 0:
        return MipResult([], True, 0.0, "empty")
    constraints = [LinearConstraint(arrays.a_eq, 1.0, 1.0)]
    if arrays.b_ub.size:
        constraints.append(LinearConstraint(arrays.a_ub, -np.inf, arrays.b_ub))
    res = milp(
        arrays.cost,
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), arrays.upper),
        constraints=constraints,
        options={"time_limit": max(time_limit_s, 1e-3), "mip_rel_gap": rel_gap, "disp": False},
    )
    if res.x is None:
        return MipResult(None, False, np.inf, f"HiGHS status {res.status}: {res.message}")
    x = res.x
    choice = [
        int(np.argmax(x[a:b])) for a, b in zip(arrays.offsets[:-1], arrays.offsets[1:], strict=True)
    ]
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    return MipResult(choice, res.status == 0, gap, str(res.message))
