"""The action journal: every action is written down before it is applied.

Storage only.  What the executor does with the rows (apply, advance a shrink) is in
``actuate.executor``; what a restart does with the rows still open (close each against
Slurm, cancel orphan companions) is in ``actuate.reconcile``.

``JournalStore`` is what they need from it.  Two stores keep it:

* ``Journal``: a SQLite file in the state directory (``journal.sqlite``), the daemon's.
  Plain SQL: every read is a query, nothing is kept in memory between calls, so what a
  call returns is what the file holds.
* ``slurm_elastic.sim.journal.MemoryJournal``: the simulator's, in dicts, with the same
  answers (``tests/test_journal.py`` runs one scenario on both).

Each action row moves through::

    intent ──► applied                 (Slurm accepted it)
       │  ├──► failed                  (it could not be done; nothing changed)
       │  ├──► refused                 (Slurm said the request cannot be done: a fact
       │  │                             about the job, kept for a while: ``refusals``)
       │  └──► retry                   (Slurm said "not now", or could not be reached:
       │                                nothing changed, asked again after a backoff)
       └─► waiting ──► applied         (shrink: instruction posted, ack awaited)
                  ├──► rolled_back     (ack refused / timed out / job changed)
                  └──► failed | refused | retry   (as above, for the resize itself)

Companion links (parent <-> companion job ids) and the first elastic spec seen per job
are kept alongside.  The row is committed before Slurm is called, so a daemon killed at
any point leaves either an ``intent`` or a ``waiting`` row for reconciliation to close.

Faults of the file are one ``StateError`` naming it, never a traceback: a state directory
the daemon cannot write, a full disk, a file that is not a database or fails SQLite's
integrity check, a row this code never wrote.  The daemon then stops (``daemon.service``):
it must not act on what it cannot write down first, and a restart's reconciliation is the
recovery path already designed for a crash.  A torn last write (the daemon killed
mid-commit) is SQLite's own recovery: the write-ahead log keeps every committed
transaction and drops an unfinished one, which was never acted on (an intent is committed
before Slurm is called); the first open after such a stop says so in one
``journal.recovered`` line.

The on-disk schema is ``_SCHEMA``; a journal written by any earlier version opens as is
(``tests/fixtures/journal``).  docs/design.md, "Journal and recovery", has the rules.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import tempfile
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from slurm_elastic.errors import StateError
from slurm_elastic.types import Action, ActionKind, ElasticSpec

log = structlog.get_logger("slurm_elastic.journal")

JOURNAL_FILE = "journal.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    from_nodes INTEGER NOT NULL,
    to_nodes INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '',
    extra TEXT NOT NULL DEFAULT '[]',
    instruction_id TEXT,
    deadline REAL,
    companion_id INTEGER
);
CREATE INDEX IF NOT EXISTS actions_open ON actions(status);
CREATE INDEX IF NOT EXISTS actions_job ON actions(job_id);
CREATE TABLE IF NOT EXISTS companions (
    companion_id INTEGER PRIMARY KEY,
    parent_id INTEGER NOT NULL,
    nodes INTEGER NOT NULL,
    action_id INTEGER,
    linked_at REAL NOT NULL,
    ended_at REAL
);
CREATE TABLE IF NOT EXISTS specs (
    job_id INTEGER PRIMARY KEY,
    min_nodes INTEGER NOT NULL,
    max_nodes INTEGER NOT NULL,
    step INTEGER NOT NULL,
    gpus_per_node INTEGER,
    resize_cost_s REAL,
    seen_at REAL NOT NULL
);
"""

_COLUMNS = (
    "id, job_id, kind, from_nodes, to_nodes, status, created_at, updated_at, reason, detail,"
    " extra, instruction_id, deadline, companion_id"
)
# SQLite's smallest default limit on the ? parameters of one statement (before 3.32).
_MAX_PARAMS = 999


