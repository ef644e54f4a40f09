"""Controller.run_once over hand-written snapshots; Slurm calls are recorded, not simulated.

The live behaviour of the same paths on the real cluster is in tests/test_daemon_live.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.instructions import Ack, InstructionBoard
from slurm_elastic.actuate.journal import ActionStatus, Journal
from slurm_elastic.config import Config
from slurm_elastic.daemon.commands import explain_lines
from slurm_elastic.daemon.controller import (
    JOURNAL_PRUNE_EVERY_S,
    Allocate,
    Controller,
    CycleResult,
    keep_current_plan,
)
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.errors import SlurmRejected, SlurmTimeout, SolverError
from slurm_elastic.policy import PolicyOptions, allocate
from slurm_elastic.policy.fixed import fixed_plan
from slurm_elastic.protocol import MAX_DETAIL, AckStatus, Instruction
from slurm_elastic.terminal import safe_text
from slurm_elastic.types import (
    Action,
    ActionKind,
    ActionOutcome,
    AllocationProblem,
    ClusterSnapshot,
    Decision,
    Explanation,
    JobState,
    JobView,
    Plan,
    ProgressReport,
    SolverStatus,
)
from tests.fakes import RecordingBackend, fitting, spying, targets
from tests.test_daemon_controller_data import job, pending, snapshot
from tests.test_daemon_eligibility import enforcing

# A job that started just before the first cycle (at 1000.0): a grow's price is its restart
# alone, not the unseen work a script without the library may redo (model.outlook).
JUST_STARTED = 990.0


def make(
    snap: ClusterSnapshot,
    plan: dict[int, int] | Allocate,
    mode: str = "enforce",
    agents: tuple[int, ...] = (),
    policy: dict[str, object] | None = None,
    slurm: dict[str, object] | None = None,
    cluster: dict[str, object] | None = None,
    links: dict[int, int] | None = None,
    **guards: object,
) -> tuple[Controller, RecordingBackend, Journal, InstructionBoard]:
    """A controller over ``snap`` with a fixed plan (or the given allocator); ``agents``:
    jobs whose agent has already reported; ``policy``, ``slurm`` and ``cluster``: those
    config sections; ``links``: companion -> parent, as the journal holds the companions
    the daemon submitted (a comment alone makes no companion)."""
    backend = RecordingBackend(snap)
    config = Config.model_validate(
        {
            "mode": mode,
            "policy": policy or {},
            "slurm": slurm or {},
            "cluster": cluster or {},
            "guards": {"min_dwell_s": 0, "cooldown_s": 100, **guards},
        }
    )
    journal = Journal()
    for companion, parent in (links or {}).items():
        journal.link_companion(parent, companion, 1, None, 0.0)
    board = InstructionBoard()
    ctl = Controller(
        backend,  # type: ignore[arg-type]
        config,
        reports=ReportStore(),
        journal=journal,
        agents=board,
        allocate=plan if callable(plan) else targets(plan),
    )
    for job_id in agents:
        ctl.reports.add(ProgressReport(job_id=job_id, time=900.0, step=10, nodes=1))
    return ctl, backend, journal, board


def test_pending_job_is_pinned_to_the_planned_size() -> None:
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 3})
    result = ctl.run_once(1000.0)
    assert result.ok and result.slurm_calls == 3
    assert backend.actions() == [("pin", (7, 3))]
    (entry,) = journal.all_actions()
    assert entry.kind is ActionKind.START_AT_SIZE and entry.status is ActionStatus.APPLIED
    row = {r.job_id: r for r in result.jobs}[7]
    assert (row.min_nodes, row.max_nodes, row.target) == (1, 4, 3)


def test_a_placed_pending_job_is_pinned_in_the_partition_the_plan_chose() -> None:
    two = replace(pending(7), partition="a100,t4")

    def placing(problem: AllocationProblem, policy: str) -> Plan:
        chosen = Decision(7, 0, 3, Explanation(0.0, 0.0, "test"), partition="t4")
        return Plan((chosen,), "test-plan", SolverStatus.OPTIMAL, 0.0)

    ctl, backend, journal, _ = make(snapshot([two]), placing)
    result = ctl.run_once(1000.0)
    assert result.ok and result.to_json()["plan"]["decisions"][0]["partition"] == "t4"
    assert backend.actions() == [("pin", (7, 3, "t4"))]
    (entry,) = journal.all_actions()
    assert entry.status is ActionStatus.APPLIED
    assert entry.detail == "pinned NumNodes=3-3 Partition=t4"


def test_shadow_mode_changes_nothing() -> None:
    snap = snapshot([pending(7), job(8, nodes=("n1", "n2", "n3"))])
    ctl, backend, journal, board = make(snap, {7: 1, 8: 2}, mode="shadow", agents=(8,))
    result = ctl.run_once(1000.0)
    assert backend.actions() == []
    assert journal.all_actions() == () and board.open_jobs() == ()
    assert {r.outcome for r in result.actions} == {"shadow"}
    assert {r.job_id: r.reason for r in result.jobs}[8] == "shadow: would shrink 3->2"


def test_job_without_the_flag_is_never_touched() -> None:
    snap = snapshot([job(9, nodes=("n1", "n2"), comment=""), pending(10, comment="")])
    ctl, backend, _, _ = make(snap, {9: 1, 10: 2})
    result = ctl.run_once(1000.0)
    assert backend.actions() == [] and result.plan is not None
    assert result.plan.decisions == ()
    assert {r.reason for r in result.jobs} == {"not elastic"}


def test_failed_read_takes_no_action_and_next_cycle_proceeds() -> None:
    ctl, backend, _, _ = make(snapshot([pending(7)]), {7: 2})
    backend.fail_reads = True
    bad = ctl.run_once(1000.0)
    assert not bad.ok and "Unable to contact" in (bad.error or "")
    assert backend.actions() == []
    backend.fail_reads = False
    assert ctl.run_once(1010.0).ok
    assert backend.actions() == [("pin", (7, 2))]


def test_stale_snapshot_takes_no_action() -> None:
    ctl, backend, _, _ = make(snapshot([pending(7)], taken_at=900.0), {7: 2})
    result = ctl.run_once(1000.0)
    assert not result.ok and "stale snapshot" in (result.error or "")
    assert backend.actions() == []


def test_graceful_shrink_waits_for_the_ack() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, board = make(snap, {8: 2}, agents=(8,))
    first = ctl.run_once(1000.0)
    instruction = board.pending_for(8)
    assert instruction is not None and instruction.keep_nodes == ("n1", "n2")
    assert {r.job_id: r.reason for r in first.jobs}[8] == "shrinking: awaiting ack"
    ctl.run_once(1010.0)
    assert backend.actions() == []  # no ack yet: nothing done
    ack = Ack(instruction.id, 8, AckStatus.READY, 120, "checkpointed", 1015.0)
    assert board.ack(ack)
    ctl.run_once(1020.0)
    assert backend.actions() == [("shrink", (8, 2))]
    assert board.pending_for(8) is None
    assert [e.status for e in journal.all_actions()] == [ActionStatus.APPLIED]


def test_shrink_without_ack_is_rolled_back_unless_hard_shrink() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, _ = make(snap, {8: 2}, agents=(8,), ack_timeout_s=30)
    ctl.run_once(1000.0)
    ctl.run_once(1031.0)
    assert backend.actions() == []
    assert journal.all_actions()[0].status is ActionStatus.ROLLED_BACK

    ctl, backend, journal, _ = make(snap, {8: 2}, ack_timeout_s=30, hard_shrink=True)
    ctl.run_once(1000.0)
    ctl.run_once(1031.0)
    assert backend.actions() == [("shrink", (8, 2))]


def test_a_refused_hold_is_rolled_back_unless_hard_shrink() -> None:
    """Issue 23: hard_shrink does what its name says -- an agent whose workers did not reach
    a checkpoint in time is shrunk anyway, once, instead of rolled back and retried."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    for hard, applied in ((False, []), (True, [("shrink", (8, 2))])):
        ctl, backend, journal, board = make(snap, {8: 2}, agents=(8,), hard_shrink=hard)
        ctl.run_once(1000.0)
        instruction = board.pending_for(8)
        assert instruction is not None
        late = "workers did not reach a checkpoint in time"
        assert board.ack(Ack(instruction.id, 8, AckStatus.FAILED, 0, late, 1001.0))
        ctl.run_once(1005.0)
        assert backend.actions() == applied
        (entry,) = journal.all_actions()
        if hard:
            assert entry.status is ActionStatus.APPLIED
            assert entry.detail == f"hard shrink: agent refused: {late}; shrunk anyway"
        else:
            assert entry.status is ActionStatus.ROLLED_BACK


