"""``dp``: exact multiple-choice knapsack over one capacity row (Saxena et al.-style).

Every job picks exactly one candidate; the single row's usage of candidate ``k`` is
shifted by the job's floor (``a_k - a_0 >= 0``, integral: sizes or size differences), and

    best_j[c] = max_k best_{j-1}[c - a_k] + value_k      (best_0 = 0 for all c)

is the best objective with usage <= c.  Backtracking from the full capacity gives the
plan; ties keep the smallest candidate (argmax takes the first), so the result is
deterministic.  O(jobs x capacity x candidates) time, jobs x capacity bytes of choice
table.  Problems with more than one live row (partitions sharing nodes, FIFO
reservations) are refused with a SolverError; the MIP handles those.
"""

from __future__ import annotations

import numpy as np

from slurm_elastic.errors import SolverError
from slurm_elastic.policy.compiled import Compiled

MAX_TABLE_CELLS = 400_000_000


def solve_dp(compiled: Compiled) -> list[int]:
    jobs = compiled.jobs
    if len(compiled.rows) > 1:
        raise SolverError(
            f"dp solves a single capacity row; this problem has {len(compiled.rows)} "
            "(shared partitions or FIFO reservations)"
        )
    if not compiled.rows:  # nothing binds: every job takes its best candidate
        return [int(np.argmax(j.value)) for j in jobs]
    weights: list[np.ndarray] = []
    floor = 0.0
    for j in jobs:
        if j.rows.size:
            w = j.coef[0] - j.coef[0, 0]
            floor += float(j.coef[0, 0])
        else:
            w = np.zeros(len(j.sizes))
        if np.any(np.abs(w - np.round(w)) > 1e-9):
            raise SolverError(f"dp needs integral node counts (job {j.job_id})")
        weights.append(np.round(w).astype(np.int64))
    cap = int(np.floor(compiled.rows[0].rhs - floor + 1e-9))
    cap = max(0, min(cap, int(sum(int(w.max()) for w in weights))))
    if len(jobs) * (cap + 1) > MAX_TABLE_CELLS:
        raise SolverError(f"dp table too large: {len(jobs)} jobs x {cap + 1} capacity")

    best = np.zeros(cap + 1)
    table = np.zeros((len(jobs), cap + 1), dtype=np.int16)
    for n, (j, w) in enumerate(zip(jobs, weights, strict=True)):
        new = best + j.value[0]
        pick = table[n]
        for k in range(1, len(j.sizes)):
            wk = int(w[k])
            if wk > cap:
                break  # weights ascend with k
            cand = best[: cap + 1 - wk] + j.value[k]
            better = cand > new[wk:]
            new[wk:][better] = cand[better]
            pick[wk:][better] = k
        best = new
    choice = [0] * len(jobs)
    c = cap
    for n in range(len(jobs) - 1, -1, -1):
        k = int(table[n, c])
        choice[n] = k
        c -= int(weights[n][k])
    return choice
