"""The action journal: durable rows, the same answers from both stores, faults of the file."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from slurm_elastic.actuate.journal import JOURNAL_FILE, ActionStatus, Journal, JournalStore
from slurm_elastic.errors import StateError
from slurm_elastic.sim.journal import MemoryJournal
from slurm_elastic.types import Action, ActionKind, ElasticSpec

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


def test_prune_keeps_the_rows_and_links_of_jobs_still_alive() -> None:
    """Whatever their age: the guards of a job Slurm still has read them."""
    for journal in (Journal(), MemoryJournal()):
        alive = journal.record_intent(GROW, 10.0)  # job 1
        journal.mark(alive, ActionStatus.APPLIED, 11.0)
        ended = journal.record_intent(Action(ActionKind.SHRINK, 2, 3, 2), 10.0)
        journal.mark(ended, ActionStatus.APPLIED, 11.0)
        journal.link_companion(1, 9, 1, alive, 10.0)
        journal.end_companion(9, 12.0)
        journal.link_companion(2, 10, 1, None, 10.0)
        journal.end_companion(10, 12.0)
        assert journal.prune(before=100.0, keep_jobs=[1, 77]) == 2
        assert [e.id for e in journal.all_actions()] == [alive]
        assert [c.companion_id for c in journal.companions(active_only=False)] == [9]


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "journal"


def test_a_journal_written_by_7a9a5ae_reads_the_same(tmp_path: Path) -> None:
    """A state directory of a daemon at main 7a9a5ae (the journal before it was plain
    SQLite in actuate/) opens, reads what that version read from it, and takes new rows
    after its last id."""
    shutil.copy(FIXTURE / "journal-7a9a5ae.sqlite", tmp_path / JOURNAL_FILE)
    want = json.loads((FIXTURE / "journal-7a9a5ae.json").read_text())
    journal = Journal.in_state_dir(tmp_path)
    got = [
        {
            "id": e.id,
            "kind": str(e.action.kind),
            "job_id": e.action.job_id,
            "from_nodes": e.action.from_nodes,
            "to_nodes": e.action.to_nodes,
            "reason": e.action.reason,
            "extra": [list(p) for p in e.action.extra],
            "status": str(e.status),
            "created_at": e.created_at,
            "updated_at": e.updated_at,
            "detail": e.detail,
            "instruction_id": e.instruction_id,
            "deadline": e.deadline,
            "companion_id": e.companion_id,
        }
        for e in journal.all_actions()
    ]
    assert got == want["all_actions"] and len(got) == 11
    assert [e.id for e in journal.open_actions()] == want["open_actions"] == [2, 6, 8]
    assert journal.last_resize_at() == {int(k): v for k, v in want["last_resize_at"].items()}
    assert journal.known_specs() == {
        int(k): ElasticSpec(*v) for k, v in want["known_specs"].items()
    }
    links = [list(dataclasses.astuple(c)) for c in journal.companions(active_only=False)]
    assert links == want["companions"]
    assert [c.companion_id for c in journal.companions()] == want["active_companions"]
    assert list(journal.grow_failures(20)) == want["grow_failures_20"]
    assert sorted(journal.shrunk_jobs()) == want["shrunk_jobs"] == [30]
    assert sorted(journal.reconfigured_jobs()) == want["reconfigured_jobs"]
    assert journal.record_intent(GROW, 300.0) == 12
    journal.close()


def _answers(store: JournalStore, rng: random.Random) -> dict[str, object]:
    """Every query of the store, some with arguments drawn from ``rng``."""
    jobs = rng.sample(range(1, 25), 5)
    return {
        "all": store.all_actions(),
        "open": store.open_actions(),
        "get": [store.get(i) for i in rng.sample(range(0, 80), 5)],
        "for": [store.actions_for(j) for j in jobs],
        "resized": store.last_resize_at(),
        "resized_some": store.last_resize_at(jobs),
        "grow_failures": [store.grow_failures(j, rng.choice((1, 3, 100))) for j in jobs],
        "shrunk": store.shrunk_jobs(),
        "reconfigured": store.reconfigured_jobs(),
        "links": store.companions(active_only=False),
        "active": store.companions(),
        "specs": store.known_specs(),
        "refusals": store.refusals(),
        "retries": store.retries(),
    }


def _write(store: JournalStore, rng: random.Random, step: int) -> object:
    """One write drawn from ``rng``; returns what the store returned."""
    now = float(step)
    op = rng.random()
    if op < 0.3:
        kind = rng.choice(list(ActionKind))
        extra = rng.choice(
            (
                (),
                (("companion_nodes", "1"),),
                (("parent_nodes", "2"), ("parent_from", "4"), ("keep_nodes", "a,b")),
                (("parent_nodes", "3"),),
                [("n", 2)],  # not string pairs: stored and read back as ("n", "2")
                (("job_shape", "0123abcd"),),  # read back by ``refusals``
            )
        )
        action = Action(kind, rng.randrange(1, 20), 4, 2, "test", extra)  # type: ignore[arg-type]
        return store.record_intent(
            action,
            now,
            status=rng.choice((ActionStatus.INTENT, ActionStatus.WAITING, ActionStatus.APPLIED)),
            instruction_id=rng.choice((None, f"i{step}")),
            deadline=rng.choice((None, now + 60.0)),
        )
    if op < 0.6:
        return store.mark(
            rng.randrange(1, step + 2),  # now and then an id never written
            rng.choice(list(ActionStatus)),
            now - rng.random() * 50.0,
            detail=rng.choice(("", "why")),
            companion_id=rng.choice((None, step)),
        )
    if op < 0.7:
        comp = rng.randrange(100, 130)  # linked twice now and then: the first link stays
        return store.link_companion(rng.randrange(1, 20), comp, 1, rng.choice((None, 1)), now)
    if op < 0.8:
        return store.end_companion(rng.randrange(100, 130), now)
    if op < 0.87:
        spec = ElasticSpec(
            1, rng.randrange(1, 9), 1, rng.choice((None, 4)), rng.choice((None, 30.0))
        )
        return store.remember_specs({rng.randrange(1, 20): spec}, now)
    if op < 0.95:
        return store.forget_specs(rng.sample(range(1, 20), 3))
    return store.prune(now - 40.0, rng.sample(range(1, 20), rng.choice((0, 5))))


# The answers the scenario must see non-empty at some read.
NON_EMPTY = (
    "open", "resized", "shrunk", "reconfigured", "active", "specs", "refusals", "retries"
)  # fmt: skip


def test_the_two_stores_answer_every_query_the_same(tmp_path: Path) -> None:
    """The simulator's MemoryJournal and the daemon's SQLite Journal, given the same writes
    (every kind, status and query; ids never written; links twice; prunes), return the
    same from every write and every query; the file, opened again, the same too."""
    rng = random.Random(3)
    sqlite_store = Journal.in_state_dir(tmp_path)
    memory = MemoryJournal()
    seen: dict[str, None] = {}
    for step in range(600):
        state = rng.getstate()
        written = _write(sqlite_store, rng, step)
        rng.setstate(state)
        assert _write(memory, rng, step) == written
        if rng.random() < 0.3:
            continue  # several writes between reads, too
        state = rng.getstate()
        answers = _answers(sqlite_store, rng)
        rng.setstate(state)
        assert _answers(memory, rng) == answers
        seen.update(dict.fromkeys(k for k in NON_EMPTY if answers[k]))
        if any(count for count, _, _ in answers["grow_failures"]):  # type: ignore[attr-defined]
            seen["failed"] = None
    # The scenario reached every answer non-empty at some read.
    assert set(seen) == {*NON_EMPTY, "failed"}
    sqlite_store.close()
    state = rng.getstate()
    again = _answers(Journal.in_state_dir(tmp_path), rng)
    rng.setstate(state)
    assert again == _answers(memory, rng)


# --------------------------------------------------------------------------- faults of the file

REPO = Path(__file__).resolve().parent.parent

# Five intents, then the process dies without closing the journal (as a kill -9 would).
_WRITE_AND_DIE = """
import os, signal, sys
from slurm_elastic.actuate.journal import Journal
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