def test_a_ready_acks_detail_is_the_actions_own() -> None:
    """What the job said with its ack (under the signal contract: how much training may be
    redone) is in the applied action's detail, which status and explain show."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, _, journal, board = make(snap, {8: 2}, agents=(8,))
    ctl.run_once(1000.0)
    instruction = board.pending_for(8)
    assert instruction is not None
    said = "signal contract: 4 of 4 nodes stopped their workers; up to 300s of training"
    assert board.ack(Ack(instruction.id, 8, AckStatus.READY, 0, said, 1001.0))
    ctl.run_once(1002.0)
    assert journal.all_actions()[0].detail == f"agent ready at step 0: {said}"


def test_a_hostile_ack_detail_is_kept_whole_and_shown_escaped() -> None:
    """The hostile-users case for an ack's detail (the job's own words): escapes, a carriage
    return and line feeds at the longest the API accepts.  It is the applied action's detail
    verbatim, touches only the acking job, and status and explain show it on one line with
    every control character escaped."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4")), job(9, nodes=("n5",))])
    ctl, backend, journal, board = make(snap, {8: 2, 9: 1}, agents=(8,))
    ctl.run_once(1000.0)
    instruction = board.pending_for(8)
    assert instruction is not None
    said = "ok\n\x1b]0;root@head\x07\rjob 9: shrunk \u202e\x9b2J"
    said += "y" * (MAX_DETAIL - len(said))
    assert board.ack(Ack(instruction.id, 8, AckStatus.READY, 0, said, 1001.0))
    ctl.run_once(1002.0)
    assert backend.actions() == [("shrink", (8, 2))]
    (entry,) = journal.all_actions()
    assert entry.job_id == 8 and entry.detail == f"agent ready at step 0: {said}"
    action = {
        "job_id": 8,
        "kind": "shrink",
        "from_nodes": 4,
        "to_nodes": 2,
        "outcome": "applied",
        "detail": entry.detail,
    }
    lines = explain_lines({"job": None, "decision": None, "actions": [action], "plan": "-"})
    shown = [safe_text(line) for line in lines if "action:" in line]
    assert len(shown) == 1 and shown[0].isprintable()
    assert "\\x1b]0;root@head\\x07\\x0djob 9" in shown[0] and "\\u202e\\x9b2J" in shown[0]


def test_no_graceful_shrink_for_a_job_whose_agent_never_reported() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, board = make(snap, {8: 2})
    result = ctl.run_once(1000.0)
    assert board.pending_for(8) is None and journal.all_actions() == ()
    assert backend.actions() == []
    reason = {r.job_id: r.reason for r in result.jobs}[8]
    assert reason == "blocked: no agent has reported (hard_shrink off)"


def test_no_grow_into_the_nodes_of_a_shrink_that_was_blocked() -> None:
    """The hostile-reports case: the plan takes a node from job 8 (its owner's agent has
    not reported, so its shrink is blocked) for job 9.  The grow must not go ahead on a
    node that is not coming: the plan is made again with job 8 held, and 9 keeps 1."""
    snap = snapshot(
        [
            job(8, nodes=("n1", "n2"), hi=2, user="alice"),
            job(9, nodes=("n3",), hi=3, user="bob"),
            job(10, nodes=("n4",), comment=""),  # rigid
        ]
    )
    seen: list[AllocationProblem] = []
    ctl, backend, journal, board = make(snap, fitting({8: 1, 9: 2}, seen), agents=(9,))
    result = ctl.run_once(1000.0)
    assert backend.actions() == [] and journal.all_actions() == () and board.pending_for(8) is None
    assert [sorted(d.job_id for d in p.elastic if d.frozen) for p in seen] == [[], [8]]
    outcomes = [(r.action.job_id, r.action.kind, r.outcome) for r in result.actions]
    assert outcomes == [(8, ActionKind.SHRINK, ActionOutcome.BLOCKED)]
    reasons = {r.job_id: r.reason for r in result.jobs}
    assert reasons[8] == "blocked: no agent has reported (hard_shrink off)"
    assert result.plan is not None
    assert {d.job_id: d.target_nodes for d in result.plan.decisions} == {8: 2, 9: 1}

    # With the agent heard from, the same plan shrinks 8 first and grows 9 into its node.
    ctl, backend, journal, board = make(snap, fitting({8: 1, 9: 2}, []), agents=(8, 9))
    ctl.run_once(1000.0)
    assert board.pending_for(8) is not None
    assert [verb for verb, _ in backend.actions()] == ["submit"]


def test_a_plan_that_keeps_needing_blocked_shrinks_defers_its_grows() -> None:
    """A policy that, plan after plan, finds the grow's node in another job whose shrink
    is blocked: after ``MAX_PLANS_PER_CYCLE`` plans the grow is deferred, never applied."""
    snap = snapshot(
        [job(j, nodes=(f"n{j}", f"m{j}"), hi=2) for j in (1, 2, 3)] + [job(9, nodes=("n4",))]
    )

    def stubborn(problem: AllocationProblem, policy: str) -> Plan:
        movable = sorted(d.job_id for d in problem.elastic if not d.frozen and d.job_id != 9)
        return fixed_plan(problem, {movable[0]: 1, 9: 2} if movable else {}, solver="test")

    ctl, backend, _, _ = make(snap, stubborn, agents=(9,))
    result = ctl.run_once(1000.0)
    assert backend.actions() == []
    outcomes = [(r.action.job_id, r.action.kind, r.outcome, r.detail) for r in result.actions]
    blocked = (ActionKind.SHRINK, ActionOutcome.BLOCKED, "no agent has reported (hard_shrink off)")
    assert outcomes == [
        (1, *blocked),
        (2, *blocked),
        (3, *blocked),
        (9, ActionKind.GROW, ActionOutcome.DEFERRED, "needs nodes from a blocked shrink"),
    ]


REFUSED_SHRINK = "Requested operation not supported on this system for job 8"


