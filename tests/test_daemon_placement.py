"""Placing pending jobs by partition: speeds per GPU type, options, and the estimator's basis.

Pure decision logic over dataclasses (no Slurm): the live placement test is in
tests/test_gpu_types_live.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from slurm_elastic.actuate.diff import WIDEN
from slurm_elastic.actuate.journal import ActionStatus, Journal
from slurm_elastic.cluster_state import ElasticJob, classify
from slurm_elastic.daemon import controller
from slurm_elastic.daemon.controller import user_groups
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.placement import (
    at_speed,
    partition_speeds,
    placement_options,
    speed_of,
)
from slurm_elastic.daemon.problem import Placing, access_rule, build_problem, partition_capacity
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.priors import prior_from_similar
from slurm_elastic.policy.decide import allocate
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.types import (
    Action,
    ActionKind,
    AllocationProblem,
    ClusterSnapshot,
    ElasticSpec,
    JobView,
    Outlook,
    PartitionView,
    ProgressReport,
    SizeEstimate,
)
from tests.fakes import fitting
from tests.test_daemon_controller import make
from tests.test_daemon_controller_data import job, pending, snapshot
from tests.test_model_priors import _hist

# Two partitions of two nodes each (``_snap``): "fast" (n1, n2) trains twice as fast as
# "slow" (n3, n4), the reference.
SPEEDS = {"fast": 2.0, "slow": 1.0}


def _outlook(job_id: int, sizes: tuple[int, ...] = (1, 2), work: float = 1000.0) -> Outlook:
    return Outlook(
        job_id,
        0,
        tuple(SizeEstimate(n, float(n), work / n) for n in sizes),
        work,
        30.0,
    )


def _snap(jobs: list[JobView], fast_state: str = "UP") -> ClusterSnapshot:
    base = snapshot(jobs)
    parts = (
        PartitionView("slow", ("n3", "n4"), True, True, "UP"),
        PartitionView("fast", ("n1", "n2"), False, True, fast_state),
    )
    return replace(base, partitions=parts)


def _resolve(j: JobView) -> ElasticSpec | None:
    return ElasticSpec(1, 2)


def test_partition_speeds_price_only_the_configured_types() -> None:
    types = {"a": "a100", "t": "t4", "u": "", "m": "mixed", "v": "v100"}
    assert partition_speeds(types, {"a100": 2.2, "t4": 1.0}) == {
        "a": 2.2,
        "t": 1.0,
        "u": 1.0,
        "m": 1.0,
        "v": 1.0,
    }
    assert speed_of({"a": 2.2}, "a,t") == 2.2 and speed_of({"a": 2.2}, "t,a") == 1.0


def test_at_speed_keeps_remaining_time_equal_to_work_over_throughput() -> None:
    base = _outlook(1, (1, 2, 4))
    assert at_speed(base, 1.0) is base
    fast = at_speed(base, 2.5)
    for before, after in zip(base.sizes, fast.sizes, strict=True):
        assert after.nodes == before.nodes
        assert after.throughput == pytest.approx(before.throughput * 2.5)
        assert after.remaining_s == pytest.approx(fast.remaining_work / after.throughput)
    assert (fast.remaining_work, fast.resize_cost_s) == (base.remaining_work, base.resize_cost_s)
    never = Outlook(1, 0, (SizeEstimate(1, 0.0, math.inf),), 10.0, 1.0)
    assert at_speed(never, 2.0).sizes[0].remaining_s == math.inf


def test_options_follow_the_jobs_order_its_access_and_each_partitions_capacity() -> None:
    view = replace(pending(1, lo=1, hi=4), partition="slow,fast,gone")
    outlook = _outlook(1, (1, 2, 4))  # priced in "slow", the job's first partition
    capacity = {"slow": 4, "fast": 2, "gone": 0}
    options = placement_options(
        view, (1, 2, 4), outlook, SPEEDS, usable=lambda p: True, capacity_in=capacity.__getitem__
    )
    assert [o.partition for o in options] == ["slow", "fast"]  # "gone" holds no size
    slow, fast = options
    assert slow.allowed_sizes == (1, 2, 4) and slow.outlook is outlook
    assert fast.allowed_sizes == (1, 2)
    assert fast.outlook.sizes[0].throughput == pytest.approx(2.0)  # twice the slow speed
    only_fast = placement_options(
        view,
        (1, 2, 4),
        outlook,
        SPEEDS,
        usable=lambda p: p == "fast",
        capacity_in=capacity.__getitem__,
    )
    assert [o.partition for o in only_fast] == ["fast"]


def _problem(
    jobs: list[JobView], placing: Placing | None, fast_state: str = "UP"
) -> AllocationProblem:
    snap = _snap(jobs, fast_state)
    cls = classify(snap, _resolve)
    return build_problem(
        snap,
        cls,
        {j.job_id: _outlook(j.job_id) for j in jobs},
        {},
        now=1000.0,
        horizon_s=600.0,
        time_limit_s=1.0,
        placing=placing,
    )


def _placing(may_use: Callable[[JobView, str], bool] | None = None) -> Placing:
    capacity = partition_capacity(_snap([]))
    if may_use is None:
        return Placing(SPEEDS, capacity)
    return Placing(SPEEDS, capacity, may_use)


def test_a_pending_job_of_two_partitions_gets_one_option_each() -> None:
    two = replace(pending(1, lo=1, hi=2), partition="slow,fast")
    problem = _problem([two], _placing())
    (demand,) = problem.elastic
    assert demand.partition == "slow,fast"
    assert [o.partition for o in demand.options] == ["slow", "fast"]
    # Without placing (the old problem), the job is planned in its first partition.
    (plain,) = _problem([two], None).elastic
    assert plain.partition == "slow" and plain.options == ()


def test_placement_by_slurm_plans_the_first_usable_partition_and_names_none() -> None:
    """``policy.placement: slurm`` (the default): no options; the job is planned in the first
    partition of its list it may use, at that partition's speed, and Slurm starts it
    wherever it fits first (no partition in the plan, so none is pinned)."""
    two = replace(pending(1, lo=1, hi=2), partition="slow,fast")
    (demand,) = _problem([two], replace(_placing(), choose=False)).elastic
    assert demand.partition == "slow" and demand.options == ()
    plan = allocate(_problem([two], replace(_placing(), choose=False)), "mip")
    assert plan.decisions[0].partition is None and plan.decisions[0].target_nodes == 2


def test_a_partition_the_user_may_not_use_or_that_is_down_is_never_planned() -> None:
    two = replace(pending(1, lo=1, hi=2), partition="fast,slow")
    (denied,) = _problem([two], _placing(lambda job, p: p != "fast")).elastic
    assert denied.partition == "slow" and denied.options == ()
    assert denied.outlook.sizes[0].throughput == pytest.approx(0.5)  # priced in "fast" first
    (down,) = _problem([two], _placing(), fast_state="DOWN").elastic
    assert down.partition == "slow" and down.options == ()


def test_running_jobs_have_no_options() -> None:
    running = replace(job(1, nodes=("n1",), lo=1, hi=2), partition="fast")
    (demand,) = _problem([running], _placing()).elastic
    assert demand.options == () and demand.partition == "fast"


def test_the_mip_starts_the_job_in_the_faster_partition_and_greedy_in_its_first() -> None:
    """One job, both partitions free: its first partition is the slow one.  Greedy takes
    the first that fits (as Slurm would); the MIP the one where it finishes sooner."""
    two = replace(pending(1, lo=1, hi=2), partition="slow,fast")
    problem = _problem([two], _placing())
    chosen = {}
    for policy in ("greedy", "mip"):
        plan = allocate(problem, policy, options=PolicyOptions(isolate=False))
        (decision,) = plan.decisions
        chosen[policy] = (decision.partition, decision.target_nodes)
    assert chosen == {"greedy": ("slow", 2), "mip": ("fast", 2)}


def test_a_prior_from_jobs_on_other_gpus_is_brought_to_the_reference_speed() -> None:
    slow = replace(_hist(1), partition="slow")
    fast = replace(_hist(2), partition="fast")
    plain = prior_from_similar([slow, fast], 1)
    scaled = prior_from_similar([slow, fast], 1, speed=lambda h: SPEEDS[h.partition])
    runtime = plain.runtime_s  # both ran equally long
    assert scaled.runtime_s == pytest.approx(runtime * 1.5)  # median of 1x and 2x


def _report(job_id: int, i: int) -> ProgressReport:
    return ProgressReport(
        job_id=job_id,
        time=100.0 * i,
        step=50 * i,
        nodes=1,
        samples_per_s=32.0,
        global_batch=64,
        total_steps=5000,
    )


def test_the_estimator_prices_each_job_in_its_own_partition() -> None:
    """A job that reported is priced where it ran (its measurement is its basis); a pending
    job from its prior at its first partition's speed relative to the reference."""
    reports = ReportStore()
    estimator = Estimator(reports, 30.0)
    ran = replace(job(1, nodes=("n1",), lo=1, hi=2, start=0.0), partition="fast")
    for i in range(1, 8):
        reports.add(_report(1, i))
    waiting = {p: replace(pending(2, lo=1, hi=2), partition=p) for p in ("slow", "fast,slow")}
    spec = ElasticSpec(1, 2)
    alike = estimator.outlooks(
        {1: ElasticJob(ran, spec), 2: ElasticJob(waiting["slow"], spec)}, 900
    )
    typed = estimator.outlooks(
        {1: ElasticJob(ran, spec), 2: ElasticJob(waiting["slow"], spec)}, 900, SPEEDS
    )
    assert typed[1] == alike[1]  # measured on the fast GPUs it runs on
    assert typed[2] == alike[2]  # slow is the reference speed
    first_fast = estimator.outlooks({2: ElasticJob(waiting["fast,slow"], spec)}, 900, SPEEDS)
    assert first_fast[2].sizes[0].throughput == pytest.approx(2 * alike[2].sizes[0].throughput)


