"""The allocation policies by name: one registry for the daemon, the simulator and the scripts.

A policy is a name, a one-line summary and a ``solve`` function ``(compiled, t0) -> Solved``
that either returns a choice of candidates or raises ``SolverError`` when it cannot
(``dp`` on more than one capacity row, ``mip`` without an incumbent at its time limit).
``chain(name, fallback)`` is what ``allocate`` runs: the policy, then the one it falls back
to when it fails (``policy.fallback`` in the config, ``greedy`` by default, ``none`` for
"keep every job's size").  The fallback of the fallback is always "no change".

This module is imported by ``config`` to validate names, so it stays light: the solvers
(numpy, HiGHS) are imported when a policy first runs, not here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurm_elastic.errors import SolverError
from slurm_elastic.types import SolverStatus

if TYPE_CHECKING:
    from slurm_elastic.policy.compiled import Compiled

DEFAULT_POLICY = "mip"
DEFAULT_FALLBACK = "greedy"
NO_FALLBACK = "none"  # a failed policy keeps every job's size

_HIGHS_SHARE = 0.8  # of the remaining budget; the rest covers fork, decode and the kill
# ``time_limit_s`` bounds the whole decision, so the solver's budget leaves room for
# writing the plan and its explanations afterwards (measured about 20-30 us per job).
_PLAN_RESERVE_S_PER_JOB = 5e-5


@dataclass(frozen=True, slots=True)
class Solved:
    """What a policy chose: a candidate index per job, its status, proven gap and note."""

    choice: list[int]
    status: SolverStatus
    gap: float = 0.0
    note: str = ""


Solve = Callable[["Compiled", float], Solved]


@dataclass(frozen=True, slots=True)
class Policy:
    """One registered policy; ``failed`` is how its ``SolverError`` reads in a plan note."""

    name: str
    summary: str
    solve: Solve
    failed: str = "failed"


def _static(compiled: Compiled, t0: float) -> Solved:
    from slurm_elastic.policy.static import solve_static

    return Solved(solve_static(compiled), SolverStatus.FEASIBLE)


def _greedy(compiled: Compiled, t0: float) -> Solved:
    from slurm_elastic.policy.greedy import solve_greedy

    return Solved(solve_greedy(compiled), SolverStatus.FEASIBLE)


def _dp(compiled: Compiled, t0: float) -> Solved:
    from slurm_elastic.policy.dp import solve_dp

    return Solved(solve_dp(compiled), SolverStatus.OPTIMAL)


def _mip(compiled: Compiled, t0: float) -> Solved:
    from slurm_elastic.policy.isolate import run_isolated
    from slurm_elastic.policy.mip import build_input, solve_input

    budget = compiled.problem.time_limit_s - (time.perf_counter() - t0)
    if budget <= 0:
        raise SolverError("no time left for the MIP after building the model")
    data = build_input(compiled)
    reserve = _PLAN_RESERVE_S_PER_JOB * len(compiled.jobs)
    budget = compiled.problem.time_limit_s - (time.perf_counter() - t0) - reserve
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
    if result.optimal:
        return Solved(result.choice, SolverStatus.OPTIMAL, result.gap)
    note = f"mip stopped at its time limit with gap {result.gap:.3g}"
    return Solved(result.choice, SolverStatus.FEASIBLE, result.gap, note)


# In the order tables and the simulator show them: the baseline first, the default last.
_POLICIES = (
    Policy("static", "no resizing: every job at its requested size (the baseline)", _static),
    Policy("greedy", "Optimus' marginal gain, one node step at a time", _greedy),
    Policy("dp", "exact knapsack for one capacity row", _dp, failed="not applicable"),
    Policy("mip", "exact integer program (HiGHS) under a hard time limit", _mip),
)
REGISTRY: dict[str, Policy] = {p.name: p for p in _POLICIES}
POLICIES: tuple[str, ...] = tuple(REGISTRY)
FALLBACKS: tuple[str, ...] = (*POLICIES, NO_FALLBACK)


def unknown_policy(name: str) -> str:
    """The one-line reason a policy name is refused (config, CLI, ``allocate``)."""
    return f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}"


def get(name: str) -> Policy:
    """The policy called ``name``; ``SolverError`` (one line) when there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise SolverError(unknown_policy(name)) from None


def chain(name: str, fallback: str = DEFAULT_FALLBACK) -> tuple[Policy, ...]:
    """``name``'s policy, then its fallback (none when ``none`` or the same policy).

    Raises:
        SolverError: ``name`` or ``fallback`` is not a registered policy (or ``none``).
    """
    first = get(name)
    if fallback in (NO_FALLBACK, name):
        return (first,)
    if fallback not in REGISTRY:
        raise SolverError(
            f"unknown fallback policy {fallback!r}; choose one of {', '.join(FALLBACKS)}"
        )
    return (first, REGISTRY[fallback])