def test_a_shrink_slurm_refuses_is_kept_as_a_fact_not_retried() -> None:
    """Issue 20: Slurm refused to shrink a running job (from 23.11 a job with
    ``--distribution=arbitrary``, which 24.11's squeue does not show).  The refusal is the
    journal's ``refused`` row with Slurm's message; the job's REASON says it; no shrink is
    sent again while the job runs that allocation, and a requeued job may shrink again."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, _ = make(snap, {8: 2}, ack_timeout_s=5, hard_shrink=True, cooldown_s=0)
    backend.refuse["shrink"] = REFUSED_SHRINK
    backend.fresh = True  # read at each cycle's time
    ctl.run_once(1000.0)
    refused = ctl.run_once(1006.0)  # the ack timeout: the hard shrink is sent
    assert [(r.action.kind, r.outcome, r.detail) for r in refused.actions] == [
        (ActionKind.SHRINK, ActionOutcome.REFUSED, REFUSED_SHRINK)
    ]
    (row,) = journal.all_actions()
    assert (row.status, row.detail) == (ActionStatus.REFUSED, REFUSED_SHRINK)
    for now in (1100.0, 1200.0):
        later = ctl.run_once(now)
    assert backend.actions() == [("shrink", (8, 2))]  # once
    reason = {r.job_id: r.reason for r in later.jobs}[8]
    assert reason == (
        f"blocked: shrink refused by Slurm: {REFUSED_SHRINK} (barred 3406s more, or until "
        "the job changes)"
    )
    # Requeued and started again: a new allocation, asked afresh.
    backend.snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"), start=1300.0)])
    ctl.run_once(1310.0)
    ctl.run_once(1316.0)
    assert backend.actions() == [("shrink", (8, 2))] * 2


def test_a_shrink_slurm_says_to_try_again_is_retried_not_barred() -> None:
    """The shrink's ``scontrol update`` met "try again later" (after the ack): a ``retry``
    row, no bar on the job's smaller sizes beyond the backoff, and the next shrink after
    it goes through."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, _ = make(
        snap, {8: 2}, ack_timeout_s=5, hard_shrink=True, cooldown_s=0, retry_backoff_s=30
    )
    backend.fresh = True
    backend.refuse["shrink"] = "Job can not be altered now, try again later for job 8"
    ctl.run_once(1000.0)
    retried = ctl.run_once(1006.0)  # the ack timeout: the hard shrink is sent
    assert [r.outcome for r in retried.actions] == [ActionOutcome.RETRY]
    reason = {r.job_id: r.reason for r in ctl.run_once(1010.0).jobs}[8]
    assert reason.startswith("blocked: shrink to retry in 26s: Slurm said not now"), reason
    del backend.refuse["shrink"]
    ctl.run_once(1036.0)  # the backoff has run: instructed again
    ctl.run_once(1042.0)  # and applied at the ack timeout
    assert backend.actions() == [("shrink", (8, 2))] * 2
    statuses = [e.status for e in journal.all_actions()]
    assert statuses == [ActionStatus.RETRY, ActionStatus.APPLIED]


def test_a_refused_shrink_leaves_the_policy_only_sizes_at_or_above_the_jobs() -> None:
    """The plan must not count on nodes the refused job will not give: it is offered only
    its own size and above, and it keeps the REASON when the plan leaves it alone."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3"), lo=1, hi=4)])
    seen: list[tuple[int, ...]] = []

    def keep(problem: AllocationProblem, _name: str) -> Plan:
        seen.append(problem.elastic[0].allowed_sizes)
        return keep_current_plan(problem, "test")

    ctl, _backend, journal, _ = make(snap, keep, cooldown_s=0)
    ctl.run_once(1000.0)
    shrink = Action(ActionKind.SHRINK, 8, 3, 1, reason="test")
    journal.mark(journal.record_intent(shrink, 1000.0), ActionStatus.REFUSED, 1001.0,
                 detail=REFUSED_SHRINK)  # fmt: skip
    result = ctl.run_once(1010.0)
    assert seen == [(1, 2, 3, 4), (3, 4)]
    assert {r.job_id: r.reason for r in result.jobs}[8] == (
        f"shrink refused by Slurm: {REFUSED_SHRINK} (barred 3591s more, or until the job changes)"
    )


def test_a_job_under_slurms_step_manager_is_never_shrunk_and_says_why() -> None:
    """Issue 20: Slurm accepts the shrink of a job whose steps its step manager runs, and
    leaves the steps running on the removed nodes (up to 26.05): known from the job's
    flags before acting, so the policy is offered no smaller size and no shrink is sent."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"), stepmgr=True)])
    seen: list[tuple[int, ...]] = []

    def shrink_it(problem: AllocationProblem, name: str) -> Plan:
        seen.append(problem.elastic[0].allowed_sizes)
        return targets({8: 2})(problem, name)

    ctl, backend, journal, _ = make(snap, shrink_it, ack_timeout_s=5, hard_shrink=True)
    ctl.run_once(1000.0)
    result = ctl.run_once(1006.0)
    assert backend.actions() == [] and journal.all_actions() == ()
    assert seen[-1] == (4,)
    assert {r.job_id: r.reason for r in result.jobs}[8].startswith(
        "blocked: shrink barred: the job's steps run under Slurm's step manager"
    )


def test_a_pending_job_under_the_step_manager_starts_at_its_smallest_size() -> None:
    """It will keep whatever it starts with: started above its minimum it would hold nodes no
    reclaim can take back, so the policy is offered only its smallest size (more comes as
    companion jobs, which a reclaim can cancel)."""
    snap = snapshot([pending(7, lo=2, hi=4, stepmgr=True), pending(8, lo=2, hi=4)])
    seen: dict[int, tuple[int, ...]] = {}

    def record(problem: AllocationProblem, name: str) -> Plan:
        seen.update((e.job_id, e.allowed_sizes) for e in problem.elastic)
        return keep_current_plan(problem, "test")

    ctl, _backend, _journal, _ = make(snap, record)
    ctl.run_once(1000.0)
    assert seen == {7: (2,), 8: (2, 3, 4)}


def test_a_start_at_size_slurm_refuses_leaves_the_job_to_slurm() -> None:
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 2})
    backend.refuse["pin"] = "Requested node configuration is not available"
    first = ctl.run_once(1000.0)
    assert [r.outcome for r in first.actions] == [ActionOutcome.REFUSED]
    second = ctl.run_once(1010.0)
    assert backend.actions() == [("pin", (7, 2))]  # not asked again
    assert {r.job_id: r.reason for r in second.jobs}[7] == (
        "start at size refused by Slurm: Requested node configuration is not available "
        "(barred 3590s more, or until the job changes)"
    )
    assert [e.status for e in journal.all_actions()] == [ActionStatus.REFUSED]


# Slurm 22.05's answer right after a slurmctld restart (issue 44; scontrol's last line).
DB_INDEX = (
    "Job update not available right now, the DB index is being set, try again in a bit for job 7"
)


def test_a_pin_slurm_says_to_try_again_is_retried_with_backoff_never_barred() -> None:
    """Issue 44: one "try again in a bit" barred a pending job's pin for as long as it
    stayed pending.  Now it is a ``retry`` row: the pin waits out retry_backoff_s (doubled
    per answer in a row, at most retry_backoff_max_s) and is sent again; nothing freezes
    the job beyond that, and once Slurm accepts it the job is pinned."""
    ctl, backend, journal, _ = make(
        snapshot([pending(7)]), {7: 2}, retry_backoff_s=5, retry_backoff_max_s=8
    )
    backend.fresh = True
    backend.refuse["pin"] = DB_INDEX
    first = ctl.run_once(1000.0)
    assert [(r.outcome, r.detail) for r in first.actions] == [(ActionOutcome.RETRY, DB_INDEX)]
    waiting = ctl.run_once(1004.0)  # inside the 5 s backoff: not sent
    assert backend.actions() == [("pin", (7, 2))]
    assert {r.job_id: r.reason for r in waiting.jobs}[7] == (
        f"start at size to retry in 1s: Slurm said not now (1 in a row): {DB_INDEX}"
    )
    ctl.run_once(1005.0)  # the backoff has run: asked again, and again "not now"
    assert backend.actions() == [("pin", (7, 2))] * 2
    ctl.run_once(1012.0)  # 2 in a row: 10 s, capped at 8 s, so not yet at 1012
    assert len(backend.actions()) == 2
    del backend.refuse["pin"]  # slurmdbd has answered
    done = ctl.run_once(1013.0)
    assert [r.outcome for r in done.actions] == [ActionOutcome.APPLIED]
    assert backend.actions() == [("pin", (7, 2))] * 3
    statuses = [e.status for e in journal.all_actions()]
    assert statuses == [ActionStatus.RETRY, ActionStatus.RETRY, ActionStatus.APPLIED]
    assert journal.retries() == ()  # the run of retries ended with the applied pin


