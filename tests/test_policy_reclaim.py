"""Loans and reclaim, and Slurm's priority order, in hand-built situations (every policy
that plans with rows: mip and greedy; dp knows one row and falls back to greedy).

The issue's own example: one partition of 4 nodes, an elastic job entitled to 1 node
grown to 3 (2 on loan), then a rigid ``-N2`` job.  Without a reclaim the rigid job waits
until the elastic job ends; with it, the elastic job gives back one node.
"""

from __future__ import annotations

import pytest

from slurm_elastic.policy import allocate
from slurm_elastic.policy.capacity import RECLAIM, RESERVATION, build_rows, demand_class
from slurm_elastic.types import AllocationProblem, ElasticDemand, RigidDemand
from tests.test_policy_support import elastic, pools, problem, targets

PLANNERS = ("mip", "greedy", "dp")


def _rows(p: AllocationProblem) -> list[tuple[str, str, float]]:
    classes = {d.job_id: demand_class(d.partition) for d in p.elastic}
    return [(r.name, r.kind, r.rhs) for r in build_rows(p, classes, 12) if r.kind != "capacity"]


def _borrower(entitled: int | None, **kw: object) -> AllocationProblem:
    return problem(
        [elastic(1, cur=3, sizes=(1, 2, 3), entitled=entitled, **kw)],  # type: ignore[arg-type]
        pools(batch=4),
        (RigidDemand(91, "batch", 2, running=False, submit_time=5.0),),
    )


@pytest.mark.parametrize("policy", PLANNERS)
def test_a_borrower_gives_back_what_a_pending_rigid_job_needs_and_no_more(policy: str) -> None:
    p = _borrower(entitled=1)
    assert _rows(p) == [
        ("reclaim:batch:job91", RECLAIM, -1.0),
        ("fifo-reservation:batch:job91", RESERVATION, -1.0),
    ]
    plan = allocate(p, policy)
    assert targets(plan) == {1: 2}
    why = plan.decisions[0].explanation
    assert why.rule == "reclaim"
    assert why.detail == "shrink 3->2; gives back 1 of 2 on loan to reclaim:batch:job91"


@pytest.mark.parametrize("policy", PLANNERS)
def test_a_job_at_its_entitlement_is_not_shrunk_for_a_rigid_job(policy: str) -> None:
    """Nothing on loan: the rigid job waits, as it would without the daemon."""
    for entitled in (3, None):
        p = _borrower(entitled=entitled)
        assert _rows(p) == [("fifo-reservation:batch:job91", RESERVATION, 0.0)]
        assert targets(allocate(p, policy)) == {1: 3}


@pytest.mark.parametrize("policy", PLANNERS)
def test_no_reclaim_when_the_loans_would_not_let_the_job_start(policy: str) -> None:
    """A rigid -N4 job cannot start while the borrower holds its entitlement: shrinking it
    would only idle nodes, so it keeps them (and grows no further)."""
    p = problem(
        [elastic(1, cur=3, sizes=(1, 2, 3), entitled=1)],
        pools(batch=4),
        (RigidDemand(91, "batch", 4, running=False, submit_time=5.0),),
    )
    assert [kind for _, kind, _ in _rows(p)] == [RESERVATION]
    assert targets(allocate(p, policy)) == {1: 3}


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_never_below_the_entitlement_of_any_job(policy: str) -> None:
    """Two borrowers; the rigid job needs 3 of the 4 loaned nodes.  Job 2 gains less per
    node (alpha 0.3), so it gives back first, but never below its entitlement of 2."""
    p = problem(
        [
            elastic(1, cur=4, sizes=(1, 2, 3, 4), entitled=2, alpha=0.9),
            elastic(2, cur=4, sizes=(1, 2, 3, 4), entitled=2, alpha=0.3),
        ],
        pools(batch=8),
        (RigidDemand(91, "batch", 3, running=False, submit_time=5.0),),
    )
    got = targets(allocate(p, policy))
    assert got[2] == 2 and got[1] == 3


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_dwell_does_not_keep_a_loan_but_an_action_in_flight_does(policy: str) -> None:
    yielding = _borrower(entitled=1, frozen=True, loan_yields=True)
    assert targets(allocate(yielding, policy)) == {1: 2}
    busy = _borrower(entitled=1, frozen=True, loan_yields=False)
    # The loan cannot come back this cycle: the rigid job keeps its place, nothing moves.
    assert [kind for _, kind, _ in _rows(busy)] == [RESERVATION]
    plan = allocate(busy, policy)
    assert targets(plan) == {1: 3} and plan.decisions[0].explanation.rule == "frozen"


