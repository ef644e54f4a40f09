"""Placement options: a pending job that may start in several partitions of different
speeds (``ElasticDemand.options``, issue 17).  Every policy starts it in one of them at
most; the MIP picks the one that pays, where greedy (Optimus, with Slurm's first fit)
takes the first that fits."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.errors import SolverError
from slurm_elastic.policy import POLICIES, PolicyOptions, allocate
from slurm_elastic.policy.capacity import CAPACITY, PROMISE, RECLAIM, RESERVATION
from slurm_elastic.policy.compiled import compile_problem
from slurm_elastic.policy.mip import fair_floor_jobs
from slurm_elastic.types import AllocationProblem, ElasticDemand, PlacementOption, Plan
from tests.test_policy_support import elastic, outlook, pools, problem

INLINE = PolicyOptions(isolate=False)
OPEN = PolicyOptions(isolate=False, fair_floor=False)
SIZES = (1, 2)


def placed(
    job_id: int, speeds: dict[str, float], sizes: tuple[int, ...] = SIZES, submit: float = 0.0
) -> ElasticDemand:
    """A pending job of partitions ``speeds`` (in that order), ``scale`` its speed in each."""
    d = elastic(job_id, ",".join(speeds), sizes=sizes, submit=submit)
    return replace(
        d,
        options=tuple(
            PlacementOption(p, sizes, outlook(job_id, 0, sizes, scale=scale))
            for p, scale in speeds.items()
        ),
    )


def partitions_of(plan: Plan) -> dict[int, tuple[str | None, int]]:
    return {d.job_id: (d.partition, d.target_nodes) for d in plan.decisions}


def test_the_mip_puts_each_job_on_the_gpus_that_pay_where_greedy_takes_the_first_fit() -> None:
    # Two nodes of each type. Job 1 (older) runs as fast on both; job 2 three times faster
    # on a100. Greedy admits in Slurm's order, each in its first partition that fits:
    # job 1 takes a100 and job 2 gets t4. The MIP swaps them.
    p = problem(
        [
            placed(1, {"a100": 1.0, "t4": 1.0}, sizes=(2,), submit=0.0),
            placed(2, {"a100": 3.0, "t4": 1.0}, sizes=(2,), submit=1.0),
        ],
        pools(a100=2, t4=2),
    )
    mip, greedy = allocate(p, "mip", options=INLINE), allocate(p, "greedy", options=INLINE)
    assert partitions_of(mip) == {1: ("t4", 2), 2: ("a100", 2)}
    assert partitions_of(greedy) == {1: ("a100", 2), 2: ("t4", 2)}
    assert mip.objective > greedy.objective
    static = allocate(p, "static", options=INLINE)
    assert partitions_of(static) == {1: ("a100", 2), 2: ("t4", 2)}  # Slurm's own order


def test_a_job_that_fits_nowhere_stays_pending_with_no_partition() -> None:
    p = problem([placed(1, {"a100": 1.0, "t4": 2.0}, sizes=(3,))], pools(a100=2, t4=2))
    for policy in POLICIES:
        plan = allocate(p, policy, options=INLINE)
        assert partitions_of(plan) == {1: (None, 0)}, policy
        assert len(plan.weighed.of(0)) == 2  # stay pending or 3 nodes, in its first option


def test_bad_options_are_refused_with_one_line() -> None:
    good = placed(1, {"a100": 1.0, "t4": 1.0})
    elsewhere = replace(good.options[1], partition="v100")
    cases = {
        "distinct partitions of its own": replace(good, options=(good.options[0],) * 2),
        "its own 'a100,t4'": replace(good, options=(good.options[0], elsewhere)),
        "a running job has no placement options": replace(good, current_nodes=1),
    }
    for message, demand in cases.items():
        with pytest.raises(SolverError, match=message) as info:
            compile_problem(problem([demand], pools(a100=2, t4=2)), INLINE)
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- properties

SPEED = st.sampled_from([0.5, 1.0, 2.0, 4.0])


@st.composite
def instances(draw: st.DrawFn) -> AllocationProblem:
    """Two disjoint partitions; running jobs in one, pending jobs of one or both."""
    nodes = {"a": draw(st.integers(1, 4)), "b": draw(st.integers(1, 4))}
    jobs: list[ElasticDemand] = []
    for job_id in range(1, draw(st.integers(1, 4)) + 1):
        kind = draw(st.sampled_from(["running", "one", "both"]))
        sizes = draw(st.sampled_from([(1,), (1, 2), (2,), (1, 2, 3)]))
        submit = float(draw(st.integers(0, 3)))
        if kind == "running":
            part = draw(st.sampled_from(["a", "b"]))
            if sizes[0] > nodes[part]:
                continue
            cur = draw(st.sampled_from([s for s in sizes if s <= nodes[part]]))
            used = sum(d.current_nodes for d in jobs if d.partition == part)
            if used + sizes[0] > nodes[part]:
                continue
            jobs.append(elastic(job_id, part, cur=min(cur, nodes[part] - used), sizes=sizes))
        elif kind == "one":
            jobs.append(
                elastic(job_id, draw(st.sampled_from(["a", "b"])), sizes=sizes, submit=submit)
            )
        else:
            order = draw(st.permutations(["a", "b"]))
            speeds = {p: draw(SPEED) for p in order}
            jobs.append(placed(job_id, speeds, sizes=sizes, submit=submit))
    return problem(jobs, pools(**nodes))


def _options(d: ElasticDemand) -> list[tuple[str, int]]:
    """Every (partition, size) the job may get, (partition, 0) for staying pending."""
    if d.is_running:
        return [(d.partition, s) for s in sorted(set(d.allowed_sizes) | {d.current_nodes})]
    places = [o.partition for o in d.options] or [d.partition]
    sizes = {o.partition: o.allowed_sizes for o in d.options} or {d.partition: d.allowed_sizes}
    return [("", 0)] + [(p, s) for p in places for s in sizes[p]]


def _fits(p: AllocationProblem, got: dict[int, tuple[str, int]]) -> bool:
    used: dict[str, int] = {}
    for part, size in got.values():
        used[part] = used.get(part, 0) + size
    return all(used.get(next(iter(pool.partitions)), 0) <= pool.nodes for pool in p.pools)


def _checked(p: AllocationProblem, plan: Plan) -> dict[int, tuple[str, int]]:
    """The plan's (partition, size) per job, after checking each is one the job may get."""
    assert [d.job_id for d in plan.decisions] == [d.job_id for d in p.elastic]
    got = {}
    for d, decision in zip(p.elastic, plan.decisions, strict=True):
        part = decision.partition if d.options else (d.partition if decision.target_nodes else "")
        assert (decision.partition is None) == (not d.options or decision.target_nodes == 0)
        assert (part or "", decision.target_nodes) in _options(d)
        got[d.job_id] = (part or "", decision.target_nodes)
    assert _fits(p, got)
    return got