def test_an_unreachable_slurm_at_the_pin_is_a_retry_too() -> None:
    """slurmctld gone between the cycle's read and its action: nothing was applied, so as
    for "try again": a retry after the backoff, never a bar."""
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 2}, retry_backoff_s=5)
    backend.fresh = True
    backend.refuse["pin"] = "Unable to contact slurm controller (connect failure)"
    ctl.run_once(1000.0)
    assert journal.all_actions()[0].status is ActionStatus.RETRY
    del backend.refuse["pin"]
    ctl.run_once(1006.0)
    assert backend.actions() == [("pin", (7, 2))] * 2


def test_a_refusal_bars_the_pin_until_refusal_hold_s_then_it_is_asked_once_more() -> None:
    """A refusal Slurm gives as final still ends: a misread answer never bars a job for
    good.  After refusal_hold_s the pin is sent once more (and refused, barred again)."""
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 2}, refusal_hold_s=600)
    backend.fresh = True
    backend.refuse["pin"] = "Requested node configuration is not available"
    ctl.run_once(1000.0)
    late = ctl.run_once(1599.0)
    assert backend.actions() == [("pin", (7, 2))]
    assert {r.job_id: r.reason for r in late.jobs}[7].endswith(
        "(barred 1s more, or until the job changes)"
    )
    ctl.run_once(1600.0)
    assert backend.actions() == [("pin", (7, 2))] * 2
    ctl.run_once(1700.0)
    assert len(backend.actions()) == 2  # refused again at 1600: barred from there
    assert [e.status for e in journal.all_actions()] == [ActionStatus.REFUSED] * 2


@pytest.mark.parametrize(
    "change",
    [
        {"partition": "batch,gpu"},
        {"time_limit_s": 3600.0},
        {"qos": "high"},
        {"account": "other"},
        {"min_nodes": 2, "node_count": 2},
        {"restart_count": 1},
    ],
)
def test_a_refusal_ends_when_the_job_changes(change: dict[str, object]) -> None:
    """What the owner or an admin changes in the job (its partitions, limits, QOS, account,
    node range, a requeue) may change Slurm's answer: the pin is asked again at once."""
    view = pending(7)
    ctl, backend, _journal, _ = make(snapshot([view]), {7: 2})
    backend.fresh = True
    backend.refuse["pin"] = "Requested node configuration is not available"
    ctl.run_once(1000.0)
    ctl.run_once(1010.0)
    assert backend.actions() == [("pin", (7, 2))]
    backend.snap = snapshot([replace(view, **change)])  # type: ignore[arg-type]
    ctl.run_once(1020.0)
    assert backend.actions() == [("pin", (7, 2))] * 2


def test_a_grow_slurm_says_to_try_again_is_no_companion_failure() -> None:
    """sbatch answered "try again": nothing was submitted, so the grow is retried after the
    backoff and never counts towards companion_max_failures (which gives up growing)."""
    snap = snapshot([job(8, nodes=("n1", "n2"))])
    ctl, backend, journal, _ = make(
        snap, {8: 3}, cooldown_s=0, payback_horizon_s=0, retry_backoff_s=5,
        retry_backoff_max_s=5,
    )  # fmt: skip
    backend.fresh = True
    backend.refuse["submit"] = "Batch job submission failed: Unable to create job record, try again"
    for now in (1000.0, 1006.0, 1012.0, 1018.0):
        ctl.run_once(now)
    assert [e.status for e in journal.all_actions()] == [ActionStatus.RETRY] * 4
    assert journal.grow_failures(8) == (0, None, "")
    del backend.refuse["submit"]
    grown = ctl.run_once(1024.0)
    assert [r.outcome for r in grown.actions] == [ActionOutcome.APPLIED]


# A requeued job (preempted while at 2 nodes of its own and a pending grow to 3): Slurm
# keeps its node request across the requeue, so NumNodes reads 2-2.
REQUEUED = pending(7, lo=2, hi=2, comment="elastic:min=1,max=4", restart_count=1)
AT_3 = replace(REQUEUED, min_nodes=3, max_nodes=3)  # the same, pinned to 3


# "pin 2, grow 3": what the journal holds of the policy's actions on job 7.
HISTORY = {
    "pin": (ActionKind.START_AT_SIZE, ActionStatus.APPLIED),
    "grow": (ActionKind.GROW, ActionStatus.APPLIED),
    "failed": (ActionKind.GROW, ActionStatus.FAILED),
}


def planned(journal: Journal, *steps: tuple[ActionKind, ActionStatus, int]) -> None:
    """The journal's record of what the policy did to job 7 before it was requeued."""
    for at, (kind, status, to_nodes) in enumerate(steps):
        action_id = journal.record_intent(Action(kind, 7, 0, to_nodes), float(at))
        journal.mark(action_id, status, float(at))


@pytest.mark.parametrize(
    ("view", "target", "history", "expected"),
    [
        # Not started now: pinned to the size last planned for it (its grow to 3).
        (REQUEUED, 0, "pin 2, grow 3", [("pin", (7, 3))]),
        # A grow whose companion failed was not the job's size: the pin before it was.
        (AT_3, 0, "pin 2, failed 4", [("pin", (7, 2))]),
        (REQUEUED, 4, "pin 2, grow 3", [("pin", (7, 4))]),  # started now: the plan's size
        (REQUEUED, 0, "", []),  # the daemon never sized it: Slurm's request stands
        (replace(REQUEUED, restart_count=0), 0, "pin 2, grow 3", []),  # not requeued
        (AT_3, 0, "pin 2, grow 3", []),  # already pinned there
        # Slurm 22.05's JSON shows no maximum for a requeued job: its minimum says it.
        (replace(AT_3, max_nodes=None), 0, "pin 2, grow 3", []),
    ],
)
def test_a_requeued_job_comes_back_at_the_size_the_policy_last_chose(
    view: JobView, target: int, history: str, expected: list[tuple[str, object]]
) -> None:
    """Issue 20, item 4: Slurm starts a requeued job the moment nodes free, at the size
    pinned for its parent's own nodes in its last run, before a cycle can pin another.  So
    while the plan starts it nowhere, it is pinned to the size the policy last chose."""
    ctl, backend, journal, _ = make(snapshot([view]), {7: target})
    steps = [step.split() for step in history.split(", ") if step]
    planned(journal, *(HISTORY[verb] + (int(n),) for verb, n in steps))
    result = ctl.run_once(1000.0)
    assert backend.actions() == expected
    if expected and target == 0:
        (record,) = result.actions
        assert record.action.reason == "requeued: last planned size", record


def test_requeuing_ones_own_job_moves_no_other_users_job() -> None:
    """The hostile-users case: bob can requeue his own job (``scontrol requeue``) as often as
    he likes.  What the daemon then pins comes from the journal's record of *that* job:
    alice's requeued job goes back to the size planned for her, bob's (never sized by the
    daemon) keeps the request Slurm has, and nothing of bob's reaches alice's job."""
    alice = replace(REQUEUED, user="se-alice")
    bob = replace(REQUEUED, job_id=8, user="se-bob", restart_count=7)
    ctl, backend, journal, _ = make(snapshot([alice, bob]), {7: 0, 8: 0})
    planned(journal, HISTORY["grow"] + (3,))  # job 7's grow, from before its requeue
    ctl.run_once(1000.0)
    assert backend.actions() == [("pin", (7, 3))]


