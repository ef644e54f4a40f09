"""The action journal: durable intents, and start-up reconciliation against a snapshot."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.daemon.journal import JOURNAL_FILE, ActionStatus, Journal
from slurm_elastic.errors import StateError
from slurm_elastic.types import Action, ActionKind, ElasticSpec
from tests.fakes import RecordingBackend
from tests.test_daemon_controller_data import job, pending, snapshot

GROW = Action(ActionKind.GROW, 1, 1, 2, "test", (("companion_nodes", "1"),))


def test_intent_survives_a_crash(tmp_path: Path) -> None:
    journal = Journal.in_state_dir(tmp_path)
    action_id = journal.record_intent(GROW, 10.0)
    # No close(): the process "dies" here; a new connection must see the intent.
    again = Journal.in_state_dir(tmp_path)
    (entry,) = again.open_actions()
    assert entry.id == action_id and entry.action == GROW and entry.status is ActionStatus.INTENT
    again.mark(action_id, ActionStatus.APPLIED, 11.0, companion_id=77)
    assert Journal.in_state_dir(tmp_path).open_actions() == ()
    assert again.get(action_id).companion_id == 77  # type: ignore[union-attr]


def test_grow_interrupted_after_sbatch_adopts_the_companion() -> None:
    journal = Journal()
    aid = journal.record_intent(GROW, 10.0)
    comp = pending(9, comment=companion_comment(1))
    backend = RecordingBackend(snapshot([job(1, nodes=("n1",)), comp]))
    report = journal.reconcile(backend, backend.snap)  # type: ignore[arg-type]
    assert report.completed == [aid] and report.adopted == [9]
    assert backend.actions() == []  # nothing repeated, nothing cancelled
    assert journal.companions()[0].companion_id == 9
    assert journal.get(aid).status is ActionStatus.APPLIED  # type: ignore[union-attr]


def test_grow_interrupted_never_adopts_another_users_job() -> None:
    """se-bob's job naming se-alice's job as its parent, older than the real companion,
    is neither adopted nor cancelled; the real companion (hers) is."""
    journal = Journal()
    aid = journal.record_intent(GROW, 10.0)
    parent = job(1, nodes=("n1",), user="se-alice")
    fake = pending(8, comment=companion_comment(1), user="se-bob")
    real = pending(9, comment=companion_comment(1), user="se-alice")
    backend = RecordingBackend(snapshot([parent, fake, real]))
    report = journal.reconcile(backend, backend.snap)  # type: ignore[arg-type]
    assert report.adopted == [9] and report.completed == [aid]
    assert [c.companion_id for c in journal.companions()] == [9]
    assert backend.actions() == []
    alone = Journal()
    aid = alone.record_intent(GROW, 10.0)
    backend = RecordingBackend(snapshot([parent, fake]))
    report = alone.reconcile(backend, backend.snap)  # type: ignore[arg-type]
    assert report.adopted == [] and report.rolled_back == [aid]
    assert alone.companions() == () and backend.actions() == []


def test_grow_interrupted_before_sbatch_is_rolled_back() -> None:
    journal = Journal()
    aid = journal.record_intent(GROW, 10.0)
    backend = RecordingBackend(snapshot([job(1, nodes=("n1",))]))
    report = journal.reconcile(backend, backend.snap)  # type: ignore[arg-type]
    assert report.rolled_back == [aid] and backend.actions() == []


def test_reconcile_cancels_orphans_once_and_only_in_enforce() -> None:
    journal = Journal()
    journal.link_companion(1, 9, 1, None, 5.0)
    orphan = job(9, nodes=("n2",), comment=companion_comment(1))
    alive = job(11, nodes=("n3",), comment=companion_comment(10))
    parent = job(10, nodes=("n1",))
    backend = RecordingBackend(snapshot([orphan, alive, parent]))
    shadow = journal.reconcile(backend, backend.snap, act=False)  # type: ignore[arg-type]
    assert shadow.cancelled == [] and backend.actions() == []
    report = journal.reconcile(backend, backend.snap)  # type: ignore[arg-type]
    assert report.cancelled == [9] and backend.actions() == [("cancel", 9)]
    assert [c.companion_id for c in journal.companions()] == []
    kinds = [(e.kind, e.status) for e in journal.all_actions()]
    assert kinds == [(ActionKind.CANCEL_COMPANION, ActionStatus.APPLIED)]


def test_reconcile_closes_pins_and_shrinks_by_what_slurm_shows() -> None:
    journal = Journal()
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
    report = journal.reconcile(backend, snap)  # type: ignore[arg-type]
    assert sorted(report.completed) == [pinned, shrunk]
    assert sorted(report.rolled_back) == [unpinned, waiting, gone]
    assert journal.open_actions() == () and backend.actions() == []
    # Reconciling again repeats nothing.
    again = journal.reconcile(backend, snap)  # type: ignore[arg-type]
    assert again.completed == again.rolled_back == again.cancelled == []


def test_last_resize_and_specs_persist(tmp_path: Path) -> None:
    journal = Journal.in_state_dir(tmp_path)
    aid = journal.record_intent(GROW, 10.0)
    journal.mark(aid, ActionStatus.APPLIED, 12.0)
    journal.remember_specs({1: ElasticSpec(1, 4), 2: ElasticSpec(1, 2)}, 10.0)
    journal.remember_specs({1: ElasticSpec(2, 2)}, 11.0)  # the first one seen stays
    again = Journal.in_state_dir(tmp_path)
    assert again.last_resize_at() == {1: 12.0}
    assert again.known_specs() == {1: ElasticSpec(1, 4), 2: ElasticSpec(1, 2)}
    again.forget_specs([1, 2])
    assert again.known_specs() == {}


def test_prune_keeps_open_rows_and_recent_history() -> None:
    journal = Journal()
    old_done = journal.record_intent(GROW, 10.0)
    journal.mark(old_done, ActionStatus.APPLIED, 11.0)
    old_open = journal.record_intent(GROW, 10.0)
    recent = journal.record_intent(GROW, 500.0)
    journal.mark(recent, ActionStatus.FAILED, 501.0)
    journal.link_companion(1, 9, 1, old_done, 10.0)
    journal.end_companion(9, 12.0)
    journal.link_companion(1, 10, 1, None, 10.0)  # still active
    assert journal.prune(before=100.0) == 2
    assert [e.id for e in journal.all_actions()] == [old_open, recent]
    assert [c.companion_id for c in journal.companions(active_only=False)] == [10]


def test_shrink_dropping_a_companion_is_done_only_when_the_companion_is_gone() -> None:
    journal = Journal()
    extra = (("parent_nodes", "2"), ("cancel_companions", "9"), ("keep_nodes", "n1,n2"))
    aid = journal.record_intent(
        Action(ActionKind.SHRINK, 1, 3, 2, extra=extra), 1.0, status=ActionStatus.WAITING
    )
    parent = job(1, nodes=("n1", "n2"))
    comp = job(9, nodes=("n3",), comment=companion_comment(1))
    backend = RecordingBackend(snapshot([parent, comp]))
    assert journal.reconcile(backend, backend.snap).rolled_back == [aid]  # type: ignore[arg-type]
    aid = journal.record_intent(
        Action(ActionKind.SHRINK, 1, 3, 2, extra=extra), 2.0, status=ActionStatus.WAITING
    )
    backend.snap = snapshot([parent])
    assert journal.reconcile(backend, backend.snap).completed == [aid]  # type: ignore[arg-type]


def test_what_is_read_every_cycle_follows_every_write(tmp_path: Path) -> None:
    """last_resize_at, open_actions and known_specs are answered from memory between
    writes: after any sequence of writes they must equal what the tables say (a fresh
    journal on the same file reads them)."""
    rng = random.Random(3)
    journal = Journal.in_state_dir(tmp_path)
    # Read once first: from here on the answers come from memory.
    assert journal.last_resize_at() == {} and journal.open_actions() == ()
    assert journal.known_specs() == {}
    kinds = (ActionKind.SHRINK, ActionKind.GROW, ActionKind.START_AT_SIZE)
    ids: list[int] = []
    for step in range(300):
        now = float(step)
        op = rng.random()
        if op < 0.3 or not ids:
            # The last extra is not plain strings: it reads back as strings in a tuple.
            extra = rng.choice(((), (("parent_nodes", "2"), ("keep_nodes", "a,b")), [("n", 2)]))
            action = Action(rng.choice(kinds), rng.randrange(1, 20), 4, 2, "test", extra)  # type: ignore[arg-type]
            status = rng.choice((ActionStatus.INTENT, ActionStatus.WAITING, ActionStatus.APPLIED))
            ids.append(
                journal.record_intent(
                    action,
                    now,
                    status=status,
                    instruction_id=rng.choice((None, f"i{step}")),
                    deadline=rng.choice((None, now + 60.0)),
                )
            )
        elif op < 0.7:
            status = rng.choice(list(ActionStatus))
            journal.mark(
                rng.choice(ids),
                status,
                now - rng.random() * 50.0,
                detail=rng.choice(("", "why")),
                companion_id=rng.choice((None, step)),
            )
        elif op < 0.8:
            job = rng.randrange(1, 20)
            journal.remember_specs({job: ElasticSpec(1, rng.randrange(1, 9))}, now)
        elif op < 0.9:
            journal.forget_specs(rng.sample(range(1, 20), 3))
        else:
            journal.prune(now - 40.0)
        if rng.random() < 0.3:
            continue  # several writes between reads, too
        fresh = Journal.in_state_dir(tmp_path)
        assert journal.last_resize_at() == fresh.last_resize_at()
        some = rng.sample(range(1, 25), 5)
        assert journal.last_resize_at(some) == {
            j: t for j, t in fresh.last_resize_at().items() if j in some
        }
        assert journal.open_actions() == fresh.open_actions()
        assert journal.known_specs() == fresh.known_specs()
        fresh.close()


# --------------------------------------------------------------------------- faults of the file

REPO = Path(__file__).resolve().parent.parent

# Five intents, then the process dies without closing the journal (as a kill -9 would).
_WRITE_AND_DIE = """
import os, signal, sys
from slurm_elastic.daemon.journal import Journal
from slurm_elastic.types import Action, ActionKind
journal = Journal.in_state_dir(sys.argv[1])
for job in range(1, 6):
    journal.record_intent(Action(ActionKind.GROW, job, 1, 2, "test"), float(job))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_after_five_intents(state: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_AND_DIE, str(state)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
    )
    assert done.returncode == -9
    wal = state / (JOURNAL_FILE + "-wal")
    assert wal.stat().st_size > 0  # what an unclean stop leaves
    return wal