def test_the_access_rule_asks_for_groups_only_where_a_partition_lists_some() -> None:
    asked: list[str] = []

    def groups_of(user: str) -> tuple[str, ...]:
        asked.append(user)
        return ("wheel",) if user == "carol" else ()

    snap = _snap([])
    parts = (
        replace(snap.partitions[0], allow_groups=("wheel",)),  # slow: wheel only
        snap.partitions[1],
    )
    allowed = access_rule(replace(snap, partitions=parts), groups_of)
    alice = replace(pending(1), user="alice", user_id=1001)
    carol = replace(pending(2), user="carol", user_id=1002)
    assert allowed(alice, "fast") and asked == []
    assert not allowed(alice, "slow") and allowed(carol, "slow")
    assert not allowed(carol, "gone")  # a partition Slurm does not list
    problem = build_problem(
        replace(snap, partitions=parts),
        classify(replace(snap, jobs=(replace(alice, partition="slow,fast"),)), _resolve),
        {1: _outlook(1)},
        {},
        now=1000.0,
        horizon_s=600.0,
        time_limit_s=1.0,
        placing=Placing(SPEEDS, partition_capacity(snap), allowed),
    )
    (demand,) = problem.elastic
    assert demand.partition == "fast" and demand.options == ()


def test_user_groups_come_from_the_hosts_user_database() -> None:
    assert "root" in user_groups("root")
    assert user_groups("no-such-user-x") == frozenset()