def test_a_failure_that_is_no_answer_of_slurms_stays_a_failure_and_is_retried() -> None:
    """Only Slurm's own refusal is a fact about the job: a command that timed out (Slurm
    gave no answer), like a companion's sbatch refused (the grow backoff's business), stays
    ``failed``, and the pin is proposed again the next cycle (no retry backoff either)."""
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 2})
    backend.fail_reads = False
    calls = []

    def timed_out(
        job_id: int, nodes: int, partition: str | None = None, submitted: object = ()
    ) -> None:
        calls.append(job_id)
        raise SlurmTimeout("scontrol update did not finish within 5s")

    backend.pin_pending_size = timed_out  # type: ignore[method-assign]
    ctl.run_once(1000.0)
    ctl.run_once(1010.0)
    assert calls == [7, 7]
    assert [e.status for e in journal.all_actions()] == [ActionStatus.FAILED] * 2


def test_cooldown_freezes_a_job_after_a_resize() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, _, _ = make(snap, {8: 2}, ack_timeout_s=5, hard_shrink=True)
    ctl.run_once(1000.0)
    ctl.run_once(1006.0)  # hard shrink applied at 1006
    backend.snap = snapshot([job(8, nodes=("n1", "n2"), start=0.0)])
    result = ctl.run_once(1050.0)
    assert {r.job_id: r.reason for r in result.jobs}[8].startswith("cooldown")
    assert len(backend.actions()) == 1


def test_a_restart_keeps_the_journal_of_jobs_slurm_still_has_whatever_the_look_back() -> None:
    """Found by the chaos run (scripts/chaos.py): a restart prunes closed rows older than
    ``slurm.sacct_lookback_s``; at 0 (the demo's "no earlier history") that was every row, so
    a restarted daemon forgot the cooldown, dwell and refusals of jobs still running.  Rows
    of a job Slurm still has are kept; those of jobs gone are pruned as before."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, _ = make(snap, {8: 2}, ack_timeout_s=5, hard_shrink=True)
    ctl.run_once(1000.0)
    ctl.run_once(1006.0)  # hard shrink applied at 1006
    gone = journal.record_intent(Action(ActionKind.START_AT_SIZE, 99, 0, 2), 1001.0)
    journal.mark(gone, ActionStatus.APPLIED, 1002.0)  # a job that has ended since
    backend.snap = snapshot([job(8, nodes=("n1", "n2"), start=0.0)])
    config = Config.model_validate(
        {
            "mode": "enforce",
            "guards": {"min_dwell_s": 0, "cooldown_s": 100},
            "slurm": {"sacct_lookback_s": 0},
        }
    )
    restarted = Controller(
        backend,  # type: ignore[arg-type]
        config,
        reports=ReportStore(),
        journal=journal,
        agents=InstructionBoard(),
        allocate=targets({8: 4}),
    )
    result = restarted.run_once(1050.0)
    assert {r.job_id: r.reason for r in result.jobs}[8].startswith("cooldown")
    assert len(backend.actions()) == 1  # the shrink; no grow 44 s after it
    assert {e.job_id for e in journal.all_actions()} == {8}


def test_a_daemon_that_runs_for_months_prunes_its_journal_every_hour() -> None:
    """Not only at a restart: the first cycle prunes, then one cycle an hour
    (``JOURNAL_PRUNE_EVERY_S``), so the file stays bounded.  The closed rows of a job gone
    and older than the look-back go; the running job's rows stay."""
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, _ = make(snap, {8: 4}, slurm={"sacct_lookback_s": 60})
    backend.fresh = True  # read at each cycle's time
    ctl.run_once(1000.0)
    kept = journal.record_intent(Action(ActionKind.SHRINK, 8, 4, 2), 1001.0)
    gone = journal.record_intent(Action(ActionKind.START_AT_SIZE, 99, 0, 2), 1001.0)
    for row in (kept, gone):
        journal.mark(row, ActionStatus.APPLIED, 1002.0)
    ctl.run_once(1000.0 + JOURNAL_PRUNE_EVERY_S - 1)
    assert {e.job_id for e in journal.all_actions()} == {8, 99}
    ctl.run_once(1000.0 + JOURNAL_PRUNE_EVERY_S)
    assert {e.job_id for e in journal.all_actions()} == {8}


def test_grow_submits_a_companion_as_the_owner() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2"), start=JUST_STARTED)])
    ctl, backend, journal, _ = make(snap, {8: 4})
    result = ctl.run_once(1000.0)
    ((verb, kw),) = backend.actions()
    assert verb == "submit"
    assert isinstance(kw, dict)
    assert kw["user"] == "root" and kw["nodes"] == 2 and kw["partition"] == "batch"
    assert kw["comment"] == "slurm-elastic:companion-of=8"
    assert journal.companions()[0].parent_id == 8
    assert {r.job_id: r.reason for r in result.jobs}[8] == "grow: companion 501 pending"


def test_orphan_companion_is_cancelled() -> None:
    orphan = job(31, nodes=("n3",), comment="slurm-elastic:companion-of=30")
    ctl, backend, _, _ = make(snapshot([orphan]), {}, links={31: 30})
    ctl.run_once(1000.0)
    assert backend.actions() == [("cancel", 31)]


@pytest.mark.parametrize(
    ("parent_state", "cancelled_at"),
    [(JobState.COMPLETED, 1031.0), (JobState.FAILED, 1000.0), (JobState.CANCELLED, 1000.0)],
)
def test_a_companion_whose_parent_completed_may_end_by_itself(
    parent_state: JobState, cancelled_at: float
) -> None:
    """The parent finished training at 995: its companion's workers are done too and its
    launcher ends it within seconds, so the daemon leaves it grow.orphan_grace_s (30 s)
    instead of cancelling it (which would put Slurm's "CANCELLED" error lines in its
    output).  A parent that failed or was cancelled leaves nothing to wait for."""
    running = job(30, nodes=("n1",))
    orphan = job(31, nodes=("n3",), comment="slurm-elastic:companion-of=30")
    ctl, backend, _, _ = make(snapshot([running, orphan], taken_at=990.0), {}, links={31: 30})
    ctl.run_once(990.0)  # start-up (which cancels orphans at once) while the parent runs
    ended = replace(running, state=parent_state, end_time=995.0)
    for now in (1000.0, 1020.0, 1031.0):
        backend.snap = snapshot([ended, orphan], taken_at=now)
        ctl.run_once(now)
        assert (("cancel", 31) in backend.actions()) == (now >= cancelled_at), now


def test_a_forged_companion_comment_makes_nothing_a_companion() -> None:
    """Bob marks his own job as a companion of alice's running job.  The daemon's
    companions are the ones its journal links (it submitted them): bob's job is never
    counted for alice, and when her job completes it is not an orphan to cancel either.
    Nobody's job is acted on."""
    running = job(30, nodes=("n1",), user="se-alice", start=JUST_STARTED)
    forged = job(31, nodes=("n3",), comment="slurm-elastic:companion-of=30", user="se-bob")
    carol = job(40, nodes=("n2",), user="se-carol", start=JUST_STARTED)
    ctl, backend, _, _ = make(snapshot([running, forged, carol], taken_at=990.0), {})
    first = ctl.run_once(990.0)
    assert {r.job_id: r.nodes for r in first.jobs}[30] == 1  # n3 is not alice's
    ended = replace(running, state=JobState.COMPLETED, end_time=995.0)
    for now in (1000.0, 1031.0):
        backend.snap = snapshot([ended, forged, carol], taken_at=now)
        ctl.run_once(now)
    assert backend.actions() == []


