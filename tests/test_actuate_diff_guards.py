"""Pure actuation logic: classification, plan diff, companion housekeeping, guard rails."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.diff import WIDEN, companion_cleanup, diff, narrowed_from
from slurm_elastic.actuate.guards import (
    GuardKnobs,
    block_reason,
    freeze_reason,
    limit_resizes,
    retry_wait_s,
)
from slurm_elastic.actuate.journal import ActionStatus, JournalEntry
from slurm_elastic.cluster_state import classify, shrink_layout
from slurm_elastic.errors import MarkerError
from slurm_elastic.marker import companion_parent
from slurm_elastic.types import (
    Action,
    ActionKind,
    Decision,
    ElasticSpec,
    Explanation,
    JobState,
    JobView,
    Outlook,
    Plan,
    SizeEstimate,
    SolverStatus,
)
from tests.test_daemon_controller_data import job, pending, snapshot


def resolve(j: JobView) -> ElasticSpec | None:
    if j.comment == "elastic:bad":
        raise MarkerError("unknown option 'bad'")
    if not j.comment.startswith("elastic"):
        return None
    return ElasticSpec(1, 4)


def plan(**targets: int) -> Plan:
    decisions = tuple(
        Decision(int(k[1:]), 0, v, Explanation(0.0, 0.0, "test")) for k, v in targets.items()
    )
    return Plan(decisions, "test", SolverStatus.OPTIMAL, 0.0)


def test_classify_sorts_every_job_with_a_reason() -> None:
    parent = job(1, nodes=("n1", "n2"))
    comp = job(2, nodes=("n3",), comment=companion_comment(1))
    het = replace(job(3, nodes=("n4",)), het_job_id=3, het_job_offset=0)
    snap = snapshot([parent, comp, het, pending(4, comment=""), pending(5, comment="elastic:bad")])
    cls = classify(snap, resolve)
    assert set(cls.elastic) == {1}
    assert cls.elastic[1].effective_nodes == 3
    assert cls.not_elastic == {
        2: "companion of 1",
        3: "heterogeneous job (not resized)",
        4: "not elastic",
        5: "malformed marker: unknown option 'bad'",
    }
    assert cls.orphans == ()


def test_companion_of_another_users_job_is_neither_counted_nor_cancelled() -> None:
    parent = job(1, nodes=("n1",))
    foreign = job(2, nodes=("n2",), comment=companion_comment(1), user="mallory")
    cls = classify(snapshot([parent, foreign]), resolve)
    assert cls.elastic[1].effective_nodes == 1
    assert cls.orphans == ()


def test_partition_filter_keeps_jobs_rigid() -> None:
    cls = classify(snapshot([pending(1)]), resolve, lambda p: p != "batch")
    assert cls.elastic == {} and cls.not_elastic[1] == "partition batch not managed"


def test_diff_pins_shrinks_grows_in_that_order() -> None:
    snap = snapshot(
        [job(1, nodes=("n1",)), job(2, nodes=("n2", "n3", "n4")), pending(3)], taken_at=0
    )
    cls = classify(snap, resolve)
    actions = diff(plan(j1=2, j2=1, j3=2), cls, frozen={})
    assert [(a.kind, a.job_id, a.from_nodes, a.to_nodes) for a in actions] == [
        (ActionKind.START_AT_SIZE, 3, 0, 2),
        (ActionKind.SHRINK, 2, 3, 1),
        (ActionKind.GROW, 1, 1, 2),
    ]
    assert dict(actions[1].extra)["keep_nodes"] == "n2"
    assert dict(actions[2].extra)["companion_nodes"] == "1"


def test_a_placed_pending_job_is_pinned_with_its_partition_even_at_its_size() -> None:
    """Policy placement options: the pin narrows a job of several partitions to the one
    the plan chose, also when its size already is the planned one."""
    two = replace(pending(3, lo=2, hi=2), partition="a100,t4")
    cls = classify(snapshot([two, pending(4, lo=2, hi=2)]), resolve)
    placed = Plan(
        (
            Decision(3, 0, 2, Explanation(0.0, 0.0, "test"), partition="t4"),
            Decision(4, 0, 2, Explanation(0.0, 0.0, "test")),
        ),
        "test",
        SolverStatus.OPTIMAL,
        0.0,
    )
    actions = diff(placed, cls, frozen={})
    assert [(a.job_id, a.to_nodes, dict(a.extra)) for a in actions] == [
        (3, 2, {"partition": "t4", "submitted": "a100,t4"})
    ]  # job 4 is at its size already and has no partition to narrow
    narrowed = classify(snapshot([replace(two, partition="t4")]), resolve)
    assert diff(placed, narrowed, frozen={}) == []


def _placed_entry(
    action_id: int, partition: str, submitted: str = "a100,t4", at: float = 0.0, size: int = 2
) -> JournalEntry:
    action = Action(
        ActionKind.START_AT_SIZE,
        3,
        0,
        size,
        "test",
        (("partition", partition), ("submitted", submitted)),
    )
    return JournalEntry(action_id, action, ActionStatus.APPLIED, at, at)


def test_a_narrowed_job_the_plan_does_not_start_gets_its_partitions_back() -> None:
    """Narrowed to t4 by an earlier plan, job 3 is still pending: a plan that does not
    start it gives it a100,t4 back (at the size it has); one that starts it in a100
    narrows it there, the update carrying the list it was submitted to."""
    entries = [_placed_entry(1, "t4", at=100.0)]
    assert narrowed_from(entries, "t4") == (("a100", "t4"), 100.0)
    cls = classify(snapshot([replace(pending(3, lo=2, hi=2), partition="t4")]), resolve)
    own = {3: ("a100", "t4")}
    waits = Plan(
        (Decision(3, 0, 0, Explanation(0.0, 0.0, "test")),), "test", SolverStatus.OPTIMAL, 0.0
    )
    (back,) = diff(waits, cls, frozen={}, narrowed=own)
    assert (back.kind, back.to_nodes, back.reason) == (ActionKind.START_AT_SIZE, 2, WIDEN)
    assert dict(back.extra) == {"partition": "a100,t4", "submitted": "a100,t4"}
    assert diff(waits, cls, frozen={}) == []  # not narrowed by the daemon: left alone
    moved = Plan(
        (Decision(3, 0, 2, Explanation(0.0, 0.0, "test"), partition="a100"),),
        "test",
        SolverStatus.OPTIMAL,
        0.0,
    )
    (pin,) = diff(moved, cls, frozen={}, narrowed=own)
    assert dict(pin.extra) == {"partition": "a100", "submitted": "a100,t4"}


def test_a_narrowed_job_placed_where_it_waits_gets_its_partitions_back_when_overdue() -> None:
    """The plan places job 3 in t4, where it was narrowed and has not started: nothing to
    do until it is overdue (placement_wait_s), then it gets a100,t4 back at the planned
    size (Slurm did not start it in t4; it may start in a100)."""
    cls = classify(snapshot([replace(pending(3, lo=2, hi=2), partition="t4")]), resolve)
    own = {3: ("a100", "t4")}
    here = Plan(
        (Decision(3, 0, 2, Explanation(0.0, 0.0, "test"), partition="t4"),),
        "test",
        SolverStatus.OPTIMAL,
        0.0,
    )
    assert diff(here, cls, frozen={}, narrowed=own) == []
    (back,) = diff(here, cls, frozen={}, narrowed=own, overdue={3})
    assert (back.to_nodes, back.reason, dict(back.extra)["partition"]) == (2, WIDEN, "a100,t4")
    # Its wait counts from the first pin there, not from a later pin of another size.
    entries = [_placed_entry(1, "t4", at=100.0), _placed_entry(2, "t4", at=160.0, size=1)]
    assert narrowed_from(entries, "t4")[1] == 100.0
    moved_back = [*entries, _placed_entry(3, "a100", at=200.0), _placed_entry(4, "t4", at=260.0)]
    assert narrowed_from(moved_back, "t4")[1] == 260.0


def test_only_a_narrowing_that_still_holds_is_given_back() -> None:
    """Moved since (by its user, or given back), or never narrowed: nothing to give back."""
    nothing = ((), 0.0)
    assert narrowed_from([_placed_entry(1, "t4")], "a100") == nothing  # its user moved it
    given_back = _placed_entry(2, "a100,t4")
    assert narrowed_from([_placed_entry(1, "t4"), given_back], "t4") == nothing
    assert narrowed_from([], "t4") == nothing
    refused = replace(_placed_entry(1, "t4"), status=ActionStatus.REFUSED)
    assert narrowed_from([refused], "t4") == nothing


def test_diff_skips_frozen_jobs_and_jobs_at_target() -> None:
    cls = classify(snapshot([job(1, nodes=("n1", "n2")), pending(3, lo=2, hi=2)]), resolve)
    assert diff(plan(j1=1, j3=2), cls, frozen={1: "cooldown"}) == []


def test_shrink_drops_newest_companion_first_and_keeps_batch_host() -> None:
    parent = job(1, nodes=("n1", "n2"))
    old = job(5, nodes=("n3",), comment=companion_comment(1))
    new = job(6, nodes=("n4",), comment=companion_comment(1))
    ej = classify(snapshot([parent, old, new]), resolve).elastic[1]
    assert ej.effective_nodes == 4
    layout = shrink_layout(ej, 3)
    assert layout.cancel_companions == (6,) and layout.parent_nodes == 2
    assert layout.keep_nodes == ("n1", "n2", "n3")
    layout = shrink_layout(ej, 1)
    assert layout.cancel_companions == (6, 5) and layout.keep_nodes == ("n1",)


def test_cleanup_cancels_orphans_and_companions_pending_too_long() -> None:
    orphan = job(9, nodes=("n4",), comment=companion_comment(8))
    parent = job(1, nodes=("n1",))
    stuck = replace(pending(2, comment=companion_comment(1)), submit_time=100.0)
    cls = classify(snapshot([orphan, parent, stuck]), resolve)
    kinds = {(a.kind, a.job_id) for a in companion_cleanup(cls, now=800.0, pending_timeout_s=600)}
    assert kinds == {(ActionKind.CANCEL_COMPANION, 9), (ActionKind.CANCEL_COMPANION, 2)}
    assert [a.job_id for a in companion_cleanup(cls, now=650.0, pending_timeout_s=600)] == [9]


@given(st.text(max_size=30))
def test_companion_comment_round_trip_and_junk(text: str) -> None:
    assert companion_parent(companion_comment(123)) == 123
    parsed = companion_parent(text)
    assert parsed is None or companion_comment(parsed) in text


# --------------------------------------------------------------------------- guards

KNOBS = GuardKnobs(enforce=True, cooldown_s=100, min_dwell_s=300, time_limit_margin_s=60)


def outlook(job_id: int, remaining_at: dict[int, float], cost: float = 30.0) -> Outlook:
    work = 1000.0
    sizes = tuple(SizeEstimate(n, work / r, r) for n, r in sorted(remaining_at.items()))
    return Outlook(job_id, 0, sizes, work, cost)


def elastic(j: JobView):
    return classify(snapshot([j]), resolve).elastic[j.job_id]


def test_freeze_reasons() -> None:
    ej = elastic(job(1, nodes=("n1", "n2"), start=0.0))
    assert freeze_reason(ej, KNOBS, 100.0, last_resize_at=None, in_flight=None).startswith(
        "min dwell"
    )
    assert freeze_reason(ej, KNOBS, 400.0, last_resize_at=None, in_flight=None) is None
    assert freeze_reason(ej, KNOBS, 400.0, last_resize_at=350.0, in_flight=None).startswith(
        "cooldown"
    )
    assert freeze_reason(ej, KNOBS, 400.0, last_resize_at=None, in_flight="x") == "x"
    assert (
        freeze_reason(elastic(pending(2)), KNOBS, 0.0, last_resize_at=None, in_flight=None) is None
    )


def test_never_below_min_above_max_or_without_flag() -> None:
    ej = elastic(job(1, nodes=("n1", "n2")))
    shrink0 = Action(ActionKind.SHRINK, 1, 2, 0, extra=(("parent_nodes", "0"),))
    assert block_reason(shrink0, ej, KNOBS, 0.0) == "below min (0 < 1)"
    assert block_reason(Action(ActionKind.GROW, 1, 2, 5), ej, KNOBS, 0.0) == "above max (5 > 4)"
    assert block_reason(Action(ActionKind.GROW, 1, 2, 3), None, KNOBS, 0.0) == "not elastic"


def test_graceful_shrink_needs_an_agent_unless_hard_shrink() -> None:
    ej = elastic(job(1, nodes=("n1", "n2")))
    action = Action(ActionKind.SHRINK, 1, 2, 1, extra=(("parent_nodes", "1"),))
    assert block_reason(action, ej, KNOBS, 0.0, agent_seen=True) is None
    assert block_reason(action, ej, KNOBS, 0.0, agent_seen=False) == (
        "no agent has reported (hard_shrink off)"
    )
    hard = replace(KNOBS, hard_shrink=True)
    assert block_reason(action, ej, hard, 0.0, agent_seen=False) is None


def test_never_the_batch_host() -> None:
    j = replace(job(1, nodes=("n1", "n2", "n3")), batch_host="n3")
    action = Action(ActionKind.SHRINK, 1, 3, 2, extra=(("parent_nodes", "2"),))
    assert block_reason(action, elastic(j), KNOBS, 0.0) == "would remove the batch host"
    ok = replace(j, batch_host="n1")
    assert block_reason(action, elastic(ok), KNOBS, 0.0) is None


def test_no_shrink_that_misses_the_time_limit() -> None:
    j = replace(job(1, nodes=("n1", "n2"), start=0.0), time_limit_s=3600.0)
    action = Action(ActionKind.SHRINK, 1, 2, 1, extra=(("parent_nodes", "1"),))
    # 2600 s of TimeLimit left, margin 60, restart 30: 1000 s at 2 nodes fits, 2600 s at 1 not.
    tight = outlook(1, {1: 2600.0, 2: 1000.0})
    assert block_reason(action, elastic(j), KNOBS, 1000.0, tight) == "would miss TimeLimit"
    roomy = outlook(1, {1: 1500.0, 2: 1000.0})
    assert block_reason(action, elastic(j), KNOBS, 1000.0, roomy) is None


def test_grow_must_pay_back_its_cost() -> None:
    ej = elastic(job(1, nodes=("n1",)))
    grow = Action(ActionKind.GROW, 1, 1, 2)
    # Near-linear speed-up: worth it.  1% faster with a 600 s restart: not.
    assert block_reason(grow, ej, KNOBS, 0.0, outlook(1, {1: 2000.0, 2: 1000.0})) is None
    slow = outlook(1, {1: 2000.0, 2: 1980.0}, cost=600.0)
    assert (block_reason(grow, ej, KNOBS, 0.0, slow) or "").startswith("payback")
    off = replace(KNOBS, payback_horizon_s=0.0)
    assert block_reason(grow, ej, off, 0.0, slow) is None


def test_limit_resizes_keeps_order_and_spares_pins() -> None:
    acts = [
        Action(ActionKind.START_AT_SIZE, 1, 0, 2),
        Action(ActionKind.SHRINK, 2, 3, 2),
        Action(ActionKind.GROW, 3, 1, 2),
        Action(ActionKind.START_AT_SIZE, 4, 0, 1),
    ]
    taken, deferred = limit_resizes(acts, 1)
    assert [a.job_id for a in taken] == [1, 2, 4] and [a.job_id for a in deferred] == [3]


def test_knobs_from_config() -> None:
    from slurm_elastic.config import Config

    knobs = GuardKnobs.from_config(Config.model_validate({"mode": "enforce"}))
    assert knobs.enforce and knobs.cooldown_s == 120 and knobs.default_resize_cost_s == 30
    assert not GuardKnobs.from_config(Config()).enforce


def test_running_job_never_pinned_and_pending_never_resized() -> None:
    ej = elastic(job(1, nodes=("n1",)))
    assert block_reason(Action(ActionKind.START_AT_SIZE, 1, 0, 2), ej, KNOBS, 0.0) == "not pending"
    pj = elastic(pending(2))
    assert block_reason(Action(ActionKind.GROW, 2, 0, 2), pj, KNOBS, 0.0) == "not running"
    assert JobState.PENDING.is_active


@given(
    parent_nodes=st.integers(1, 4),
    companion_sizes=st.lists(st.integers(1, 3), max_size=3),
    data=st.data(),
)
def test_shrink_layout_properties(parent_nodes: int, companion_sizes: list[int], data) -> None:
    names = iter(f"n{i}" for i in range(1, 20))
    parent = job(1, nodes=tuple(next(names) for _ in range(parent_nodes)))
    comps = [
        job(10 + k, nodes=tuple(next(names) for _ in range(size)), comment=companion_comment(1))
        for k, size in enumerate(companion_sizes)
    ]
    ej = classify(snapshot([parent, *comps]), lambda j: ElasticSpec(1, 16)).elastic[1]
    target = data.draw(st.integers(1, ej.effective_nodes))
    layout = shrink_layout(ej, target)
    kept = [c for c in comps if c.job_id not in layout.cancel_companions]
    # Newest companions go first, and only whole companions are cancelled.
    assert list(layout.cancel_companions) == sorted(layout.cancel_companions, reverse=True)
    assert kept == comps[: len(kept)]
    if layout.parent_nodes >= 1:
        # Feasible: exactly the target, the batch host kept, the parent trimmed at its tail.
        assert len(layout.keep_nodes) == target
        assert parent.batch_host in layout.keep_nodes
        assert layout.keep_nodes[: layout.parent_nodes] == parent.nodes[: layout.parent_nodes]
    else:
        # Kept companions alone exceed the target: the guard refuses it.
        action = Action(
            ActionKind.SHRINK, 1, ej.effective_nodes, target,
            extra=(("parent_nodes", str(layout.parent_nodes)),),
        )  # fmt: skip
        assert block_reason(action, ej, KNOBS, 0.0) == "would remove the batch host"


def test_plan_targets_match_target_for_every_job() -> None:
    why = Explanation(0.0, 0.0, "test")
    decisions = (Decision(3, 1, 2, why), Decision(5, 0, 0, why), Decision(3, 1, 4, why))
    plan = Plan(decisions, "mip", SolverStatus.OPTIMAL, 0.0)
    assert plan.targets() == {3: 2, 5: 0}  # the first decision per job, as target()
    assert all(plan.target(j) == t for j, t in plan.targets().items())
    assert plan.target(7) is None and 7 not in plan.targets()


def test_the_retry_backoff_doubles_per_answer_in_a_row_up_to_its_maximum() -> None:
    knobs = GuardKnobs(retry_backoff_s=2.0, retry_backoff_max_s=20.0)
    assert [retry_wait_s(n, knobs) for n in range(7)] == [0, 2, 4, 8, 16, 20, 20]
    assert retry_wait_s(10_000, knobs) == 20.0  # no overflow however long Slurm says not now
    assert retry_wait_s(3, GuardKnobs(retry_backoff_s=0.0)) == 0.0