def test_a_frozen_borrower_with_no_reclaim_is_offered_only_its_size() -> None:
    p = problem(
        [elastic(1, cur=3, sizes=(1, 2, 3), entitled=1, frozen=True, loan_yields=True)],
        pools(batch=4),
    )
    assert targets(allocate(p, "mip")) == {1: 3}


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_slurm_priority_not_submit_time_orders_the_queue(policy: str) -> None:
    """A rigid job submitted after a pending elastic job but with a higher priority is
    ahead of it: the elastic job may not take its nodes.  At equal priority the older
    elastic job is ahead and starts at its minimum."""
    rigid_ahead = problem(
        [elastic(1, cur=0, sizes=(2, 3, 4), submit=0.0, priority=100.0)],
        pools(batch=4),
        (RigidDemand(91, "batch", 3, running=False, submit_time=1.0, priority=200.0),),
    )
    assert targets(allocate(rigid_ahead, policy)) == {1: 0}
    same = problem(
        [elastic(1, cur=0, sizes=(2, 3, 4), submit=0.0, priority=100.0)],
        pools(batch=4),
        (RigidDemand(91, "batch", 2, running=False, submit_time=1.0, priority=100.0),),
    )
    assert targets(allocate(same, policy)) == {1: 2}


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_a_higher_priority_pending_elastic_job_is_started_from_loans(policy: str) -> None:
    """A pending elastic job that the loans keep from its minimum reclaims them like a
    rigid job (and the admission floor starts it)."""
    p = problem(
        [
            elastic(1, cur=3, sizes=(1, 2, 3), entitled=1, submit=0.0),
            elastic(2, cur=0, sizes=(2, 3), submit=10.0, priority=50.0),
        ],
        pools(batch=4),
    )
    assert _rows(p) == [
        ("reclaim:batch:job2", RECLAIM, -1.0),
        ("fifo-reservation:batch:job2", RESERVATION, -1.0),
    ]
    plan = allocate(p, policy)
    assert targets(plan) == {1: 2, 2: 2}
    why = plan.decisions[0].explanation
    assert (why.rule, why.detail) == (
        "reclaim",
        "shrink 3->2; gives back 1 of 2 on loan to reclaim:batch:job2",
    )


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_no_grow_into_the_nodes_of_a_start_promised_soon(policy: str) -> None:
    """A rigid -N2 job with a begin time in a few minutes (not startable yet): a running
    elastic job does not grow into its two nodes, although they are idle; a pending
    elastic job may still start there (Slurm would start it), and nothing is reclaimed."""
    promised = RigidDemand(91, "batch", 2, running=False, submit_time=5.0, startable=False)
    p = problem([elastic(1, cur=1, sizes=(1, 2, 3, 4), entitled=1)], pools(batch=4), (promised,))
    assert _rows(p) == [("promise:batch", "promise", 1.0)]
    plan = allocate(p, policy)
    assert targets(plan) == {1: 2}
    assert plan.decisions[0].explanation.rule == "promise"
    borrower = problem(
        [elastic(1, cur=3, sizes=(1, 2, 3), entitled=1), elastic(2, cur=0, sizes=(1,))],
        pools(batch=4),
        (promised,),
    )
    assert targets(allocate(borrower, policy)) == {1: 3, 2: 1}