@pytest.mark.parametrize(
    "change",
    [
        {"comment": ""},
        {"comment": "slurm-elastic:companion-of=99"},
        {"name": "mine now"},
        {"work_dir": "/home/bob/elsewhere"},
    ],
)
def test_a_companion_its_owner_changed_is_still_the_same_companion(
    change: dict[str, object],
) -> None:
    """Issue 38, class 3: bob changed his companion's comment so that it no longer named
    his job, and the daemon stopped counting the nodes as a loan: alice's rigid job waited
    with no reclaim.  The journal's link decides: the loan is still reclaimed."""
    snap = _borrower_and_rigid()
    jobs = [replace(j, **change) if j.job_id in (81, 82) else j for j in snap.jobs]  # type: ignore[arg-type]
    ctl, _backend, _journal, board = make(
        replace(snap, jobs=tuple(jobs)), _real_policy, ack_timeout_s=30, links=BORROWED
    )
    first = ctl.run_once(1000.0)
    instruction = reclaim_started(first, board)
    assert instruction.release == (82,)


def test_at_most_max_resizes_per_cycle() -> None:
    jobs = [job(i, nodes=(f"n{i}",), hi=2, start=JUST_STARTED) for i in (1, 2, 3)]
    ctl, backend, _, _ = make(snapshot(jobs), {1: 2, 2: 2, 3: 2}, max_resizes_per_cycle=2)
    result = ctl.run_once(1000.0)
    assert [c[0] for c in backend.actions()] == ["submit", "submit"]
    assert [r.outcome for r in result.actions].count("deferred") == 1


def test_allocation_failure_falls_back_to_no_change() -> None:
    def broken(problem: AllocationProblem, policy: str) -> Plan:
        raise SolverError("solver exploded")

    ctl, backend, _, _ = make(snapshot([pending(7)]), {})
    ctl._allocate = broken
    result = ctl.run_once(1000.0)
    assert result.ok and result.plan is not None
    assert result.plan.status is SolverStatus.NO_CHANGE and backend.actions() == []


def test_keep_current_plan_keeps_every_size() -> None:
    ctl, _, _, _ = make(snapshot([job(8, nodes=("n1", "n2")), pending(7)]), {})
    ctl._allocate = lambda problem, policy: keep_current_plan(problem, "because")
    result = ctl.run_once(1000.0)
    assert result.plan is not None and result.plan.note == "because"
    assert {d.job_id: d.target_nodes for d in result.plan.decisions} == {7: 0, 8: 2}
    assert result.actions == ()


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.COMPLETING])
def test_companion_of_a_parent_not_running_is_an_orphan(state: JobState) -> None:
    parent = replace(job(30, nodes=("n1",)), state=state)
    comp = job(31, nodes=("n3",), comment="slurm-elastic:companion-of=30")
    ctl, backend, _, _ = make(snapshot([parent, comp]), {}, links={31: 30})
    ctl.run_once(1000.0)
    assert ("cancel", 31) in backend.actions()


def test_spec_survives_the_pin_and_is_forgotten_when_the_job_ends() -> None:
    ctl, backend, journal, _ = make(snapshot([pending(7)]), {7: 2})
    ctl.run_once(1000.0)
    assert backend.actions() == [("pin", (7, 2))]
    # Slurm now reports the pinned range 2-2; the marker has no min/max of its own.
    backend.snap = snapshot([pending(7, lo=2, hi=2)])
    result = ctl.run_once(1010.0)
    row = {r.job_id: r for r in result.jobs}[7]
    assert (row.min_nodes, row.max_nodes) == (1, 4)
    backend.snap = snapshot([])
    ctl.run_once(1020.0)
    assert journal.known_specs() == {}


def test_switch_to_shadow_abandons_a_waiting_shrink() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2", "n3", "n4"))])
    ctl, backend, journal, board = make(snap, {8: 2}, agents=(8,))
    ctl.run_once(1000.0)
    assert board.pending_for(8) is not None
    ctl.reconfigure(ctl.config.model_copy(update={"mode": "shadow"}))
    result = ctl.run_once(1010.0)
    assert board.pending_for(8) is None and backend.actions() == []
    assert journal.all_actions()[0].status is ActionStatus.ROLLED_BACK
    assert {r.job_id: r.reason for r in result.jobs}[8] == "shrink 4->2 rolled_back: mode is shadow"


def test_history_is_read_at_its_cadence_and_retried_later_after_a_failure() -> None:
    ctl, backend, _, _ = make(snapshot([]), {})
    backend.fresh = True
    reads = lambda: [c for c in backend.calls if c[0] == "read_history"]  # noqa: E731
    # A good history read brings the node limits along: 3 calls (sacct, sacctmgr twice).
    assert ctl.run_once(1000.0).history_calls == 3
    assert reads()[0][1] == 1000.0 - ctl.config.slurm.sacct_lookback_s
    assert ctl.run_once(1010.0).history_calls == 0
    assert ctl.run_once(1300.0).history_calls == 3
    assert reads()[1][1] == 1000.0 - 300.0  # incremental, overlapping one cadence
    backend.fail_history = True
    assert ctl.run_once(1600.0).history_calls == 1
    assert ctl.run_once(1610.0).history_calls == 0  # back-off, not every cycle
    backend.fail_history = False
    assert ctl.run_once(1661.0).history_calls == 3
    assert reads()[-1][1] == 1000.0
    assert [c[0] for c in backend.calls].count("read_qos") == 3
    assert [c[0] for c in backend.calls].count("read_assoc") == 3


def test_refused_grow_is_recorded_failed_and_cools_down() -> None:
    snap = snapshot([job(8, nodes=("n1", "n2"), start=JUST_STARTED)])
    ctl, backend, journal, _ = make(snap, {8: 4})

    def refuse(script: str, **kw: object) -> int:
        raise SlurmRejected("sbatch refused", slurm_message="Invalid account or account/partition")

    backend.submit = refuse  # type: ignore[method-assign]
    result = ctl.run_once(1000.0)
    (rec,) = result.actions
    assert rec.outcome == "failed" and "sbatch refused" in rec.detail
    assert journal.all_actions()[0].status is ActionStatus.FAILED
    assert journal.companions() == ()
    again = ctl.run_once(1010.0)  # cooldown_s=100 in these tests: not retried at once
    assert again.actions == () and {r.job_id: r.reason for r in again.jobs}[8].startswith(
        "cooldown"
    )


# --------------------------------------------------------------------------- bounded work


def test_hostile_ranges_are_capped_at_the_partitions_every_cycle() -> None:
    """Markers that reach the daemon unchecked (``scontrol update Comment=``, no plugin):
    max=999999, an incomplete marker with -N1-999999, and a min beyond the cluster.  Each
    job's sizes, outlook and status row are bounded by the 4 nodes; the third is left alone."""
    jobs = [
        pending(20, comment="elastic:min=1,max=999999", user="se-bob"),
        pending(21, lo=1, hi=999_999, comment="elastic", user="se-bob"),
        pending(22, comment="elastic:min=5,max=999999", user="se-bob"),
        pending(23, lo=1, hi=2, comment="elastic", user="se-alice"),
    ]
    seen: list[AllocationProblem] = []
    ctl, _ = enforcing(snapshot(jobs), allocate=spying(seen))
    result = ctl.run_once(1000.0)
    assert result.ok
    (problem,) = seen
    sizes = {d.job_id: d.allowed_sizes for d in problem.elastic}
    assert sizes == {20: (1, 2, 3, 4), 21: (1, 2, 3, 4), 23: (1, 2)}
    assert all(len(d.outlook.sizes) <= 4 for d in problem.elastic)
    rows = {r.job_id: r for r in result.jobs}
    assert (rows[20].min_nodes, rows[20].max_nodes) == (1, 4)
    assert rows[22].reason == "out of reach: min=5 is more than the 4 nodes its partitions can give"
    assert ctl.journal.known_specs()[21].max_nodes == 4