class ActionStatus(enum.StrEnum):
    INTENT = "intent"
    WAITING = "waiting"
    APPLIED = "applied"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"  # Slurm refused it: a fact about the job (``refusals``)
    # Slurm asked to be asked again (``errors.SlurmBusy``) or could not be reached: nothing
    # changed; the action is tried again after a backoff (``retries``), never a bar.
    RETRY = "retry"

    @property
    def is_open(self) -> bool:
        """Not yet closed: reconciliation closes such a row after a restart."""
        return self in (ActionStatus.INTENT, ActionStatus.WAITING)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One action row as the journal holds it."""

    id: int
    action: Action
    status: ActionStatus
    created_at: float
    updated_at: float
    detail: str = ""
    instruction_id: str | None = None
    deadline: float | None = None
    companion_id: int | None = None

    @property
    def job_id(self) -> int:
        return self.action.job_id

    @property
    def kind(self) -> ActionKind:
        return self.action.kind


# The action's ``extra`` key under which the executor notes what the job looked like when
# it acted (``actuate.guards.job_shape``): a refusal holds only while the job still does.
JOB_SHAPE = "job_shape"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Slurm refused an action of ``kind`` on the job while the job was in the state that
    action needs: the newest ``refused`` row of that job and kind."""

    job_id: int
    kind: ActionKind
    at: float
    detail: str  # Slurm's message
    shape: str = ""  # the job's shape when it was refused ("" for rows written before)


def newest_refusals(entries: Iterable[JournalEntry]) -> tuple[Refusal, ...]:
    """The newest ``refused`` row per (job, kind) of ``entries``, in id order."""
    newest: dict[tuple[int, ActionKind], Refusal] = {}
    for e in entries:
        if e.status is ActionStatus.REFUSED:
            shape = str(dict(e.action.extra).get(JOB_SHAPE, ""))
            newest[(e.job_id, e.kind)] = Refusal(e.job_id, e.kind, e.updated_at, e.detail, shape)
    return tuple(newest.values())


@dataclass(frozen=True, slots=True)
class Retry:
    """The newest attempts of ``kind`` on the job met Slurm's "not now" (or no Slurm):
    ``count`` ``retry`` rows in a row, the newest ended at ``at`` with ``detail``."""

    job_id: int
    kind: ActionKind
    count: int
    at: float
    detail: str


def pending_retries(entries: Iterable[JournalEntry]) -> tuple[Retry, ...]:
    """Per (job, kind), the run of ``retry`` rows that ends ``entries``' closed rows (given
    in id order); nothing for a job and kind whose newest closed row is not a retry."""
    runs: dict[tuple[int, ActionKind], Retry] = {}
    for e in entries:
        if e.status.is_open:
            continue
        key = (e.job_id, e.kind)
        if e.status is ActionStatus.RETRY:
            before = runs.get(key)
            count = before.count + 1 if before else 1
            runs[key] = Retry(e.job_id, e.kind, count, e.updated_at, e.detail)
        else:
            runs.pop(key, None)
    return tuple(runs.values())


@dataclass(frozen=True, slots=True)
class CompanionLink:
    """A companion job the daemon submitted (or adopted) for a parent job."""

    companion_id: int
    parent_id: int
    nodes: int
    action_id: int | None
    linked_at: float
    ended_at: float | None = None


