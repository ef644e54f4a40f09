"""Crash recovery: open journal rows closed against a snapshot, orphan companions cancelled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.journal import ActionStatus, Journal, JournalStore
from slurm_elastic.actuate.reconcile import reconcile
from slurm_elastic.sim.journal import MemoryJournal
from slurm_elastic.types import Action, ActionKind
from tests.fakes import RecordingBackend
from tests.test_daemon_controller_data import job, pending, snapshot
from tests.test_journal import GROW


@pytest.fixture(params=["sqlite", "memory"])
def new_store(request: pytest.FixtureRequest) -> Callable[[], JournalStore]:
    """Each scenario runs on the daemon's store and on the simulator's."""
    return Journal if request.param == "sqlite" else MemoryJournal


def test_grow_interrupted_after_sbatch_adopts_the_companion(
    new_store: Callable[[], JournalStore],
) -> None:
    journal = new_store()
    aid = journal.record_intent(GROW, 10.0)
    comp = replace(pending(9, comment=companion_comment(1)), submit_time=10.0)
    backend = RecordingBackend(snapshot([job(1, nodes=("n1",)), comp]))
    report = reconcile(journal, backend, backend.snap)  # type: ignore[arg-type]
    assert report.completed == [aid] and report.adopted == [9]
    assert backend.actions() == []  # nothing repeated, nothing cancelled
    assert journal.companions()[0].companion_id == 9
    assert journal.get(aid).status is ActionStatus.APPLIED  # type: ignore[union-attr]


def test_grow_interrupted_never_adopts_another_users_job(
    new_store: Callable[[], JournalStore],
) -> None:
    """se-bob's job naming se-alice's job as its parent, older than the real companion,
    is neither adopted nor cancelled, nor is a job of hers submitted before the grow was
    written down (a comment she set later); the real companion (hers) is."""
    journal = new_store()
    aid = journal.record_intent(GROW, 10.0)
    parent = job(1, nodes=("n1",), user="se-alice")
    fake = replace(pending(8, comment=companion_comment(1), user="se-bob"), submit_time=10.0)
    older = replace(pending(7, comment=companion_comment(1), user="se-alice"), submit_time=5.0)
    real = replace(pending(9, comment=companion_comment(1), user="se-alice"), submit_time=10.0)
    backend = RecordingBackend(snapshot([parent, older, fake, real]))
    report = reconcile(journal, backend, backend.snap)  # type: ignore[arg-type]
    assert report.adopted == [9] and report.completed == [aid]
    assert [c.companion_id for c in journal.companions()] == [9]
    assert backend.actions() == []
    alone = new_store()
    aid = alone.record_intent(GROW, 10.0)
    backend = RecordingBackend(snapshot([parent, fake]))
    report = reconcile(alone, backend, backend.snap)  # type: ignore[arg-type]
    assert report.adopted == [] and report.rolled_back == [aid]
    assert alone.companions() == () and backend.actions() == []


def test_grow_interrupted_before_sbatch_is_rolled_back(
    new_store: Callable[[], JournalStore],
) -> None:
    journal = new_store()
    aid = journal.record_intent(GROW, 10.0)
    backend = RecordingBackend(snapshot([job(1, nodes=("n1",))]))
    report = reconcile(journal, backend, backend.snap)  # type: ignore[arg-type]
    assert report.rolled_back == [aid] and backend.actions() == []


def test_reconcile_cancels_orphans_once_and_only_in_enforce(
    new_store: Callable[[], JournalStore],
) -> None:
    journal = new_store()
    journal.link_companion(1, 9, 1, None, 5.0)
    orphan = job(9, nodes=("n2",), comment=companion_comment(1))
    alive = job(11, nodes=("n3",), comment=companion_comment(10))
    parent = job(10, nodes=("n1",))
    backend = RecordingBackend(snapshot([orphan, alive, parent]))
    shadow = reconcile(journal, backend, backend.snap, act=False)  # type: ignore[arg-type]
    assert shadow.cancelled == [] and backend.actions() == []
    report = reconcile(journal, backend, backend.snap)  # type: ignore[arg-type]
    assert report.cancelled == [9] and backend.actions() == [("cancel", 9)]
    assert [c.companion_id for c in journal.companions()] == []
    kinds = [(e.kind, e.status) for e in journal.all_actions()]
    assert kinds == [(ActionKind.CANCEL_COMPANION, ActionStatus.APPLIED)]


def test_reconcile_closes_pins_and_shrinks_by_what_slurm_shows(
    new_store: Callable[[], JournalStore],
) -> None:
    journal = new_store()
    pinned = journal.record_intent(Action(ActionKind.START_AT_SIZE, 2, 0, 3), 1.0)
    unpinned = journal.record_intent(Action(ActionKind.START_AT_SIZE, 3, 0, 2), 1.0)
    shrunk = journal.record_intent(
        Action(ActionKind.SHRINK, 4, 3, 2, extra=(("parent_nodes", "2"),)),
        1.0,
        status=ActionStatus.WAITING,
        instruction_id="i-1",
        deadline=60.0,
    )
    waiting = journal.record_intent(
        Action(ActionKind.SHRINK, 5, 2, 1, extra=(("parent_nodes", "1"),)),
        1.0,
        status=ActionStatus.WAITING,
    )
    gone = journal.record_intent(Action(ActionKind.START_AT_SIZE, 6, 0, 1), 1.0)
    snap = snapshot(
        [
            pending(2, lo=3, hi=3),
            pending(3, lo=1, hi=4),
            job(4, nodes=("n1", "n2")),
            job(5, nodes=("n3", "n4")),
        ]
    )
    backend = RecordingBackend(snap)
    report = reconcile(journal, backend, snap)  # type: ignore[arg-type]
    assert sorted(report.completed) == [pinned, shrunk]
    assert sorted(report.rolled_back) == [unpinned, waiting, gone]
    assert journal.open_actions() == () and backend.actions() == []
    # Reconciling again repeats nothing.
    again = reconcile(journal, backend, snap)  # type: ignore[arg-type]
    assert again.completed == again.rolled_back == again.cancelled == []


def test_shrink_dropping_a_companion_is_done_only_when_the_companion_is_gone(
    new_store: Callable[[], JournalStore],
) -> None:
    journal = new_store()
    extra = (("parent_nodes", "2"), ("cancel_companions", "9"), ("keep_nodes", "n1,n2"))
    aid = journal.record_intent(
        Action(ActionKind.SHRINK, 1, 3, 2, extra=extra), 1.0, status=ActionStatus.WAITING
    )
    parent = job(1, nodes=("n1", "n2"))
    comp = job(9, nodes=("n3",), comment=companion_comment(1))
    backend = RecordingBackend(snapshot([parent, comp]))
    assert reconcile(journal, backend, backend.snap).rolled_back == [aid]  # type: ignore[arg-type]
    aid = journal.record_intent(
        Action(ActionKind.SHRINK, 1, 3, 2, extra=extra), 2.0, status=ActionStatus.WAITING
    )
    backend.snap = snapshot([parent])
    assert reconcile(journal, backend, backend.snap).completed == [aid]  # type: ignore[arg-type]


def test_reconfigure_and_companion_cancel_rows_say_why_they_were_rolled_back(
    new_store: Callable[[], JournalStore],
) -> None:
    """A reconfigure row is for a job that has ended: rolled back as unconfirmed (the next
    cycle repeats it), not as "job has ended"; a cancel whose companion still runs too."""
    journal = new_store()
    reconf = journal.record_intent(Action(ActionKind.RECONFIGURE, 7, 0, 0, "leak"), 1.0)
    cancel = journal.record_intent(Action(ActionKind.CANCEL_COMPANION, 9, 1, 0), 1.0)
    backend = RecordingBackend(snapshot([job(1, nodes=("n1",)), job(9, nodes=("n2",))]))
    report = reconcile(journal, backend, backend.snap)  # type: ignore[arg-type]
    assert report.rolled_back == [reconf, cancel]
    details = {e.id: e.detail for e in journal.all_actions()}
    assert details[reconf] == "reconciled: reconfigure not confirmed before restart"
    assert details[cancel] == "reconciled: companion still active"
