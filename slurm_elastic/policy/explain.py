"""Turn a choice of candidates into a ``Plan`` with one explanation per job.

``rule`` names the reason the job is not one size larger (stable short names):

* ``frozen``            guard rails pinned the job at its current size this cycle
* ``static``            the static baseline never resizes
* ``max``               at its largest allowed size
* ``payback``           larger sizes exist but none gains enough to pay back its cost
                        within the horizon (or progress is capped: the job finishes anyway)
* ``capacity``          the next size does not fit: a capacity row is full
* ``fifo-reservation``  the next size would take nodes an older pending job waits for
* ``marginal-gain``     it fits, but the policy gave the nodes to jobs that gain more
* ``no-change``         every policy failed; current sizes are kept
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_elastic.policy.compiled import Compiled, JobModel
from slurm_elastic.policy.ledger import Ledger
from slurm_elastic.types import Decision, Explanation, Plan, SolverStatus


def _detail(job: JobModel, target: int) -> str:
    cur = job.demand.current_nodes
    if cur == 0:
        return f"start at {target}" if target else "stay pending"
    if target == cur:
        return f"keep {cur}"
    return f"{'grow' if target > cur else 'shrink'} {cur}->{target}"


def _rule(compiled: Compiled, ledger: Ledger, i: int, solver: str) -> tuple[str, str]:
    job = compiled.jobs[i]
    k = ledger.choice[i]
    target = int(job.sizes[k])
    if job.demand.frozen:
        return "frozen", ""
    if solver == "static":
        return "static", ""
    if solver == "no-change":
        return "no-change", ""
    if k + 1 >= len(job.sizes):
        if target >= int(job.legal.max()):
            return "max", ""
        return "payback", "no larger size gains more than it costs within the horizon"
    row = ledger.violated(i, k + 1)
    if row is not None:
        r = compiled.rows[row]
        return r.kind, f"{int(job.sizes[k + 1])} nodes would overfill {r.name}"
    return "marginal-gain", f"{int(job.sizes[k + 1])} nodes fit but gain less elsewhere"


def build_plan(
    compiled: Compiled,
    choice: Sequence[int],
    *,
    solver: str,
    status: SolverStatus,
    gap: float = 0.0,
    solve_s: float = 0.0,
    note: str = "",
) -> Plan:
    ledger = Ledger(compiled)
    for i, k in enumerate(choice):
        ledger.move(i, int(k))
    horizon = compiled.problem.horizon_s
    decisions = []
    for i, job in enumerate(compiled.jobs):
        k = int(choice[i])
        target = int(job.sizes[k])
        d = job.demand
        resized = d.is_running and target != d.current_nodes
        cost = float(job.throughput[k]) * min(d.outlook.resize_cost_s, horizon) if resized else 0.0
        rule, why = _rule(compiled, ledger, i, solver)
        detail = "; ".join(x for x in (_detail(job, target), why) if x)
        decisions.append(
            Decision(
                job_id=d.job_id,
                current_nodes=d.current_nodes,
                target_nodes=target,
                explanation=Explanation(
                    predicted_gain=float(job.progress[k] - job.progress[job.keep]),
                    resize_cost=cost,
                    rule=rule,
                    detail=detail,
                ),
            )
        )
    return Plan(
        decisions=tuple(decisions),
        solver=solver,
        status=status,
        objective=compiled.objective([int(k) for k in choice]),
        gap=float(gap) if np.isfinite(gap) else 0.0,
        solve_s=solve_s,
        note=note,
    )


def no_change_choice(compiled: Compiled) -> list[int]:
    """Running jobs keep their size, pending jobs stay pending."""
    return [job.keep for job in compiled.jobs]