class JournalStore(Protocol):
    """What actuation and the controller need from the journal: rows, links, specs.

    Every write is durable when it returns (the daemon's store commits it to disk), so a
    caller that records an intent and then calls Slurm never acts on what is not written.
    Reads return what the store holds at the call, in id order where a sequence.  Times
    are the caller's ``now`` (finite seconds); ids are the store's, from 1, never reused.

    Raises:
        StateError: any method, when the store cannot be read or written (the daemon's
            file: read-only, full disk, corrupt); nothing was written then, or for
            ``remember_specs`` / ``forget_specs`` / ``prune`` nothing of that call.
    """

    def record_intent(
        self,
        action: Action,
        now: float,
        *,
        status: ActionStatus = ActionStatus.INTENT,
        instruction_id: str | None = None,
        deadline: float | None = None,
    ) -> int:
        """Write a new action row (``intent`` unless said otherwise); returns its id."""
        ...

    def mark(
        self,
        action_id: int,
        status: ActionStatus,
        now: float,
        *,
        detail: str = "",
        companion_id: int | None = None,
    ) -> None:
        """Move a row to ``status`` (``companion_id`` kept when None); an unknown id is
        ignored."""
        ...

    def get(self, action_id: int) -> JournalEntry | None: ...

    def open_actions(self) -> tuple[JournalEntry, ...]:
        """Rows ``intent`` or ``waiting``, in id order."""
        ...

    def actions_for(self, job_id: int) -> tuple[JournalEntry, ...]: ...

    def all_actions(self) -> tuple[JournalEntry, ...]: ...

    def last_resize_at(self, job_ids: Iterable[int] | None = None) -> dict[int, float]:
        """Per job, when its last shrink or grow attempt ended, whatever its outcome
        (applied, failed, refused, retry or rolled back): cooldown counts from here, across
        restarts, and a job whose agent refused is not asked again at once.  ``job_ids`` limits the
        answer to those jobs."""
        ...

    def grow_failures(self, job_id: int, limit: int = 100) -> tuple[int, float | None, str]:
        """(how many of the job's last grows failed in a row, when the newest of them
        failed, its detail), counted back from the newest ``applied`` or ``failed`` grow
        to one still applied (rolled-back grows count neither way); ``(0, None, "")``
        when the newest did not fail.  At most ``limit`` grows are looked at."""
        ...

    def shrunk_jobs(self) -> set[int]:
        """Jobs whose own allocation an applied shrink cut (``parent_nodes`` below
        ``parent_from``; the row's ``to_nodes`` / ``from_nodes`` when it lacks them)."""
        ...

    def reconfigured_jobs(self) -> set[int]:
        """Jobs with a ``reconfigure`` row applied or failed."""
        ...

    def refusals(self) -> tuple[Refusal, ...]:
        """The newest refusal per job and kind (``newest_refusals``); rows go with
        ``prune`` like any closed row."""
        ...

    def retries(self) -> tuple[Retry, ...]:
        """The run of ``retry`` rows each job and kind ends with (``pending_retries``)."""
        ...

    def prune(self, before: float, keep_jobs: Collection[int] = ()) -> int:
        """Delete closed action rows updated before ``before`` and companion links ended
        before it; open rows are never pruned, nor the rows and links of ``keep_jobs`` (the
        jobs Slurm still has: their guards read them, whatever their age).  Returns how
        many rows went."""
        ...

    def link_companion(
        self, parent_id: int, companion_id: int, nodes: int, action_id: int | None, now: float
    ) -> None:
        """Link a companion to its parent; a companion already linked keeps its link."""
        ...

    def end_companion(self, companion_id: int, now: float) -> None:
        """Note that the companion left the queue (the first end is kept)."""
        ...

    def companions(self, *, active_only: bool = True) -> tuple[CompanionLink, ...]:
        """Links by companion id; only those not ended unless ``active_only=False``."""
        ...

    def remember_specs(self, specs: Mapping[int, ElasticSpec], now: float) -> None:
        """Keep the first spec seen per job (pinning ``NumNodes=n-n`` erases the range)."""
        ...

    def known_specs(self) -> dict[int, ElasticSpec]: ...

    def forget_specs(self, job_ids: Iterable[int]) -> None: ...

    def close(self) -> None: ...