def _best(p: AllocationProblem) -> float:
    """Brute force over every placement and size (capacity only, no floor)."""
    compiled = compile_problem(p, OPEN)
    value: dict[tuple[int, str, int], float] = {}
    for job in compiled.jobs:
        d = job.demand
        for size, v in zip(job.legal.tolist(), job.legal_value.tolist(), strict=True):
            value[(d.job_id, d.partition if size else "", size)] = v
    best = -math.inf
    for combo in itertools.product(*(_options(d) for d in p.elastic)):
        got = {d.job_id: c for d, c in zip(p.elastic, combo, strict=True)}
        if _fits(p, got):
            best = max(best, sum(value[(j, part, s)] for j, (part, s) in got.items()))
    return best


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", POLICIES)
@FAST
@given(p=instances())
def test_every_policy_starts_a_job_in_one_of_its_partitions_at_most(
    policy: str, p: AllocationProblem
) -> None:
    _checked(p, allocate(p, policy, options=INLINE))


@FAST
@given(p=instances())
def test_the_mip_is_optimal_over_placements_and_never_behind_greedy(p: AllocationProblem) -> None:
    mip = allocate(p, "mip", options=OPEN)
    assert mip.solver == "mip"
    _checked(p, mip)
    assert math.isclose(mip.objective, _best(p), rel_tol=2e-3, abs_tol=1e-6)
    floored = allocate(p, "mip", options=INLINE)
    greedy = allocate(p, "greedy", options=INLINE)
    assert floored.objective >= greedy.objective - 2e-3 * abs(greedy.objective) - 1e-6
    # The admission floor: a job Slurm's order lets start somewhere starts, anywhere.
    compiled = compile_problem(p, INLINE)
    admitted = {compiled.jobs[j].job_id for j in fair_floor_jobs(compiled)}
    assert all(d.target_nodes > 0 for d in floored.decisions if d.job_id in admitted)


def test_the_options_of_each_job_start_once_at_most() -> None:
    p = problem([placed(1, {"a": 1.0, "b": 2.0}), elastic(2, "a")], pools(a=2, b=2))
    compiled = compile_problem(p, INLINE)
    assert compiled.owner == (0, 0, 1)
    assert compiled.placements == ((0, 1),)
    # A group, not a row: the solvers' matrices keep only the rows that couple jobs.
    assert {r.kind for r in compiled.rows} <= {CAPACITY, RESERVATION, RECLAIM, PROMISE}
    assert compiled.feasible([1, 0, 0]) and compiled.feasible([0, 1, 0])
    assert not compiled.feasible([1, 1, 0])


@FAST
@given(p=instances())
def test_no_policy_starts_two_placements_of_one_job(p: AllocationProblem) -> None:
    """Below the plan, where the decisions are still per placement."""
    from slurm_elastic.policy.greedy import solve_greedy
    from slurm_elastic.policy.static import solve_static

    compiled = compile_problem(p, INLINE)
    owner = compiled.owner or tuple(range(len(compiled.jobs)))  # () when no job has options
    for choice in (solve_greedy(compiled), solve_static(compiled)):
        assert compiled.feasible(choice)
        started = [owner[j] for j, k in enumerate(choice) if compiled.jobs[j].sizes[k]]
        assert len(started) == len(set(started))
