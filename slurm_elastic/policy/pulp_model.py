"""The same allocation MIP written with pulp (the user's named modelling layer).

Not on the decision path: ``scripts/bench_policies.py`` times building this model at
1,000 and 10,000 jobs, which is what ruled pulp out (figures in docs/benchmarks.md), and the
tests solve it on small instances to check that both formulations agree.  It holds the
full model (no Lagrangian fixing), so it is also an independent check of ``mip``.
"""

from __future__ import annotations

from slurm_elastic.errors import MissingExtra
from slurm_elastic.policy.compiled import Compiled

try:
    import pulp
except ModuleNotFoundError:
    raise MissingExtra("the pulp cross-check", "pulp", "test") from None


def build_pulp(compiled: Compiled) -> tuple[pulp.LpProblem, list[list[pulp.LpVariable]]]:
    """``x[j][k]`` binary: job ``j`` takes candidate ``k``; maximise value; rows as in ``mip``."""
    prob = pulp.LpProblem("slurm_elastic_allocation", pulp.LpMaximize)
    x = [
        [
            prob.add_variable(f"x_{j.job_id}_{k}", 0, 1, cat=pulp.LpBinary)
            for k in range(len(j.sizes))
        ]
        for j in compiled.jobs
    ]
    prob += pulp.lpSum(
        float(v) * var
        for j, xs in zip(compiled.jobs, x, strict=True)
        for v, var in zip(j.value, xs, strict=True)
    )
    for j, xs in zip(compiled.jobs, x, strict=True):
        prob += pulp.lpSum(xs) == 1, f"one_size_{j.job_id}"
    for n, group in enumerate(compiled.placements):  # one placement of a demand at most
        prob += pulp.lpSum(var for j in group for var in x[j][1:]) <= 1, f"one_place_{n}"
    terms: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in compiled.rows]
    for j, xs in zip(compiled.jobs, x, strict=True):
        for r, coefs in zip(j.rows, j.coef, strict=True):
            terms[int(r)].extend((var, float(c)) for var, c in zip(xs, coefs, strict=True) if c)
    for i, (row, t) in enumerate(zip(compiled.rows, terms, strict=True)):
        prob += pulp.LpAffineExpression(t) <= row.rhs, f"row_{i}"
    return prob, x


def solve_pulp(compiled: Compiled, time_limit_s: float = 10.0) -> list[int]:
    """Solve with HiGHS through pulp; candidate index per job."""
    prob, x = build_pulp(compiled)
    prob.solve(pulp.HiGHS(msg=False, timeLimit=time_limit_s))
    if pulp.LpStatus[prob.status] != "Optimal":
        raise RuntimeError(f"pulp/HiGHS status {pulp.LpStatus[prob.status]}")
    return [max(range(len(xs)), key=lambda k: xs[k].value() or 0.0) for xs in x]