class Journal:
    """The daemon's ``JournalStore``: one SQLite file (``:memory:`` for tests and tools).

    Every method is a query or a write on the file; nothing is kept between calls.  A
    one-statement write runs in autocommit mode, its own transaction, committed (and, with
    ``synchronous=FULL``, on disk) before it returns; writes of several rows are one
    explicit transaction.  The connection is guarded by a lock, so the API thread may
    read while the loop writes.

    Raises:
        StateError: at open, when the state directory cannot be written in or the file is
            not a sound journal (``PRAGMA quick_check``, every action row decoded); from
            any method, when the file cannot be read or written (a full disk, a file made
            read-only, damage found later).  One line naming the file.
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        on_disk = self.path != ":memory:"
        left_over = 0
        if on_disk:
            _check_directory(Path(self.path).parent)
            # Left by a stop that did not close the journal (a kill, a crash): SQLite
            # replays it on open, below.  A clean close folds it in and removes it.
            left_over = _size(Path(self.path + "-wal"))
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise _fault(self.path, exc) from exc
        try:
            self._open_checked(on_disk)
        except StateError:
            self._db.close()
            raise
        if left_over:
            log.warning(
                "journal.recovered",
                path=self.path,
                wal_bytes=left_over,
                detail="not closed cleanly (killed?): every committed write was kept and an"
                " unfinished last one, if any, dropped; open actions are reconciled with Slurm",
            )

    def _open_checked(self, on_disk: bool) -> None:
        with self._access() as db:
            if on_disk:
                db.execute("PRAGMA journal_mode=WAL")
            # FULL: an intent must be on disk before Slurm is told anything.
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            # Reads every page once: a damaged file stops the start, not a later cycle.
            found = [str(row[0]) for row in db.execute("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
            raise _corrupt(self.path, found[0] if found else "no answer from quick_check")
        self.all_actions()  # and every row decodes (raises the same corrupt-journal line)

    @classmethod
    def in_state_dir(cls, state_dir: str | Path) -> Journal:
        return cls(Path(state_dir) / JOURNAL_FILE)

    def close(self) -> None:
        with self._access() as db:
            db.close()

    @contextmanager
    def _access(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; a fault of the file leaves as one StateError."""
        with self._lock:
            try:
                yield self._db
            except (sqlite3.Error, OSError) as exc:
                raise _fault(self.path, exc) from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._access() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # also when COMMIT itself failed (a full disk)
                    db.execute("ROLLBACK")
                raise

    def _rows(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """The rows a query returns, as SQLite typed them (checked where they are decoded)."""
        with self._access() as db:
            return db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------ actions

    def record_intent(
        self,
        action: Action,
        now: float,
        *,
        status: ActionStatus = ActionStatus.INTENT,
        instruction_id: str | None = None,
        deadline: float | None = None,
    ) -> int:
        with self._access() as db:
            cur = db.execute(
                "INSERT INTO actions (job_id, kind, from_nodes, to_nodes, status, created_at,"
                " updated_at, reason, extra, instruction_id, deadline)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    action.job_id,
                    str(action.kind),
                    action.from_nodes,
                    action.to_nodes,
                    str(status),
                    now,
                    now,
                    action.reason,
                    encode_extra(action.extra),
                    instruction_id,
                    deadline,
                ),
            )
            action_id = int(cur.lastrowid or 0)
        log.info("journal.intent", action_id=action_id, job_id=action.job_id, kind=action.kind)
        return action_id

    def mark(
        self,
        action_id: int,
        status: ActionStatus,
        now: float,
        *,
        detail: str = "",
        companion_id: int | None = None,
    ) -> None:
        with self._access() as db:
            db.execute(
                "UPDATE actions SET status=?, updated_at=?, detail=?,"
                " companion_id=COALESCE(?, companion_id) WHERE id=?",
                (str(status), now, detail, companion_id, action_id),
            )
        log.info("journal.mark", action_id=action_id, status=str(status), detail=detail)

    def get(self, action_id: int) -> JournalEntry | None:
        rows = self._select("WHERE id=?", (action_id,))
        return rows[0] if rows else None

    def open_actions(self) -> tuple[JournalEntry, ...]:
        return self._select("WHERE status IN ('intent','waiting') ORDER BY id")

    def actions_for(self, job_id: int) -> tuple[JournalEntry, ...]:
        return self._select("WHERE job_id=? ORDER BY id", (job_id,))

    def all_actions(self) -> tuple[JournalEntry, ...]:
        return self._select("ORDER BY id")

    def last_resize_at(self, job_ids: Iterable[int] | None = None) -> dict[int, float]:
        query = (
            "SELECT job_id, MAX(updated_at) FROM actions"
            " WHERE status IN ('applied','failed','rolled_back','refused','retry')"
            " AND kind IN ('shrink','grow')"
        )
        if job_ids is None:
            rows = self._rows(query + " GROUP BY job_id")
        else:
            # The controller asks about the jobs in the queue: found by the job index,
            # not by a pass over every row the journal keeps.
            ids = list(dict.fromkeys(job_ids))
            rows = []
            for start in range(0, len(ids), _MAX_PARAMS):
                chunk = ids[start : start + _MAX_PARAMS]
                marks = ",".join("?" * len(chunk))
                rows += self._rows(f"{query} AND job_id IN ({marks}) GROUP BY job_id", chunk)
        return {int(job): float(at) for job, at in rows}

    def grow_failures(self, job_id: int, limit: int = 100) -> tuple[int, float | None, str]:
        rows = self._rows(
            "SELECT status, updated_at, detail FROM actions WHERE job_id=? AND kind='grow'"
            " AND status IN ('applied','failed') ORDER BY id DESC LIMIT ?",
            (job_id, limit),
        )
        return failed_in_a_row([(str(s), float(at), str(d)) for s, at, d in rows])

    def shrunk_jobs(self) -> set[int]:
        rows = self._select("WHERE kind='shrink' AND status='applied'")
        return {e.job_id for e in rows if cut_own_allocation(e.action)}

    def reconfigured_jobs(self) -> set[int]:
        rows = self._rows(
            "SELECT DISTINCT job_id FROM actions"
            " WHERE kind='reconfigure' AND status IN ('applied','failed')"
        )
        return {int(r[0]) for r in rows}

    def refusals(self) -> tuple[Refusal, ...]:
        return newest_refusals(self._select("WHERE status='refused' ORDER BY id"))

    def retries(self) -> tuple[Retry, ...]:
        # Only the jobs with a retry row: rare, so the cycle reads a handful of rows.
        return pending_retries(
            self._select(
                "WHERE job_id IN (SELECT job_id FROM actions WHERE status='retry')"
                " AND status NOT IN ('intent','waiting') ORDER BY id"
            )
        )

    def _select(self, where: str, args: Sequence[object] = ()) -> tuple[JournalEntry, ...]:
        rows = self._rows(f"SELECT {_COLUMNS} FROM actions {where}", args)
        try:
            return tuple(_entry(row) for row in rows)
        except (ValueError, TypeError) as exc:  # a row SQLite kept but this code never wrote
            raise _corrupt(self.path, f"unreadable action row: {exc}") from exc

    def prune(self, before: float, keep_jobs: Collection[int] = ()) -> int:
        kept = json.dumps(sorted(keep_jobs))  # one parameter, whatever the number of jobs
        with self._tx() as db:
            gone = db.execute(
                "DELETE FROM actions WHERE status NOT IN ('intent','waiting') AND updated_at < ?"
                " AND job_id NOT IN (SELECT value FROM json_each(?))",
                (before, kept),
            ).rowcount
            gone += db.execute(
                "DELETE FROM companions WHERE ended_at IS NOT NULL AND ended_at < ?"
                " AND parent_id NOT IN (SELECT value FROM json_each(?))",
                (before, kept),
            ).rowcount
        if gone:
            log.info("journal.pruned", rows=gone, before=before)
        return gone

    # ------------------------------------------------------------------ companions

    def link_companion(
        self, parent_id: int, companion_id: int, nodes: int, action_id: int | None, now: float
    ) -> None:
        with self._access() as db:
            db.execute(
                "INSERT OR IGNORE INTO companions (companion_id, parent_id, nodes, action_id,"
                " linked_at) VALUES (?,?,?,?,?)",
                (companion_id, parent_id, nodes, action_id, now),
            )

    def end_companion(self, companion_id: int, now: float) -> None:
        with self._access() as db:
            db.execute(
                "UPDATE companions SET ended_at=? WHERE companion_id=? AND ended_at IS NULL",
                (now, companion_id),
            )

    def companions(self, *, active_only: bool = True) -> tuple[CompanionLink, ...]:
        where = "WHERE ended_at IS NULL" if active_only else ""
        rows = self._rows(
            "SELECT companion_id, parent_id, nodes, action_id, linked_at, ended_at"
            f" FROM companions {where} ORDER BY companion_id"
        )
        return tuple(CompanionLink(*row) for row in rows)

    # ------------------------------------------------------------------ specs

    def remember_specs(self, specs: Mapping[int, ElasticSpec], now: float) -> None:
        if not specs:
            return
        with self._tx() as db:  # one transaction: a first cycle over a long queue, one fsync
            db.executemany(
                "INSERT OR IGNORE INTO specs (job_id, min_nodes, max_nodes, step, gpus_per_node,"
                " resize_cost_s, seen_at) VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        job_id,
                        spec.min_nodes,
                        spec.max_nodes,
                        spec.step,
                        spec.gpus_per_node,
                        spec.resize_cost_s,
                        now,
                    )
                    for job_id, spec in specs.items()
                ],
            )

    def known_specs(self) -> dict[int, ElasticSpec]:
        rows = self._rows(
            "SELECT job_id, min_nodes, max_nodes, step, gpus_per_node, resize_cost_s FROM specs"
        )
        return {int(r[0]): ElasticSpec(*r[1:]) for r in rows}

    def forget_specs(self, job_ids: Iterable[int]) -> None:
        ids = [(job_id,) for job_id in job_ids]
        if ids:
            with self._tx() as db:
                db.executemany("DELETE FROM specs WHERE job_id=?", ids)