# --------------------------------------------------------------------------- failed companions


def test_a_companion_failing_at_once_is_retried_with_backoff_then_given_up() -> None:
    """sbatch accepts the companion, which fails within a second, three times: the grows
    wait 60 s, then 120 s, and after the third failure the job is no longer grown; the
    status REASON says which and why."""
    parent = job(8, nodes=("n1", "n2"), start=JUST_STARTED)
    ctl, backend, journal, _ = make(snapshot([parent]), {8: 3}, cooldown_s=0)
    backend.fresh = True
    now = 1000.0
    for attempt in range(3):
        ctl.run_once(now)
        assert backend.actions()[-1][0] == "submit", attempt
        comp_id = backend.next_job_id
        failed = replace(
            job(comp_id, nodes=("n3",), comment=companion_comment(8)),
            state=JobState.FAILED,
            start_time=now + 1,
            end_time=now + 2,
        )
        backend.snap = snapshot([parent, failed])  # squeue shows the ended companion
        result = ctl.run_once(now + 5)
        assert {r.job_id: r.reason for r in result.jobs}[8] == (
            f"grow 2->3 failed: companion {comp_id} FAILED after 1s"
        )
        backend.snap = snapshot([parent])  # then it leaves the queue
        wait = 60.0 * 2**attempt
        blocked = ctl.run_once(now + 5 + wait - 1)
        reason = {r.job_id: r.reason for r in blocked.jobs}[8]
        if attempt < 2:
            assert reason.startswith(f"blocked: grow backoff: {attempt + 1} failed, next try in 1s")
        now += 5 + wait
    submits = [a for a in backend.actions() if a[0] == "submit"]
    result = ctl.run_once(now + 3600)
    assert [a for a in backend.actions() if a[0] == "submit"] == submits  # no fourth try
    reason = {r.job_id: r.reason for r in result.jobs}[8]
    assert reason == (
        "blocked: grow given up: 3 companions failed in a row"
        f" (last: companion {backend.next_job_id} FAILED after 1s)"
    )
    assert journal.grow_failures(8)[0] == 3


def test_a_companion_that_ran_or_finished_is_no_failure() -> None:
    parent = job(8, nodes=("n1", "n2"))
    ctl, backend, journal, _ = make(snapshot([parent]), {8: 2}, cooldown_s=0)
    backend.fresh = True
    journal.link_companion(8, 501, 1, None, 1000.0)
    running = replace(job(501, nodes=("n3",), comment=companion_comment(8)), start_time=1001.0)
    backend.snap = snapshot([parent, running])
    ctl.run_once(1100.0)  # seen running since 1001
    backend.snap = snapshot([parent])  # gone after 199 s: it worked
    ctl.run_once(1200.0)
    assert journal.grow_failures(8) == (0, None, "") and journal.companions() == ()
    journal.link_companion(8, 502, 1, None, 1250.0)
    done = replace(running, job_id=502, state=JobState.COMPLETED, end_time=1260.0)
    backend.snap = snapshot([parent, done])
    ctl.run_once(1300.0)  # ended at once, but its agent finished: no failure
    assert journal.grow_failures(8) == (0, None, "") and journal.companions() == ()
    journal.link_companion(8, 503, 1, None, 1350.0)
    backend.snap = snapshot([parent])
    ctl.run_once(1400.0)  # vanished without ever being seen: a failure
    assert journal.grow_failures(8) == (1, 1400.0, "companion 503 gone before it started")


@pytest.mark.parametrize("reported", [False, True])
def test_a_resize_that_may_redo_hours_is_not_worth_it(reported: bool) -> None:
    """Issue 23: the cost of resizing a script without the library enters the policy.  A job
    that has run 2 h and never reported may go back to its own last checkpoint, at worst its
    start: no grow pays that back in the horizon, and the daemon leaves it.  The same job
    with the library (it reports, and holds at a step boundary) is grown."""
    now = 7200.0
    seen: list[AllocationProblem] = []
    running = job(8, nodes=("n1",), comment="elastic:min=1,max=4", start=0.0)
    ctl, backend = enforcing(snapshot([running], taken_at=now), allocate=spying(seen))
    if reported:
        for i in range(5):
            ctl.reports.add(
                ProgressReport(job_id=8, time=now - 500 + 100 * i, step=100 * i, nodes=1)
            )
    result = ctl.run_once(now)
    (decision,) = result.plan.decisions if result.plan else ()
    if reported:
        assert decision.target_nodes == 4 and backend.actions()[0][0] == "submit"
    else:
        assert decision.target_nodes == 1 and backend.actions() == []
        assert decision.explanation.rule == "payback"


def test_a_qos_node_limit_caps_growth_like_a_partition() -> None:
    """Slurm holds each job of a QOS to its MaxTRESPerJob node=; a companion is a job of
    its own, so the daemon caps the job's range at the limit of its QOS."""
    running = job(8, nodes=("n1",), comment="elastic:min=1,max=4")
    other = replace(job(9, nodes=("n2",), comment="elastic:min=1,max=4"), qos="big")
    seen: list[AllocationProblem] = []
    ctl, backend = enforcing(snapshot([running, other]), allocate=spying(seen))
    backend.qos_nodes = {"normal": 2}
    result = ctl.run_once(1000.0)
    sizes = {d.job_id: d.allowed_sizes for d in seen[0].elastic}
    assert sizes == {8: (1, 2), 9: (1, 2, 3, 4)}
    assert {r.job_id: r.max_nodes for r in result.jobs} == {8: 2, 9: 4}


def test_a_partition_qos_node_limit_caps_every_job_of_the_partition() -> None:
    """A partition's own QOS (QoS= in scontrol show partition) binds every job there to its
    per-job limits, whatever QOS the job itself has."""
    running = job(8, nodes=("n1",), comment="elastic:min=1,max=4")
    other = replace(job(9, nodes=("n2",), comment="elastic:min=1,max=4"), qos="big")
    snap = snapshot([running, other])
    part = replace(snap.partitions[0], qos="part2")
    seen: list[AllocationProblem] = []
    ctl, backend = enforcing(replace(snap, partitions=(part,)), allocate=spying(seen))
    backend.qos_nodes = {"part2": 2, "big": 3}
    result = ctl.run_once(1000.0)
    assert {d.job_id: d.max_nodes for d in seen[0].elastic} == {8: 2, 9: 2}
    assert {r.job_id: r.max_nodes for r in result.jobs} == {8: 2, 9: 2}


def test_an_association_node_limit_caps_that_users_jobs() -> None:
    """An association's MaxNodes binds each job of its user and account (in its partition,
    or in every partition for the association without one); other users' jobs keep theirs."""
    jobs = [
        job(8, nodes=("n1",), comment="elastic:min=1,max=4", user="se-alice"),
        job(9, nodes=("n2",), comment="elastic:min=1,max=4", user="se-bob"),
        job(10, nodes=("n3",), comment="elastic:min=1,max=4", user="se-carol"),
    ]
    seen: list[AllocationProblem] = []
    ctl, backend = enforcing(snapshot(jobs), allocate=spying(seen))
    backend.assoc_nodes = {
        ("root", "se-alice", ""): 2,
        ("root", "se-bob", "batch"): 3,
        ("root", "se-bob", ""): 1,  # the partition's own association comes first
        ("other", "se-carol", ""): 1,  # another account's association binds other jobs
    }
    ctl.run_once(1000.0)
    assert {d.job_id: d.max_nodes for d in seen[0].elastic} == {8: 2, 9: 3, 10: 4}