@pytest.mark.parametrize("torn_bytes", [0, 7])
def test_a_torn_last_write_is_recovered_and_said_in_one_line(
    tmp_path: Path, torn_bytes: int
) -> None:
    """A kill mid-commit leaves the write-ahead log's last frame short: SQLite drops that
    transaction (never acted on: Slurm is called after the commit) and keeps every one
    before it; the open says so in one line."""
    wal = _killed_after_five_intents(tmp_path)
    size = wal.stat().st_size
    os.truncate(wal, size - torn_bytes)
    with capture_logs() as logs:
        journal = Journal.in_state_dir(tmp_path)
    kept = [e.job_id for e in journal.open_actions()]
    assert kept == ([1, 2, 3, 4, 5] if torn_bytes == 0 else [1, 2, 3, 4])
    (line,) = [e for e in logs if e["event"] == "journal.recovered"]
    assert line["path"] == str(tmp_path / JOURNAL_FILE) and line["wal_bytes"] == size - torn_bytes
    assert line["log_level"] == "warning" and "unfinished last one" in line["detail"]
    journal.close()
    with capture_logs() as logs:  # closed cleanly this time: nothing to recover
        Journal.in_state_dir(tmp_path).close()
    assert [e for e in logs if e["event"] == "journal.recovered"] == []


