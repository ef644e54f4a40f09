"""``allocate(problem, policy)``: one entry point, the fallback chain, and timing.

mip -> (time limit with an incumbent) that incumbent, status ``feasible``;
    -> (time limit without one, or any error) greedy, status ``fallback`` -> (error) no change.
dp -> (more than one row) greedy, status ``fallback``.
Bad input is not a solver failure: it raises ``SolverError`` with a one-line reason.
Log events: ``policy.decided`` (debug, every call), ``policy.fallback``, ``policy.no_change``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import structlog

from slurm_elastic.errors import SolverError
from slurm_elastic.policy.compiled import Compiled, compile_problem
from slurm_elastic.policy.dp import solve_dp
from slurm_elastic.policy.explain import build_plan, no_change_choice
from slurm_elastic.policy.greedy import solve_greedy
from slurm_elastic.policy.isolate import run_isolated
from slurm_elastic.policy.mip import MipResult, build_input, solve_input
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.policy.static import solve_static
from slurm_elastic.types import AllocationProblem, Plan, SolverStatus

POLICIES = ("mip", "greedy", "dp", "static")
_HIGHS_SHARE = 0.8  # of the remaining budget; the rest covers fork, decode and the kill
# ``time_limit_s`` bounds the whole decision, so the solver's budget leaves room for
# writing the plan and its explanations afterwards (measured about 20-30 us per job).
_PLAN_RESERVE_S_PER_JOB = 5e-5

log = structlog.get_logger("slurm_elastic.policy")


def allocate(
    problem: AllocationProblem, policy: str = "mip", *, options: PolicyOptions | None = None
) -> Plan:
    """Choose a size for every elastic job.  Pure: same problem, same plan."""
    if policy not in POLICIES:
        raise SolverError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    opts = options or PolicyOptions()
    t0 = time.perf_counter()
    compiled = compile_problem(problem, opts)
    plan = _decide(compiled, policy, t0)
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


def _decide(compiled: Compiled, policy: str, t0: float) -> Plan:
    if policy == "static":
        choice = solve_static(compiled)
        return build_plan(
            compiled, choice, solver="static", status=SolverStatus.FEASIBLE, solve_s=_elapsed(t0)
        )
    if policy == "greedy":
        return _greedy(compiled, t0, note="")
    if policy == "dp":
        try:
            choice = solve_dp(compiled)
        except SolverError as exc:
            return _greedy(compiled, t0, note=f"dp not applicable ({exc}); greedy plan used")
        return build_plan(
            compiled, choice, solver="dp", status=SolverStatus.OPTIMAL, solve_s=_elapsed(t0)
        )
    return _mip(compiled, t0)


def _greedy(compiled: Compiled, t0: float, *, note: str) -> Plan:
    status = SolverStatus.FALLBACK if note else SolverStatus.FEASIBLE
    try:
        choice = solve_greedy(compiled)
    except Exception as exc:  # the last resort must not fail the cycle
        log.warning("policy.no_change", error=f"{type(exc).__name__}: {exc}", note=note)
        why = f"greedy failed ({type(exc).__name__}: {exc}); current sizes kept"
        return build_plan(
            compiled,
            no_change_choice(compiled),
            solver="no-change",
            status=SolverStatus.NO_CHANGE,
            solve_s=_elapsed(t0),
            note="; ".join(x for x in (note, why) if x),
        )
    if note:
        log.warning("policy.fallback", reason=note)
    return build_plan(
        compiled, choice, solver="greedy", status=status, solve_s=_elapsed(t0), note=note
    )


def _solve_mip(compiled: Compiled, t0: float) -> MipResult:
    budget = compiled.problem.time_limit_s - _elapsed(t0)
    if budget <= 0:
        raise SolverError("no time left for the MIP after building the model")
    data = build_input(compiled)
    reserve = _PLAN_RESERVE_S_PER_JOB * len(compiled.jobs)
    budget = compiled.problem.time_limit_s - _elapsed(t0) - reserve
    args = (data, budget * _HIGHS_SHARE, compiled.options.mip_rel_gap)
    if compiled.options.isolate:
        result, complete = run_isolated(solve_input, args, budget)
        if not complete:  # killed at the deadline: the incumbent it reported before HiGHS
            result = replace(result, optimal=False, message="killed at the time limit")
    else:
        result = solve_input(*args)
    if result.choice is None:
        raise SolverError(f"HiGHS found no solution: {result.message}")
    if not compiled.feasible(result.choice):
        raise SolverError("HiGHS returned a plan that violates a capacity row")
    return result


def _mip(compiled: Compiled, t0: float) -> Plan:
    try:
        result = _solve_mip(compiled, t0)
    except SolverError as exc:
        return _greedy(compiled, t0, note=f"mip failed ({exc}); greedy plan used")
    assert result.choice is not None
    note = "" if result.optimal else f"mip stopped at its time limit with gap {result.gap:.3g}"
    return build_plan(
        compiled,
        result.choice,
        solver="mip",
        status=SolverStatus.OPTIMAL if result.optimal else SolverStatus.FEASIBLE,
        gap=result.gap,
        solve_s=_elapsed(t0),
        note=note,
    )