def test_a_failed_limit_read_keeps_the_last_limits() -> None:
    ctl, backend = enforcing(snapshot([job(8, nodes=("n1",), user="se-alice")]))
    backend.fresh = True
    backend.qos_nodes, backend.assoc_nodes = {"normal": 3}, {("root", "se-alice", ""): 2}
    ctl.run_once(1000.0)
    backend.fail_limits = True
    result = ctl.run_once(1300.0)
    assert result.history_calls == 3  # the history read, then both limit reads failed
    assert {r.job_id: r.max_nodes for r in result.jobs} == {8: 2}


BORROWED = {81: 8, 82: 8}  # the journal's links of _borrower_and_rigid's companions


def reclaim_started(result: CycleResult, board: InstructionBoard) -> Instruction:
    """The plan gave back one of job 8's two loaned nodes to job 40 and told job 8."""
    assert result.plan is not None
    why = {d.job_id: d.explanation for d in result.plan.decisions}[8]
    assert (why.rule, why.detail) == (
        "reclaim",
        "shrink 3->2; gives back 1 of 2 on loan to reclaim:batch:job40",
    )
    instruction = board.pending_for(8)
    assert instruction is not None
    return instruction


def _borrower_and_rigid(**extra: object) -> ClusterSnapshot:
    """Job 8 holds n1 itself and n2, n3 through companions (2 on loan); rigid job 40
    (``-N2``, no marker) waits.  Slurm alone would start 40 on n4 and one of the loans."""
    return snapshot(
        [
            job(8, nodes=("n1",), hi=3, **extra),
            job(81, nodes=("n2",), comment="slurm-elastic:companion-of=8", **extra),
            job(82, nodes=("n3",), comment="slurm-elastic:companion-of=8", **extra),
            replace(pending(40, lo=2, hi=2), comment="", submit_time=10.0),
        ]
    )


def _real_policy(problem: AllocationProblem, policy: str) -> Plan:
    return allocate(problem, "mip", options=PolicyOptions(isolate=False))


def test_a_loan_is_reclaimed_for_a_pending_rigid_job_even_without_an_agent() -> None:
    """No agent has ever reported: the reclaim's shrink is still started (not blocked like
    a plain shrink), waits out ``ack_timeout_s`` for a checkpoint, then is applied, since
    ``reclaim_hard_shrink`` is on by default.  The companion on n3 goes; 8 keeps n1, n2."""
    ctl, backend, journal, board = make(
        _borrower_and_rigid(), _real_policy, ack_timeout_s=30, links=BORROWED
    )
    first = ctl.run_once(1000.0)
    instruction = reclaim_started(first, board)
    assert instruction.target_nodes == 2
    assert instruction.keep_nodes == ("n1", "n2")
    assert first.nodes_on_loan == 2 and {r.job_id: r.loan for r in first.jobs}[8] == 2
    assert {r.job_id: r.loan for r in first.jobs}[40] is None  # not an elastic job
    assert ctl.run_once(1010.0).reclaims == ()
    assert backend.actions() == []  # the job may still checkpoint
    done = ctl.run_once(1031.0)
    assert backend.actions() == [("cancel", 82)]
    assert [e.status for e in journal.all_actions()] == [ActionStatus.APPLIED]
    (reclaim,) = done.reclaims
    assert (reclaim.borrower, reclaim.waiting_job, reclaim.nodes) == (8, 40, 1)
    assert (reclaim.planned_at, reclaim.seconds) == (1000.0, 31.0)
    assert reclaim.detail == "hard shrink: no ack before deadline"


def test_a_companion_the_job_released_itself_is_not_cancelled() -> None:
    """The shrink names the companion it gives back (``Instruction.release``); the job ends
    it before acking (a completed job, no "CANCELLED" lines in its output).  That end is no
    change under the shrink and no companion failure; the daemon has nothing to cancel and
    applies.  A companion still running at the ack is cancelled as before."""
    for released_in_time in (True, False):
        snap = _borrower_and_rigid()
        ctl, backend, journal, board = make(snap, _real_policy, agents=(8,), links=BORROWED)
        ctl.run_once(1000.0)
        instruction = board.pending_for(8)
        assert instruction is not None and instruction.release == (82,)
        if released_in_time:
            ended = replace(
                next(j for j in snap.jobs if j.job_id == 82),
                state=JobState.COMPLETED,
                end_time=1004.0,
            )
            backend.snap = replace(
                snap, taken_at=1005.0, jobs=tuple(ended if j.job_id == 82 else j for j in snap.jobs)
            )
        assert board.ack(Ack(instruction.id, 8, AckStatus.READY, 40, "held", 1004.5))
        ctl.run_once(1005.0)
        cancels = [] if released_in_time else [("cancel", 82)]
        assert backend.actions() == cancels
        kinds = [(e.kind, e.status) for e in journal.all_actions()]
        assert kinds == [(ActionKind.SHRINK, ActionStatus.APPLIED)], kinds


def test_a_borrower_whose_agent_refuses_is_shrunk_anyway() -> None:
    ctl, backend, journal, board = make(
        _borrower_and_rigid(), _real_policy, agents=(8,), links=BORROWED
    )
    ctl.run_once(1000.0)
    instruction = board.pending_for(8)
    assert instruction is not None
    assert board.ack(Ack(instruction.id, 8, AckStatus.FAILED, 0, "busy", 1001.0))
    ctl.run_once(1005.0)
    assert backend.actions() == [("cancel", 82)]
    assert "agent refused: busy; shrunk anyway" in (journal.all_actions()[0].detail or "")


def test_dwell_does_not_keep_a_loan_and_reclaim_off_keeps_it() -> None:
    """Job 8 grew 10 s ago (min dwell 300 s): a plain resize would wait, the reclaim does
    not.  With ``policy.reclaim: off`` the rigid job waits as the docs used to promise."""
    snap = _borrower_and_rigid(start=990.0)
    ctl, _, _, board = make(snap, _real_policy, agents=(8,), min_dwell_s=300, links=BORROWED)
    ctl.run_once(1000.0)
    assert board.pending_for(8) is not None

    ctl, backend, _, board = make(
        snap, _real_policy, agents=(8,), policy={"reclaim": "off"}, links=BORROWED
    )
    result = ctl.run_once(1000.0)
    assert board.pending_for(8) is None and backend.actions() == []
    assert result.plan is not None
    assert {d.job_id: d.target_nodes for d in result.plan.decisions} == {8: 3}


def test_the_cycle_reports_each_partitions_gpu_type_with_the_configured_ones_deciding() -> None:
    """What ``slurm-elastic status`` shows: the nodes' gres types, and ``cluster.gpu_types``
    for a partition whose gres are untyped."""
    base = snapshot([pending(1)])
    typed = ("a100", "a100", "", "")  # n1, n2: gpu:a100:4; n3, n4: gpu:4
    nodes = tuple(
        replace(n, gpu_type=t, partitions=("fast" if t else "old",))
        for n, t in zip(base.nodes, typed, strict=True)
    )
    names = [n.name for n in nodes]
    parts = (
        replace(base.partitions[0], name="fast", nodes=tuple(names[:2])),
        replace(base.partitions[0], name="old", nodes=tuple(names[2:]), is_default=False),
    )
    snap = replace(base, nodes=nodes, partitions=parts, jobs=())
    ctl, *_ = make(snap, {})
    assert ctl.run_once(1000.0).to_json()["gpu_types"] == {"fast": "a100", "old": ""}
    ctl, *_ = make(snap, {}, cluster={"gpu_types": {"old": "V100"}})
    result = ctl.run_once(1000.0)
    assert result.gpu_types == {"fast": "a100", "old": "v100"}
    assert result.to_json()["gpu_types"] == {"fast": "a100", "old": "v100"}
