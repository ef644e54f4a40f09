"""Hand-built situations with a known right answer, checked for every policy."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np
import pytest

import slurm_elastic.policy.greedy as greedy_mod
import slurm_elastic.policy.mip as mip_mod
from slurm_elastic.errors import SolverError, SolverTimeout
from slurm_elastic.policy import POLICIES, PolicyOptions, allocate
from slurm_elastic.policy.compiled import compile_problem
from slurm_elastic.policy.isolate import run_isolated
from slurm_elastic.policy.pulp_model import solve_pulp
from slurm_elastic.types import NodePool, RigidDemand, SolverStatus
from tests.test_policy_support import elastic, pools, problem, same_plan, targets

RULES = {
    "frozen",
    "static",
    "max",
    "payback",
    "capacity",
    "fifo-reservation",
    "marginal-gain",
    "no-change",
}


@pytest.mark.parametrize("policy", POLICIES)
def test_pending_rigid_ahead_in_fifo_keeps_its_nodes(policy: str) -> None:
    p = problem(
        [elastic(1, cur=0, sizes=(1, 2), submit=2.0)],
        pools(batch=4),
        (
            RigidDemand(90, "batch", 2, running=True),
            RigidDemand(91, "batch", 2, running=False, submit_time=1.0),
        ),
    )
    plan = allocate(p, policy)
    assert targets(plan) == {1: 0}
    if policy != "static":
        assert plan.decisions[0].explanation.rule == "fifo-reservation"


@pytest.mark.parametrize("policy", POLICIES)
def test_running_job_does_not_grow_into_reserved_nodes(policy: str) -> None:
    p = problem(
        [elastic(1, cur=2, sizes=(1, 2, 3, 4), submit=0.0)],
        pools(batch=4),
        (RigidDemand(91, "batch", 2, running=False, submit_time=5.0),),
    )
    assert targets(allocate(p, policy))[1] <= 2


def test_older_pending_elastic_starts_ahead_of_younger_rigid_at_its_minimum() -> None:
    p = problem(
        [elastic(1, cur=0, sizes=(2, 3, 4), submit=0.0)],
        pools(batch=4),
        (RigidDemand(91, "batch", 2, running=False, submit_time=1.0),),
    )
    for policy in ("mip", "greedy"):
        assert targets(allocate(p, policy)) == {1: 2}
    # static is what Slurm does with the rigid request: the older job takes all it asked
    assert targets(allocate(p, "static")) == {1: 4}


@pytest.mark.parametrize("policy", ["mip", "greedy", "dp"])
def test_growth_that_cannot_pay_back_its_cost_is_not_made(policy: str) -> None:
    p = problem([elastic(1, cur=2, sizes=(2, 4), cost=3500.0)], pools(batch=8))
    plan = allocate(p, policy)
    assert targets(plan) == {1: 2}
    assert plan.decisions[0].explanation.rule == "payback"


@pytest.mark.parametrize("policy", ["mip", "dp"])
def test_free_nodes_go_to_the_long_job_not_the_nearly_done_one(policy: str) -> None:
    nearly_done = elastic(1, cur=2, sizes=(2, 3, 4), work=60.0, alpha=0.9)
    long_job = elastic(2, cur=2, sizes=(2, 3, 4), work=1e6, alpha=0.9)
    plan = allocate(problem([nearly_done, long_job], pools(batch=6)), policy)
    assert targets(plan) == {1: 2, 2: 4}


def test_a_candidate_is_worth_the_seconds_of_completion_time_it_saves() -> None:
    # f(n) = n, horizon 1000 s.  C(s) = W/f(s) inside the horizon, else
    # H + (W - f(s) H_eff) / f_max; value = C(0) - C(s) with C(0) = H + W / f_max.
    long_pending = elastic(1, cur=0, sizes=(1, 2), alpha=1.0, work=1e4)
    short_pending = elastic(2, cur=0, sizes=(1, 2), alpha=1.0, work=1e3)
    running = elastic(3, cur=1, sizes=(1, 2), alpha=1.0, work=1e4, cost=100.0)
    p = problem([long_pending, short_pending, running], pools(batch=8), horizon_s=1000.0)
    got = {
        j.job_id: dict(zip(j.legal.tolist(), j.legal_value.tolist(), strict=True))
        for j in compile_problem(p, PolicyOptions()).jobs
    }
    want = {
        1: {0: 0.0, 1: 500.0, 2: 1000.0},  # beyond the horizon: f(s) H / f_max
        2: {0: 0.0, 1: 500.0, 2: 1000.0},  # inside: H + W/f_max - W/f(s)
        3: {1: 500.0, 2: 900.0},  # a resize loses its cost: f(2) (H - c) / f_max
    }
    for job_id, values in want.items():
        assert got[job_id].keys() == values.keys()
        for size, v in values.items():
            assert got[job_id][size] == pytest.approx(v, abs=0.01), (job_id, size)


def test_equally_valuable_pending_jobs_start_in_fifo_order() -> None:
    # Starting either job saves it the horizon's wait, whatever its length; the older
    # one starts (also without the admission floor), as Slurm would start it.
    old_long = elastic(1, cur=0, sizes=(2,), work=1e7, submit=0.0)
    young_short = elastic(2, cur=0, sizes=(2,), work=500.0, submit=1.0)
    p = problem([old_long, young_short], pools(batch=2))
    assert targets(allocate(p, "mip")) == {1: 2, 2: 0}
    open_plan = allocate(p, "mip", options=PolicyOptions(fair_floor=False))
    assert targets(open_plan) == {1: 2, 2: 0}
    assert targets(allocate(p, "greedy")) == {1: 2, 2: 0}  # Optimus: FIFO minimums first


def test_admission_floor_starts_pending_jobs_before_anyone_grows() -> None:
    # At one node of eight the pending job would run at 1/8 of its best speed: over the
    # horizon, growing the running job saves more seconds.  The floor (default) starts the
    # pending job at its minimum anyway, as Optimus does and as Slurm's FIFO queue would.
    running = elastic(1, cur=2, sizes=(2, 3), work=5e4, alpha=1.0, submit=0.0)
    pending = elastic(2, cur=0, sizes=(1, 8), work=1e9, alpha=1.0, submit=1.0)
    p = problem([running, pending], pools(batch=3))
    assert targets(allocate(p, "mip", options=PolicyOptions(fair_floor=False))) == {1: 3, 2: 0}
    assert targets(allocate(p, "mip")) == {1: 2, 2: 1}
    # Running jobs go down to their minimum to admit a pending job, frozen ones do not.
    wide = elastic(1, cur=3, sizes=(2, 3), work=5e4, alpha=1.0, submit=0.0)
    p = problem([wide, pending], pools(batch=3))
    assert targets(allocate(p, "mip")) == {1: 2, 2: 1}
    p = problem([replace(wide, frozen=True), pending], pools(batch=3))
    assert targets(allocate(p, "mip")) == {1: 3, 2: 0}


@pytest.mark.parametrize("policy", POLICIES)
def test_frozen_and_rigid_jobs_are_left_alone(policy: str) -> None:
    p = problem(
        [
            elastic(1, cur=3, sizes=(1, 2, 3, 4), frozen=True),
            elastic(2, cur=0, sizes=(1, 2, 3, 4)),
        ],
        pools(batch=8),
        (RigidDemand(90, "batch", 2, running=True),),
    )
    plan = allocate(p, policy)
    assert targets(plan)[1] == 3
    assert 90 not in targets(plan)
    assert plan.decisions[0].explanation.rule == "frozen"


def test_shared_nodes_are_not_counted_twice() -> None:
    # a: 2 own nodes, b: 2 own nodes, 2 shared: 6 in all, not 8.
    jobs = [elastic(1, "a", 0, (1, 2, 3, 4)), elastic(2, "b", 0, (1, 2, 3, 4))]
    for policy in POLICIES:
        got = targets(allocate(problem(jobs, pools(a=2, b=2, a_b=2)), policy))
        assert got[1] + got[2] <= 6, policy
        assert got[1] <= 4 and got[2] <= 4


def test_explanations_use_stable_rules_and_report_gain_and_cost() -> None:
    jobs = [
        elastic(1, cur=1, sizes=(1, 2, 3, 4), cost=60.0),
        elastic(2, cur=0, sizes=(1, 2)),
        elastic(3, cur=2, sizes=(2,), frozen=True),
    ]
    for policy in POLICIES:
        plan = allocate(problem(jobs, pools(batch=5)), policy)
        assert {d.explanation.rule for d in plan.decisions} <= RULES
    plan = allocate(problem(jobs, pools(batch=8)), "mip")
    grown = next(d for d in plan.decisions if d.job_id == 1)
    assert grown.target_nodes > 1
    assert grown.explanation.resize_cost > 0 and grown.explanation.predicted_gain > 0
    assert grown.explanation.detail.startswith("grow 1->")


def test_dp_on_several_rows_falls_back_to_greedy_and_says_so() -> None:
    jobs = [elastic(1, "a", 0, (1, 2, 3)), elastic(2, "b", 0, (1, 2, 3))]
    plan = allocate(problem(jobs, pools(a=1, a_b=1, b=1)), "dp")
    assert plan.solver == "greedy" and plan.status is SolverStatus.FALLBACK
    assert "dp" in plan.note


@pytest.mark.parametrize(
    "change",
    [
        lambda: [elastic(1), elastic(1)],
        lambda: [elastic(1, sizes=())],
        lambda: [elastic(1, sizes=(3, 2))],
        lambda: [elastic(1, sizes=(1, 1))],
        lambda: [elastic(1, weight=-1.0)],
    ],
)
def test_bad_input_is_a_one_line_solver_error(change) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SolverError) as err:
        allocate(problem(change(), pools(batch=4)))
    assert "\n" not in str(err.value)


def test_bad_policy_pool_or_partition_graph_is_refused() -> None:
    with pytest.raises(SolverError, match="unknown policy"):
        allocate(problem([elastic(1)], pools(batch=4)), "fastest")
    with pytest.raises(SolverError, match="negative"):
        allocate(problem([elastic(1)], (NodePool(frozenset({"batch"}), -1),)))
    names = [f"p{i}" for i in range(14)]
    chain = tuple(NodePool(frozenset({a, b}), 1) for a, b in itertools.pairwise(names))
    jobs = [elastic(i, name) for i, name in enumerate(names)]
    with pytest.raises(SolverError, match="share nodes"):
        allocate(problem(jobs, chain))


def _large(n_jobs: int, nodes: int, seed: int = 7):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n_jobs):
        lo = int(rng.integers(1, 3))
        sizes = tuple(range(lo, lo + int(rng.integers(1, 8))))
        running = i < nodes // 4
        jobs.append(
            elastic(
                i,
                cur=lo if running else 0,
                sizes=sizes,
                submit=float(i),
                alpha=float(rng.uniform(0.3, 1.0)),
                work=float(rng.lognormal(9, 2)),
                cost=float(rng.uniform(10, 300)),
            )
        )
    return problem(jobs, pools(batch=nodes))


def test_mip_matches_dp_on_a_medium_instance() -> None:
    p = _large(400, 160)
    open_ = PolicyOptions(fair_floor=False)  # dp knows no admission floor
    mip, dp = allocate(p, "mip", options=open_), allocate(p, "dp", options=open_)
    assert mip.solver == "mip" and mip.status is SolverStatus.OPTIMAL
    assert mip.objective >= dp.objective * (1 - 1e-3)
    assert mip.objective >= allocate(p, "greedy").objective
    assert same_plan(mip, allocate(p, "mip", options=open_))
    floored = allocate(p, "mip")  # greedy admits the floor's jobs too: never worse
    assert floored.status is SolverStatus.OPTIMAL
    assert floored.objective >= allocate(p, "greedy").objective * (1 - 1e-3)


def test_no_time_left_falls_back_to_greedy() -> None:
    p = _large(3000, 600)
    plan = allocate(replace(p, time_limit_s=1e-4))
    assert plan.solver == "greedy" and plan.status is SolverStatus.FALLBACK
    assert plan.note.startswith("mip failed")


def _hang(*_args: object) -> None:
    time.sleep(60)


def test_a_solver_that_ignores_its_time_limit_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    t = time.perf_counter()
    with pytest.raises(SolverTimeout):
        run_isolated(_hang, (), 0.3)
    assert time.perf_counter() - t < 2.0
    monkeypatch.setattr(mip_mod, "solve_input", _hang)
    p = _large(50, 20)
    p = replace(p, time_limit_s=0.5)
    t = time.perf_counter()
    plan = allocate(p, "mip")
    assert time.perf_counter() - t < 2.5
    assert plan.solver == "greedy" and plan.status is SolverStatus.FALLBACK
    assert "killed" in plan.note


def test_solver_errors_in_the_child_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object) -> None:
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(mip_mod, "solve_input", boom)
    plan = allocate(_large(30, 10), "mip")
    assert plan.status is SolverStatus.FALLBACK and "solver exploded" in plan.note


def test_greedy_failing_too_keeps_current_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object) -> None:
        raise RuntimeError("no luck")

    monkeypatch.setattr(mip_mod, "solve_input", boom)
    monkeypatch.setattr(greedy_mod, "solve_greedy", boom)
    p = _large(30, 10)
    plan = allocate(p, "mip")
    assert plan.status is SolverStatus.NO_CHANGE
    assert targets(plan) == {d.job_id: d.current_nodes for d in p.elastic}
    assert {d.explanation.rule for d in plan.decisions} <= {"no-change", "frozen"}


def test_mip_matches_the_full_pulp_model_with_shared_nodes_and_reservations() -> None:
    base = _large(300, 120, seed=11)
    jobs = [replace(d, partition="b" if d.job_id % 3 == 0 else "a") for d in base.elastic]
    rigid = tuple(
        RigidDemand(5000 + k, "ab"[k % 2], 1 + k % 4, running=False, submit_time=37.0 * k)
        for k in range(8)
    )
    p = problem(jobs, pools(a=50, a_b=50, b=30), rigid)
    compiled = compile_problem(p, PolicyOptions())
    assert len(compiled.rows) > 2  # Hall sets and FIFO reservations both bind
    exact = compiled.objective(solve_pulp(compiled, time_limit_s=60.0))
    mip = allocate(p, "mip", options=PolicyOptions(fair_floor=False))  # pulp has no floor
    assert mip.solver == "mip"
    assert mip.objective >= exact * (1 - PolicyOptions().mip_rel_gap) - 1e-6
    assert mip.objective <= exact + 1e-6 * abs(exact)


def _report_then_hang(value: int, report) -> None:  # type: ignore[no-untyped-def]
    report(value)
    time.sleep(60)


def test_a_killed_solver_still_hands_back_its_last_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_isolated(_report_then_hang, (41,), 0.3) == (41, False)
    p = replace(_large(200, 80), time_limit_s=0.8)
    expected = allocate(p, "mip").objective
    real = mip_mod.solve_input

    def incumbent_then_hang(data, limit, gap, report):  # type: ignore[no-untyped-def]
        report(real(data, limit, gap))
        time.sleep(60)

    monkeypatch.setattr(mip_mod, "solve_input", incumbent_then_hang)
    plan = allocate(p, "mip")
    assert plan.solver == "mip" and plan.status is SolverStatus.FEASIBLE
    assert "time limit" in plan.note
    assert plan.objective == pytest.approx(expected)


@pytest.mark.parametrize("policy", ["mip", "greedy", "dp"])
def test_every_pending_rigid_job_keeps_its_place_not_only_the_last(policy: str) -> None:
    # R1 (3 nodes) is ahead of E (min 2), which is ahead of R2 (1 node).  E would fit
    # before R2 but not before R1: it must wait.
    p = problem(
        [elastic(1, cur=0, sizes=(2, 3), submit=2.0)],
        pools(batch=4),
        (
            RigidDemand(91, "batch", 3, running=False, submit_time=1.0),
            RigidDemand(92, "batch", 1, running=False, submit_time=3.0),
        ),
    )
    assert targets(allocate(p, policy)) == {1: 0}