def _one_line(exc: pytest.ExceptionInfo[StateError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_file_that_is_not_a_journal_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_FILE
    path.write_bytes(os.urandom(5000))
    with pytest.raises(StateError) as info:
        Journal(path)
    assert _one_line(info).startswith(f"{path}: corrupt journal (file is not a database); ")


def test_a_cut_journal_is_one_line(tmp_path: Path) -> None:
    """Damage past the first page (a file cut short): found at open, not in a later cycle."""
    journal = Journal.in_state_dir(tmp_path)
    journal.remember_specs({job: ElasticSpec(1, 4) for job in range(3000)}, 1.0)  # many pages
    journal.close()  # folds the write-ahead log into the file
    path = tmp_path / JOURNAL_FILE
    os.truncate(path, path.stat().st_size // 2 + 100)
    with pytest.raises(StateError) as info:
        Journal(path)
    assert _one_line(info).startswith(f"{path}: corrupt journal (")
    assert "move it aside" in str(info.value)


def spoil_a_row(path: Path) -> None:
    """A journal whose pages are sound but one row holds what this code never writes."""
    journal = Journal(path)
    journal.record_intent(GROW, 1.0)
    journal.close()
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE actions SET kind='teleport', extra='{not json'")
    db.close()


def test_a_row_this_code_never_wrote_is_one_line_at_open(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_FILE
    spoil_a_row(path)
    with pytest.raises(StateError) as info:
        Journal(path)
    assert _one_line(info).startswith(f"{path}: corrupt journal (unreadable action row: ")


def test_a_read_only_state_dir_is_one_line(tmpfs: Callable[..., Path]) -> None:
    """Empty, then with a journal in it (remounted read-only): no start either way."""
    empty = tmpfs(read_only=True)
    with pytest.raises(StateError) as info:
        Journal.in_state_dir(empty)
    assert _one_line(info) == f"{empty}: cannot write in the state directory: Read-only file system"
    state = tmpfs()
    Journal.in_state_dir(state).close()
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    with pytest.raises(StateError) as info:
        Journal.in_state_dir(state)
    assert _one_line(info) == f"{state}: cannot write in the state directory: Read-only file system"


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its file system is full (ENOSPC)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.strerror == "No space left on device"
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_is_one_line_and_loses_nothing_written(tmpfs: Callable[..., Path]) -> None:
    state = tmpfs()
    journal = Journal.in_state_dir(state)
    written = [journal.record_intent(GROW, float(t)) for t in range(5)]
    filler = fill(state)
    with pytest.raises(StateError) as info:
        for t in range(5, 10_000):  # the log may have room left for a few
            written.append(journal.record_intent(GROW, float(t)))
    assert _one_line(info) == f"{state / JOURNAL_FILE}: database or disk is full"
    with pytest.raises(StateError, match="database or disk is full"):
        journal.remember_specs({1: ElasticSpec(1, 4)}, 1.0)  # a transaction: rolled back
    # Every intent recorded before the disk filled is there; the journal is usable again
    # once there is room.
    assert [e.id for e in journal.open_actions()] == written
    journal.close()
    filler.unlink()
    again = Journal.in_state_dir(state)
    assert [e.id for e in again.all_actions()] == written and again.known_specs() == {}
    again.record_intent(GROW, 1e4)
    again.close()
