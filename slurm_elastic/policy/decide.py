"""``allocate(problem, policy, fallback=...)``: one entry point, the fallback chain, and timing.

The policy runs first (``registry``).  When it raises ``SolverError`` (``mip`` without an
incumbent at its time limit, or any error of HiGHS; ``dp`` on more than one row) its
fallback runs (``greedy`` by default, status ``fallback``); when the fallback fails too,
or there is none (``fallback="none"``), every job keeps its size (status ``no_change``).
The last solver of the chain must not fail the cycle, so any exception there means "no
change"; ``Plan.note`` says what failed and what was used.
``mip`` at its time limit with an incumbent uses that incumbent, status ``feasible``.
Bad input is not a solver failure: it raises ``SolverError`` with a one-line reason.
Log events: ``policy.decided`` (debug, every call), ``policy.fallback``, ``policy.no_change``.
"""

from __future__ import annotations

import time

import structlog

from slurm_elastic.errors import SolverError
from slurm_elastic.policy.compiled import Compiled, compile_problem
from slurm_elastic.policy.explain import build_plan, no_change_choice
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.policy.registry import DEFAULT_FALLBACK, POLICIES, Policy, chain
from slurm_elastic.types import AllocationProblem, Plan, SolverStatus

__all__ = ["POLICIES", "allocate"]

log = structlog.get_logger("slurm_elastic.policy")


def allocate(
    problem: AllocationProblem,
    policy: str = "mip",
    *,
    fallback: str = DEFAULT_FALLBACK,
    options: PolicyOptions | None = None,
) -> Plan:
    """Choose a size for every elastic job.  Pure: same problem, same plan.

    Raises:
        SolverError: an unknown policy or fallback name, or a problem that is not valid
            (a solver that fails is not an error: its fallback's plan is returned).
    """
    policies = chain(policy, fallback)
    opts = options or PolicyOptions()
    t0 = time.perf_counter()
    compiled = compile_problem(problem, opts)
    plan = _decide(compiled, policies, t0)
    log.debug(
        "policy.decided",
        policy=policy,
        solver=plan.solver,
        status=str(plan.status),
        jobs=len(plan.decisions),
        objective=plan.objective,
        solve_s=plan.solve_s,
        note=plan.note,
    )
    return plan


def _elapsed(t0: float) -> float:
    return time.perf_counter() - t0


def _decide(compiled: Compiled, policies: tuple[Policy, ...], t0: float) -> Plan:
    notes: list[str] = []
    for index, policy in enumerate(policies):
        last = index == len(policies) - 1
        try:
            solved = policy.solve(compiled, t0)
        except SolverError as exc:
            notes.append(f"{policy.name} {policy.failed} ({exc})")
            continue
        except Exception as exc:  # the last resort must not fail the cycle
            if not last:
                raise
            notes.append(f"{policy.name} failed ({type(exc).__name__}: {exc})")
            continue
        status, note = solved.status, solved.note
        if notes:  # a fallback's plan: say what failed before it
            status = SolverStatus.FALLBACK
            note = "; ".join([*notes, f"{policy.name} plan used", *filter(None, [note])])
            log.warning("policy.fallback", reason=note)
        return build_plan(
            compiled,
            solved.choice,
            solver=policy.name,
            status=status,
            gap=solved.gap,
            solve_s=_elapsed(t0),
            note=note,
        )
    note = "; ".join([*notes, "current sizes kept"])
    log.warning("policy.no_change", note=note)
    return build_plan(
        compiled,
        no_change_choice(compiled),
        solver="no-change",
        status=SolverStatus.NO_CHANGE,
        solve_s=_elapsed(t0),
        note=note,
    )