def _linear(
    job_id: int, partition: str, cur: int, sizes: tuple[int, ...], **kw: object
) -> ElasticDemand:
    """A job whose speed is linear in its size (0.5 steps/s a node), 50 steps of work and
    free resizes, unless ``kw`` says otherwise."""
    args: dict[str, object] = dict(weight=0.5, alpha=1.0, scale=0.5, work=50.0, cost=0.0)
    return elastic(job_id, partition, cur, sizes, **{**args, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_no_reclaim_for_a_job_that_jobs_of_another_partition_ahead_would_still_keep_out(
    policy: str,
) -> None:
    """Job 102 (partition b) holds 2 nodes on loan; pending job 103 (b) needs 3 of the 4
    shared nodes, but jobs 100 and 101 (partition a) are ahead of it in Slurm's queue and
    take 2 of them first.  A row of b alone does not see them: it reclaimed down to 1 node
    for 103, which could still not start, and a node stood idle (found by
    ``test_mip_with_the_floor_is_optimal_among_plans_that_admit_it``: mip 875 against 900)."""
    p = problem(
        [
            _linear(100, "a", 0, (1,)),
            _linear(101, "a", 0, (1,)),
            _linear(102, "b", 3, (1, 2), frozen=True, entitled=1, loan_yields=True),
            _linear(103, "b", 0, (3,)),
        ],
        pools(a_b=4),
    )
    assert [name for name, kind, _ in _rows(p) if kind == RECLAIM] == []
    got = targets(allocate(p, policy))
    assert got[102] == 3 and got[103] == 0


def test_a_shrink_below_the_entitlement_funds_a_larger_start() -> None:
    """Job 101 runs at 3, entitled to 2, nearly done; pending 102 has far more work and may
    run at 1 or 2.  The best plan on 4 nodes shrinks 101 to 1 and starts 102 at 2 (875).
    The reclaim for 102 takes back 101's loan; its room (the reservation row) counts the
    shrink below the entitlement too, which a single reclaim row did not (it started 102 at
    1: 750; found by ``test_mip_with_the_floor_is_optimal_among_plans_that_admit_it``)."""
    p = problem(
        [
            _linear(100, "a", 0, (1,)),
            _linear(101, "a", 3, (1, 2), entitled=2),
            _linear(102, "a", 0, (1, 2), work=2000.0),
        ],
        pools(a=4),
    )
    assert _rows(p) == [
        ("reclaim:a:job102", RECLAIM, -1.0),
        ("fifo-reservation:a:job102", RESERVATION, -1.0),
    ]
    plan = allocate(p, "mip")
    assert targets(plan) == {100: 1, 101: 1, 102: 2}
    why = next(d.explanation for d in plan.decisions if d.job_id == 101)
    assert why.rule == "reclaim" and why.waiting_job == 102
    assert why.detail == "shrink 3->1; gives back 1 of 1 on loan to reclaim:a:job102 and 1 more"


@pytest.mark.parametrize("policy", ["mip", "greedy"])
def test_no_reclaim_for_a_rigid_job_that_jobs_of_another_partition_ahead_would_keep_out(
    policy: str,
) -> None:
    """As above with the job waiting in b rigid (-N3): it gets a plain reservation (the
    borrower grows no further) and no reclaim; with no job of a ahead it could start once
    the loan is back, and it reclaims."""
    jobs = [
        _linear(100, "a", 0, (1,)),
        _linear(101, "a", 0, (1,)),
        _linear(102, "b", 3, (1, 2, 3), entitled=1),
    ]
    waiting = (RigidDemand(103, "b", 3, running=False, submit_time=1.0),)
    kept_out = problem(jobs, pools(a_b=4), waiting)
    rows = _rows(kept_out)
    assert ("fifo-reservation:b:job103", RESERVATION, 0.0) in rows
    assert not [name for name, kind, _ in rows if kind == RECLAIM]
    # 102 gives a node to the jobs of a by capacity alone; a reclaim would have taken it to
    # 1 and idled a node.
    assert targets(allocate(kept_out, policy)) == {100: 1, 101: 1, 102: 2}
    alone = problem([jobs[2]], pools(a_b=4), waiting)
    assert [name for name, kind, _ in _rows(alone) if kind == RECLAIM] == ["reclaim:b:job103"]
