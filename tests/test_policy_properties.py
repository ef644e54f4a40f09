"""Property tests on random small instances: every policy is safe; mip and dp are optimal."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from slurm_elastic.policy import POLICIES, PolicyOptions, allocate
from slurm_elastic.policy.compiled import compile_problem
from slurm_elastic.policy.pulp_model import solve_pulp
from slurm_elastic.types import (
    AllocationProblem,
    ElasticDemand,
    NodePool,
    Outlook,
    RigidDemand,
    SizeEstimate,
    SolverStatus,
)
from tests.test_policy_support import (
    brute_force,
    fifo_admitted,
    fits,
    instances,
    reservations_hold,
    same_plan,
    targets,
)

# No child process per example: isolation has its own tests, and forking hundreds of
# times would dominate the run time on this shared machine.  INLINE has the defaults
# (admission floor on); OPEN drops the floor, so that mip, dp and brute force solve the
# same unconstrained problem.
INLINE = PolicyOptions(isolate=False)
OPEN = PolicyOptions(isolate=False, fair_floor=False)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_safe(p: AllocationProblem, policy: str) -> None:
    plan = allocate(p, policy, options=INLINE)
    got = targets(plan)
    assert set(got) == {d.job_id for d in p.elastic}  # rigid jobs are never in a plan
    assert fits(p, got), f"{policy} overfills: {got}"
    for d in p.elastic:
        t = got[d.job_id]
        if d.frozen:  # kept, or only its loan given back to a reclaim (to the grid size at
            # or just below its entitlement when that is off the grid)
            floor = d.reclaim_grid_floor
            assert t == d.current_nodes or (d.loan_yields and floor <= t < d.current_nodes)
        elif d.is_running:
            assert t >= 1
            assert t == d.current_nodes or t in d.allowed_sizes
            assert t == d.current_nodes or t >= d.min_nodes
        else:
            assert t == 0 or t in d.allowed_sizes
    if policy == "static":
        for d in p.elastic:
            if d.is_running:
                assert got[d.job_id] == d.current_nodes


@pytest.mark.parametrize("policy", POLICIES)
@FAST
@given(p=instances())
def test_every_policy_is_safe(policy: str, p: AllocationProblem) -> None:
    _check_safe(p, policy)


@FAST
@given(p=instances(pending_rigid=False))
def test_mip_equals_brute_force_with_shared_nodes(p: AllocationProblem) -> None:
    plan = allocate(p, "mip", options=OPEN)
    assert plan.solver == "mip" and plan.status is SolverStatus.OPTIMAL
    best = brute_force(p, OPEN)
    assert math.isclose(plan.objective, best, rel_tol=2e-3, abs_tol=1e-6), (plan.objective, best)


@FAST
@given(p=instances(one_pool=True, pending_rigid=False, max_jobs=5))
def test_mip_dp_and_brute_force_agree_on_one_pool(p: AllocationProblem) -> None:
    best = brute_force(p, OPEN)
    dp = allocate(p, "dp", options=OPEN)
    assert dp.solver == "dp" and dp.status is SolverStatus.OPTIMAL
    assert math.isclose(dp.objective, best, rel_tol=1e-9, abs_tol=1e-6)
    mip = allocate(p, "mip", options=OPEN)
    assert math.isclose(mip.objective, best, rel_tol=2e-3, abs_tol=1e-6)


@FAST
@given(p=instances(pending_rigid=False, pending_frozen=False))
def test_mip_with_the_floor_is_optimal_among_plans_that_admit_it(p: AllocationProblem) -> None:
    """Default options: every FIFO-admitted pending job starts, and nothing better exists
    where no job holds nodes on loan.  With loans, the plan is at least the best one that
    takes back only loans (no borrower below ``reclaim_grid_floor``) and at most the best of
    all: a reclaim makes borrowers give back their loans although another job's shrink
    might have been cheaper (``test_mip_is_the_best_plan_the_rules_allow`` checks the
    rules themselves)."""
    admitted = fifo_admitted(p)
    plan = allocate(p, "mip", options=INLINE)
    assert plan.solver == "mip" and plan.status is SolverStatus.OPTIMAL
    got = targets(plan)
    assert all(got[j] > 0 for j in admitted)
    best = brute_force(p, INLINE, must_start=admitted)
    floor = brute_force(p, INLINE, must_start=admitted, loans_only=True)
    tol = 2e-3 * max(1.0, abs(best))
    assert floor - tol <= plan.objective <= best + tol, (floor, plan.objective, best)
    if not any(d.loan for d in p.elastic):
        assert math.isclose(plan.objective, best, rel_tol=2e-3, abs_tol=1e-6), (plan, best)


@FAST
@given(p=instances(one_pool=True, pending_frozen=False))
def test_mip_is_the_best_plan_the_rules_allow(p: AllocationProblem) -> None:
    """One partition, pending rigid jobs too: the plan keeps the reservation and reclaim
    rules, written out naively (``reservations_hold``), and no plan that keeps them and
    starts the same pending jobs or more is better (the rules are not stricter than they
    say: a shrink below the entitlement that funds a larger start is seen)."""
    plan = allocate(p, "mip", options=INLINE)
    assert plan.solver == "mip" and plan.status is SolverStatus.OPTIMAL
    got = targets(plan)
    assert reservations_hold(p, got)
    started = frozenset(d.job_id for d in p.elastic if not d.is_running and got[d.job_id] > 0)
    best = brute_force(p, INLINE, must_start=started, holds=reservations_hold)
    assert math.isclose(plan.objective, best, rel_tol=2e-3, abs_tol=1e-6), (got, best)


@FAST
@given(p=instances())
def test_mip_is_optimal_for_its_rows_and_beats_greedy(p: AllocationProblem) -> None:
    """With FIFO reservations too: the MIP is never worse than greedy or dp on its rows
    (greedy admits exactly the floor's jobs, so it is a plan the floored MIP may choose;
    dp knows no floor, so it is compared with the MIP without one)."""
    for options, others in ((INLINE, ("greedy",)), (OPEN, ("greedy", "dp"))):
        mip = allocate(p, "mip", options=options)
        compiled = compile_problem(p, options)
        for other in others:
            plan = allocate(p, other, options=options)
            assert mip.objective >= plan.objective - 2e-3 * abs(plan.objective) - 1e-6
        choice = [j.index(targets(mip)[j.job_id]) for j in compiled.jobs]
        assert compiled.feasible(choice)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(p=instances())
def test_same_input_same_plan(policy: str, p: AllocationProblem) -> None:
    assert same_plan(allocate(p, policy, options=INLINE), allocate(p, policy, options=INLINE))


@settings(max_examples=20, deadline=None)
@given(p=instances())
def test_pulp_formulation_agrees_with_mip(p: AllocationProblem) -> None:
    compiled = compile_problem(p, INLINE)
    choice = solve_pulp(compiled)
    assert compiled.feasible(choice)
    mip = allocate(p, "mip", options=OPEN)
    assert math.isclose(compiled.objective(choice), mip.objective, rel_tol=2e-3, abs_tol=1e-6)


@pytest.mark.parametrize("policy", ["mip", "greedy", "dp"])
@FAST
@given(p=instances(one_pool=True, max_jobs=5))
def test_elastic_jobs_never_jump_a_pending_rigid_job(policy: str, p: AllocationProblem) -> None:
    assert reservations_hold(p, targets(allocate(p, policy, options=INLINE)))


@FAST
@given(p=instances(one_pool=True, max_jobs=5))
def test_dp_and_mip_agree_whenever_one_row_binds(p: AllocationProblem) -> None:
    """Also when the one row is a FIFO reservation (size differences as weights)."""
    dp = allocate(p, "dp", options=OPEN)
    if dp.solver == "dp":
        mip = allocate(p, "mip", options=OPEN)
        assert math.isclose(dp.objective, mip.objective, rel_tol=2e-3, abs_tol=1e-6)


@pytest.mark.parametrize("policy", ["mip", "greedy"])
@FAST
@given(p=instances())
def test_every_decision_shows_the_sizes_it_weighed(policy: str, p: AllocationProblem) -> None:
    """Issue 23, item 5: the explanation carries every candidate size with its rate, gain and
    cost, and the chosen one's figures are the decision's own (``explain`` and ``plan``
    read the same numbers)."""
    plan = allocate(p, policy, options=INLINE)
    demands = {d.job_id: d for d in p.elastic}
    assert plan.weighed is not None
    for i, decision in enumerate(plan.decisions):
        why, d = decision.explanation, demands[decision.job_id]
        candidates = plan.weighed.of(i)
        sizes = [c.nodes for c in candidates]
        assert sizes == sorted(sizes) and decision.target_nodes in sizes
        chosen = next(c for c in candidates if c.nodes == decision.target_nodes)
        assert math.isclose(chosen.predicted_gain, why.predicted_gain, abs_tol=1e-9)
        assert math.isclose(chosen.resize_cost, why.resize_cost, abs_tol=1e-9)
        for c in candidates:
            if c.nodes == d.current_nodes or not d.is_running:
                assert c.resize_cost == 0.0  # keeping a size, or starting, costs no restart
            if c.nodes == d.current_nodes:
                assert c.predicted_gain == 0.0
            estimate = d.outlook.at(c.nodes)
            if c.nodes > 0 and estimate is not None:  # (a current size off the grid has none)
                assert c.steps_per_s == estimate.throughput


# Cases hypothesis found (2026-11-27), kept as plain tests so every run checks them.


def _flat_demand(job_id: int, current: int, sizes: tuple[int, ...], **kw: object) -> ElasticDemand:
    outlook = Outlook(
        job_id, current, tuple(SizeEstimate(n, 0.5 * n, 100.0 / n) for n in sizes), 50.0, 0.0
    )
    return ElasticDemand(
        job_id=job_id,
        partition="a",
        current_nodes=current,
        allowed_sizes=sizes,
        outlook=outlook,
        weight=0.5,
        **kw,  # type: ignore[arg-type]
    )


def test_static_keeps_a_loan_that_a_reclaim_could_take() -> None:
    """Nothing is resized under static, a frozen job's loan included (it used to give it
    back, or fail to find its size among its candidates)."""
    p = AllocationProblem(
        now=0.0,
        elastic=(
            _flat_demand(100, 0, (1,), frozen=True),
            _flat_demand(101, 0, (1,)),
            _flat_demand(102, 2, (1,), frozen=True, entitled_nodes=1, loan_yields=True),
        ),
        rigid=(),
        pools=(NodePool(frozenset({"a"}), 3),),
        horizon_s=600.0,
        time_limit_s=1.0,
    )
    assert targets(allocate(p, "static", options=INLINE))[102] == 2


@pytest.mark.parametrize("policy", ["mip", "greedy", "dp"])
def test_a_rigid_job_behind_one_that_fits_exactly_still_reclaims_a_loan(policy: str) -> None:
    """Job 900 fits the one free node exactly; job 901 behind it needs one of the two
    nodes job 100 holds on loan: the reservation rows used to stop at 900."""
    p = AllocationProblem(
        now=0.0,
        elastic=(_flat_demand(100, 3, (1, 3), entitled_nodes=1),),
        rigid=(RigidDemand(900, "a", 1, running=False), RigidDemand(901, "a", 1, running=False)),
        pools=(NodePool(frozenset({"a"}), 4),),
        horizon_s=600.0,
        time_limit_s=1.0,
    )
    got = targets(allocate(p, policy, options=INLINE))
    assert got[100] == 1 and reservations_hold(p, got)


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_the_node_a_reclaim_frees_below_an_off_grid_entitlement_is_used(policy: str) -> None:
    """Job 101 is entitled to 2 of its 3 nodes but may only shrink to 1: the reclaim that
    starts job 100 frees two nodes, and job 100 may take both (the reclaim row counted the
    shrink down to the entitlement only, so job 100 started at 2 and one node idled)."""
    p = AllocationProblem(
        now=0.0,
        elastic=(
            _flat_demand(100, 0, (2, 3)),
            _flat_demand(101, 3, (1,), entitled_nodes=2),
        ),
        rigid=(),
        pools=(NodePool(frozenset({"a"}), 4),),
        horizon_s=600.0,
        time_limit_s=1.0,
    )
    got = targets(allocate(p, policy, options=INLINE))
    assert got == {100: 3, 101: 1} and reservations_hold(p, got)