@pytest.mark.parametrize("sacct_fails", [False, True])
def test_the_controller_asks_a_users_groups_once_per_read_of_the_limits(
    monkeypatch: pytest.MonkeyPatch, sacct_fails: bool
) -> None:
    """The user database (LDAP at many sites) is asked once for a user, not every cycle,
    and again at the sacct cadence: a group a user joins counts from then on, also while
    sacct fails (the limits are then not re-read)."""
    asked: list[str] = []

    def counted(user: str) -> frozenset[str]:
        asked.append(user)
        return frozenset()

    monkeypatch.setattr(controller, "user_groups", counted)
    snap = _snap([replace(pending(7), partition="slow,fast")])
    parts = (replace(snap.partitions[0], allow_groups=("wheel",)), snap.partitions[1])
    ctl, backend, *_ = make(replace(snap, partitions=parts), {7: 1}, slurm={"sacct_interval_s": 20})
    backend.fail_history = sacct_fails
    for now in (1000.0, 1005.0, 1010.0):
        assert ctl.run_once(now).ok
    assert asked == [pending(7).user]
    assert ctl.run_once(1030.0).ok  # the sacct cadence
    assert asked == [pending(7).user] * 2


def _narrowed_to_fast_at_900(journal: Journal) -> None:
    """Job 7 (``-p slow,fast``) narrowed to fast by an earlier cycle, as the diff journals it."""
    narrowing = Action(
        ActionKind.START_AT_SIZE,
        7,
        0,
        1,
        "test",
        (("partition", "fast"), ("submitted", "slow,fast")),
    )
    journal.mark(journal.record_intent(narrowing, 900.0), ActionStatus.APPLIED, 900.0)