# --------------------------------------------------------------------------- rows

# What both stores share: how an action's extra pairs are stored and read back, and the
# two answers derived from rows rather than selected.


def encode_extra(extra: Iterable[Sequence[object]]) -> str:
    """The ``extra`` column: the action's (key, value) pairs as a JSON list of pairs."""
    return json.dumps([list(p) for p in extra])


def decode_action(job_id: Any, kind: Any, frm: Any, to: Any, reason: Any, extra: Any) -> Action:
    """An action as its row's columns read back: ints, the kind by value, string pairs."""
    pairs = tuple((str(k), str(v)) for k, v in json.loads(str(extra)))
    return Action(ActionKind(str(kind)), int(job_id), int(frm), int(to), str(reason), pairs)


def failed_in_a_row(
    newest_first: Sequence[tuple[str, float, str]],
) -> tuple[int, float | None, str]:
    """``grow_failures`` from a job's applied or failed grows as (status, updated_at,
    detail), newest first."""
    count = 0
    for status, _at, _detail in newest_first:
        if status != ActionStatus.FAILED:
            break
        count += 1
    if not count:
        return 0, None, ""
    _status, at, detail = newest_first[0]
    return count, at, detail


def cut_own_allocation(shrink: Action) -> bool:
    """Whether an applied shrink cut the job's own allocation (``NumNodes=``), not only
    its companions.  A row written before shrinks recorded ``parent_from`` counts, to be
    safe."""
    extra = dict(shrink.extra)
    before = int(extra.get("parent_from", shrink.from_nodes))
    return int(extra.get("parent_nodes", shrink.to_nodes)) < before


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    (aid, job_id, kind, frm, to, status, created, updated, reason, detail, extra, iid, dl, comp) = (
        row
    )
    return JournalEntry(
        id=int(aid),
        action=decode_action(job_id, kind, frm, to, reason, extra),
        status=ActionStatus(str(status)),
        created_at=float(created),
        updated_at=float(updated),
        detail=str(detail),
        instruction_id=None if iid is None else str(iid),
        deadline=None if dl is None else float(dl),
        companion_id=None if comp is None else int(comp),
    )


# --------------------------------------------------------------------------- faults


def _check_directory(directory: Path) -> None:
    """The state directory exists (made if need be) and this process can create files in
    it: SQLite needs its ``-wal`` and ``-shm`` files beside the journal."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StateError(
            f"{directory}: cannot write in the state directory: {exc.strerror or exc}"
        ) from exc


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _corrupt(path: str, detail: str) -> StateError:
    return StateError(
        f"{path}: corrupt journal ({detail}); the daemon will not act on it: move it aside"
        " to start with an empty one (docs/security.md, Honest failure)"
    )


def _fault(path: str, exc: sqlite3.Error | OSError) -> StateError:
    """One line naming the file (``database or disk is full``, ``attempt to write a readonly
    database``, ...); damage to the file says what the operator can do."""
    if getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return _corrupt(path, str(exc))
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return StateError(f"{path}: {reason}")
