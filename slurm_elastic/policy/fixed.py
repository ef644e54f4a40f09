"""A plan with the sizes given from outside: the listed jobs go to their target, every
other job keeps its size, and a frozen job is never moved.

Used where a test or a drill must drive the daemon's real cycle (guard rails, executor,
journal) to a chosen size without the policy's judgement, e.g. ``daemon.drill`` and the
daemon's live tests.  Like every policy it only decides; the guard rails still apply.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_elastic.types import AllocationProblem, Decision, Explanation, Plan, SolverStatus


def fixed_plan(problem: AllocationProblem, targets: Mapping[int, int], *, solver: str) -> Plan:
    decisions = tuple(
        Decision(
            d.job_id,
            d.current_nodes,
            d.current_nodes if d.frozen else targets.get(d.job_id, d.current_nodes),
            Explanation(0.0, 0.0, solver),
        )
        for d in problem.elastic
    )
    return Plan(decisions, solver, SolverStatus.OPTIMAL, 0.0)