def test_a_job_the_daemon_narrowed_is_planned_among_its_partitions_and_given_them_back() -> None:
    """policy.placement: plan.  Job 7 (``-p slow,fast``) was narrowed to fast by an earlier
    cycle and has not started: the next problem offers it both partitions again, and a
    plan that does not start it gives it both back (at its pinned size); with placement by
    Slurm the journal is not even read."""
    snap = _snap([replace(pending(7, lo=1, hi=1), partition="fast")])
    seen: list[AllocationProblem] = []
    ctl, backend, journal, _ = make(
        snap, fitting({7: 0}, seen), policy={"placement": "plan"}, cluster={"gpu_speeds": SPEEDS}
    )
    _narrowed_to_fast_at_900(journal)
    assert ctl.run_once(1000.0).ok
    (demand,) = seen[-1].elastic
    assert {o.partition for o in demand.options} == {"slow", "fast"}
    assert backend.actions() == [("pin", (7, 1, "slow,fast"))]
    (entry,) = [e for e in journal.actions_for(7) if e.id > 1]
    assert entry.action.reason == WIDEN and entry.status is ActionStatus.APPLIED
    by_slurm, backend2, journal2, _ = make(snap, fitting({7: 0}, []))
    _narrowed_to_fast_at_900(journal2)
    assert by_slurm.run_once(1000.0).ok and backend2.actions() == []


def test_a_narrowed_job_is_never_given_a_partition_its_user_may_no_longer_use() -> None:
    """The list journalled at the narrowing is the user's own, but a partition closed to
    them since (here: slow, now AllowGroups=wheel) is neither planned nor given back."""
    view = replace(pending(7, lo=1, hi=1, user="no-such-user-x"), partition="fast", user_id=1001)
    snap = _snap([view])
    closed = (replace(snap.partitions[0], allow_groups=("wheel",)), snap.partitions[1])
    seen: list[AllocationProblem] = []
    ctl, backend, journal, _ = make(
        replace(snap, partitions=closed), fitting({7: 0}, seen), policy={"placement": "plan"}
    )
    _narrowed_to_fast_at_900(journal)
    assert ctl.run_once(1000.0).ok
    (demand,) = seen[-1].elastic
    assert demand.partition == "fast" and demand.options == ()
    assert backend.actions() == []
