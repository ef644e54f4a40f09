"""The action journal: every action is written down before it is applied.

A SQLite file in the state directory (``journal.sqlite``; ``:memory:`` for the
simulator).  Each action row moves through::

    intent ──► applied                 (Slurm accepted it)
       │  └──► failed                  (Slurm refused; nothing changed)
       └─► waiting ──► applied         (shrink: instruction posted, ack awaited)
                  └──► rolled_back     (ack refused / timed out / job changed)

Companion links (parent <-> companion job ids) are kept alongside.  Because the row is
committed before Slurm is called, a daemon killed at any point leaves either an ``intent``
or ``waiting`` row; ``reconcile`` at start-up looks at Slurm and closes each one exactly
once — completed when Slurm shows the effect, rolled back when it does not — so nothing
is repeated and nothing is forgotten.  It also cancels orphan companions.

Faults of the file are one ``StateError`` naming it, never a traceback: a state directory
the daemon cannot write, a full disk, a file that is not a database or fails SQLite's
integrity check.  The daemon then stops (``daemon.service``): it must not act on what it
cannot write down first, and a restart's ``reconcile`` is the recovery path already
designed for a crash.  A torn last write (the daemon killed mid-commit) is SQLite's own
recovery: the write-ahead log keeps every committed transaction and drops an unfinished
one, which was never acted on (an intent is committed before Slurm is called); the first
open after such a stop says so in one ``journal.recovered`` line.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from slurm_elastic.cluster_state import orphan_reason
from slurm_elastic.errors import SlurmError, StateError
from slurm_elastic.marker import companion_parent
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import Action, ActionKind, ClusterSnapshot, ElasticSpec

log = structlog.get_logger("slurm_elastic.journal")

JOURNAL_FILE = "journal.sqlite"
_LAST_RESIZE = (
    "SELECT job_id, MAX(updated_at) FROM actions WHERE status IN ('applied','failed','rolled_back')"
    " AND kind IN ('shrink','grow'){} GROUP BY job_id"
)

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


class ActionStatus(enum.StrEnum):
    INTENT = "intent"
    WAITING = "waiting"
    APPLIED = "applied"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"

    @property
    def is_open(self) -> bool:
        return self in (ActionStatus.INTENT, ActionStatus.WAITING)


@dataclass(frozen=True, slots=True)
class JournalEntry:
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


@dataclass(frozen=True, slots=True)
class CompanionLink:
    companion_id: int
    parent_id: int
    nodes: int
    action_id: int | None
    linked_at: float
    ended_at: float | None = None


@dataclass(slots=True)
class ReconcileReport:
    completed: list[int] = field(default_factory=list)  # action ids now marked applied
    rolled_back: list[int] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)  # companions found and linked
    cancelled: list[int] = field(default_factory=list)  # orphan companions cancelled
    errors: list[str] = field(default_factory=list)


class Journal:
    """Not shared across threads in the daemon, but guarded anyway: cheap and safe."""

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
        self._resized: dict[int, float] | None = None  # last_resize_at's mirror
        # Read every cycle: the open rows are loaded once and kept in step by this
        # object's writes (the daemon is the journal's only writer); the specs are kept
        # until this object writes them again.
        self._open: tuple[JournalEntry, ...] | None = None
        self._specs: dict[int, ElasticSpec] | None = None

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
        kind = str(action.kind)
        row = (
            action.job_id,
            kind,
            action.from_nodes,
            action.to_nodes,
            str(status),
            now,
            now,
            action.reason,
            json.dumps([list(p) for p in action.extra]),
            instruction_id,
            deadline,
        )
        with self._access():
            # One statement in autocommit mode is its own transaction, committed (and,
            # with synchronous=FULL, on disk) before execute returns: the intent is
            # written before the caller acts, as with an explicit BEGIN/COMMIT around it.
            cur = self._db.execute(
                "INSERT INTO actions (job_id, kind, from_nodes, to_nodes, status, created_at,"
                " updated_at, reason, extra, instruction_id, deadline)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                row,
            )
            action_id = int(cur.lastrowid or 0)
            if not status.is_open:
                self._resize_closed(action.job_id, kind, now)
            elif self._open is not None:
                # The newest row, last in id order, as _select would read it back; a plain
                # action reads back as itself (no need to parse what was just written).
                read = action if _reads_back(action) else _action(*row[:4], action.reason, row[8])
                entry = _entry_of(action_id, read, row[4], now, now, "", instruction_id, deadline)
                self._open = (*self._open, entry)
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
        with self._access():
            before = self.open_actions()  # loaded once, then kept in step here
            self._db.execute(  # one statement: its own transaction (see record_intent)
                "UPDATE actions SET status=?, updated_at=?, detail=?,"
                " companion_id=COALESCE(?, companion_id) WHERE id=?",
                (str(status), now, detail, companion_id, action_id),
            )
            # After the write: the in-memory views follow the row.
            i = next((k for k, e in enumerate(before) if e.id == action_id), None)
            if i is None:
                # The row was closed (or is unknown): the open rows change only if it
                # reopens, and its job's last resize is read back from the table.
                if status.is_open:
                    self._open = None
                self._resize_row_changed(action_id)
            elif status.is_open:
                entry = before[i]
                entry = replace(
                    entry,
                    status=ActionStatus(str(status)),
                    updated_at=float(now),
                    detail=str(detail),
                    companion_id=entry.companion_id if companion_id is None else int(companion_id),
                )
                self._open = (*before[:i], entry, *before[i + 1 :])
            else:
                # An open row closes: it leaves the open rows and joins its job's closed ones.
                self._open = (*before[:i], *before[i + 1 :])
                self._resize_closed(before[i].job_id, str(before[i].kind), now)
        log.info("journal.mark", action_id=action_id, status=str(status), detail=detail)

    def get(self, action_id: int) -> JournalEntry | None:
        rows = self._select("WHERE id=?", (action_id,))
        return rows[0] if rows else None

    def open_actions(self) -> tuple[JournalEntry, ...]:
        with self._access():
            if self._open is None:
                self._open = self._select("WHERE status IN ('intent','waiting') ORDER BY id", ())
            return self._open

    def actions_for(self, job_id: int) -> tuple[JournalEntry, ...]:
        return self._select("WHERE job_id=? ORDER BY id", (job_id,))

    def all_actions(self) -> tuple[JournalEntry, ...]:
        return self._select("ORDER BY id", ())

    def last_resize_at(self, job_ids: Iterable[int] | None = None) -> dict[int, float]:
        """Per job, when our last shrink or grow attempt ended, whatever its outcome.

        Cooldown counts from here and survives restarts.  Failed and rolled-back
        attempts count too: a job whose agent refused must not be asked again at once.
        ``job_ids`` limits the answer to those jobs (the controller asks about the jobs in
        the queue).  Read every cycle, so it is answered from a mirror of the table loaded
        on first use and kept in step by this object's writes (the daemon is the journal's
        only writer), not by a pass over every row the journal keeps.
        """
        with self._access():
            if self._resized is None:
                rows = self._db.execute(_LAST_RESIZE.format("")).fetchall()
                self._resized = {int(job): float(at) for job, at in rows}
            known = self._resized
            if job_ids is None:
                return dict(known)
            return {j: known[j] for j in job_ids if j in known}

    def _resize_closed(self, job_id: int, kind: str, at: float) -> None:
        """A closed row of ``job_id`` updated at ``at`` was added to the table: the
        mirror's MAX(updated_at) for the job takes it in (a shrink or grow only)."""
        with self._access():
            if self._resized is None or kind not in ("shrink", "grow"):
                return
            if at != at:  # NaN is stored as NULL, which MAX skips: read the table back
                self._resized = None
                return
            before = self._resized.get(job_id)
            self._resized[job_id] = at if before is None else max(before, at)

    def _resize_row_changed(self, action_id: int) -> None:
        """Refresh the mirror for the job of one written row (a shrink or grow only)."""
        with self._access():
            if self._resized is None:
                return
            row = self._db.execute("SELECT job_id, kind FROM actions WHERE id=?", (action_id,))
            found = row.fetchone()
            if found is None or found[1] not in ("shrink", "grow"):
                return
            job = int(found[0])
            at = self._db.execute(_LAST_RESIZE.format(" AND job_id=?"), (job,)).fetchone()
            if at is None:
                self._resized.pop(job, None)
            else:
                self._resized[job] = float(at[1])

    def grow_failures(self, job_id: int, limit: int = 100) -> tuple[int, float | None, str]:
        """(how many of the job's last grows failed in a row, when the newest of them
        failed, its detail): counted back from the newest grow to one that worked.

        A grow that worked is one still ``applied``: its companion runs, or ran long enough
        (``Executor.note_companion_ends`` turns a companion that failed at once into a
        failed grow).  Rolled-back grows (nothing was submitted) do not count either way.
        Read only for the grows a plan proposes, not every cycle for every job.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT status, updated_at, detail FROM actions WHERE job_id=? AND kind='grow'"
                " AND status IN ('applied','failed') ORDER BY id DESC LIMIT ?",
                (job_id, limit),
            ).fetchall()
        count = 0
        for status, _at, _detail in rows:
            if status != "failed":
                break
            count += 1
        if not count:
            return 0, None, ""
        return count, float(rows[0][1]), str(rows[0][2])

    def shrunk_jobs(self) -> set[int]:
        """Jobs whose own allocation a daemon shrink cut (``NumNodes=``, applied).

        A shrink that only cancelled companions does not count.  Rows written before the
        shrink recorded ``parent_from`` count, to be safe.
        """
        shrunk: set[int] = set()
        for entry in self._select("WHERE kind='shrink' AND status='applied'", ()):
            extra = dict(entry.action.extra)
            before = int(extra.get("parent_from", entry.action.from_nodes))
            if int(extra.get("parent_nodes", entry.action.to_nodes)) < before:
                shrunk.add(entry.job_id)
        return shrunk

    def reconfigured_jobs(self) -> set[int]:
        """Jobs whose ending already had its ``scontrol reconfigure`` tried (applied or failed)."""
        with self._access():
            rows = self._db.execute(
                "SELECT DISTINCT job_id FROM actions"
                " WHERE kind='reconfigure' AND status IN ('applied','failed')"
            ).fetchall()
        return {int(r[0]) for r in rows}

    def _select(self, where: str, args: tuple[object, ...]) -> tuple[JournalEntry, ...]:
        with self._access():
            rows = self._db.execute(
                "SELECT id, job_id, kind, from_nodes, to_nodes, status, created_at, updated_at,"
                " reason, detail, extra, instruction_id, deadline, companion_id"
                f" FROM actions {where}",
                args,
            ).fetchall()
        try:
            return tuple(_entry(row) for row in rows)
        except (ValueError, TypeError) as exc:  # a row SQLite kept but this code never wrote
            raise _corrupt(self.path, f"unreadable action row: {exc}") from exc

    def prune(self, before: float) -> int:
        """Delete closed actions and ended companion links last touched before ``before``.

        Open rows are never pruned: they are what reconcile needs.  Returns rows deleted.
        """
        with self._tx() as db:
            gone = db.execute(
                "DELETE FROM actions WHERE status NOT IN ('intent','waiting') AND updated_at < ?",
                (before,),
            ).rowcount
            gone += db.execute(
                "DELETE FROM companions WHERE ended_at IS NOT NULL AND ended_at < ?", (before,)
            ).rowcount
        self._resized = None  # reloaded on next use
        if gone:
            log.info("journal.pruned", rows=gone, before=before)
        return gone

    # ------------------------------------------------------------------ companions

    def link_companion(
        self, parent_id: int, companion_id: int, nodes: int, action_id: int | None, now: float
    ) -> None:
        with self._access():  # one statement: its own transaction (see record_intent)
            self._db.execute(
                "INSERT OR IGNORE INTO companions (companion_id, parent_id, nodes, action_id,"
                " linked_at) VALUES (?,?,?,?,?)",
                (companion_id, parent_id, nodes, action_id, now),
            )

    def end_companion(self, companion_id: int, now: float) -> None:
        with self._access():  # one statement: its own transaction (see record_intent)
            self._db.execute(
                "UPDATE companions SET ended_at=? WHERE companion_id=? AND ended_at IS NULL",
                (now, companion_id),
            )

    def companions(self, *, active_only: bool = True) -> tuple[CompanionLink, ...]:
        where = "WHERE ended_at IS NULL" if active_only else ""
        with self._access():
            rows = self._db.execute(
                "SELECT companion_id, parent_id, nodes, action_id, linked_at, ended_at"
                f" FROM companions {where} ORDER BY companion_id"
            ).fetchall()
        return tuple(CompanionLink(*row) for row in rows)

    # ------------------------------------------------------------------ specs

    def remember_specs(self, specs: Mapping[int, ElasticSpec], now: float) -> None:
        """Keep the first spec seen per job: pinning ``NumNodes=n-n`` erases the node range.

        One transaction for all of them: a first cycle over a long queue costs one fsync.
        """
        if not specs:
            return
        with self._tx() as db:
            self._specs = None
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
        with self._access():
            if self._specs is None:
                rows = self._db.execute(
                    "SELECT job_id, min_nodes, max_nodes, step, gpus_per_node, resize_cost_s"
                    " FROM specs"
                ).fetchall()
                self._specs = {int(r[0]): ElasticSpec(r[1], r[2], r[3], r[4], r[5]) for r in rows}
            return dict(self._specs)

    def forget_specs(self, job_ids: Iterable[int]) -> None:
        ids = [(job_id,) for job_id in job_ids]
        if ids:
            with self._access():
                with self._tx() as db:
                    db.executemany("DELETE FROM specs WHERE job_id=?", ids)
                # Committed: exactly these keys go (a rolled-back delete leaves the cache).
                if self._specs is not None:
                    for (job_id,) in ids:
                        self._specs.pop(job_id, None)

    # ------------------------------------------------------------------ start-up

    def reconcile(
        self, backend: SlurmBackend, snapshot: ClusterSnapshot, *, act: bool = True
    ) -> ReconcileReport:
        """Close every open action against what Slurm shows, and cancel orphan companions.

        * start_at_size: applied when the job is pinned to (or running at) the size,
          else rolled back — the next cycle decides afresh.
        * grow: applied when a companion of the parent that the journal does not know
          yet is in the queue (submitted just before the crash: adopted), else rolled back.
          Only a job of the parent's owner is adopted: another user's job naming the
          parent in its comment is not ours (``classify`` ignores it as well).
        * shrink: applied when the parent already runs at the target, else rolled back;
          the instruction's deadline lets a waiting agent resume on its own.
        * cancel_companion: applied when the companion is gone, else rolled back (the
          orphan sweep below or the next cycle cancels it again).
        * reconfigure: rolled back (not observable in Slurm); the next cycle repeats it.

        With ``act=False`` (shadow mode) the journal is updated but Slurm is not touched.
        """
        now = snapshot.taken_at
        report = ReconcileReport()
        active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
        linked = {c.companion_id for c in self.companions(active_only=False)}
        for entry in self.open_actions():
            job = active.get(entry.job_id)
            done, why = False, "job has ended"
            if entry.kind is ActionKind.START_AT_SIZE and job is not None:
                if job.is_pending:
                    done = job.min_nodes == entry.action.to_nodes == job.max_nodes
                else:
                    done = job.node_count == entry.action.to_nodes
                why = "pin not visible in Slurm"
            elif entry.kind is ActionKind.GROW and job is not None:
                # Anyone can write a companion comment naming any job: only a job of the
                # parent's owner can be the one our sbatch (run as that owner) created.
                found = [
                    j
                    for j in active.values()
                    if companion_parent(j.comment) == entry.job_id
                    and j.job_id not in linked
                    and j.user == job.user
                ]
                if found:
                    comp = min(found, key=lambda j: j.job_id)
                    self.link_companion(entry.job_id, comp.job_id, comp.node_count, entry.id, now)
                    linked.add(comp.job_id)
                    report.adopted.append(comp.job_id)
                    self.mark(
                        entry.id,
                        ActionStatus.APPLIED,
                        now,
                        detail="adopted",
                        companion_id=comp.job_id,
                    )
                    report.completed.append(entry.id)
                    continue
                why = "no companion was submitted"
            elif entry.kind is ActionKind.SHRINK and job is not None:
                extra = dict(entry.action.extra)
                dropped = [int(c) for c in extra.get("cancel_companions", "").split(",") if c]
                parent_nodes = int(extra.get("parent_nodes", entry.action.to_nodes))
                done = (
                    job.is_running
                    and job.node_count == parent_nodes
                    and not any(c in active for c in dropped)
                )
                why = "shrink not applied before restart"
            elif entry.kind is ActionKind.CANCEL_COMPANION:
                done = job is None
                why = "companion still active"
            elif entry.kind is ActionKind.RECONFIGURE:
                # Slurm keeps no trace of a reconfigure: roll back, so the next cycle
                # issues it again (it is idempotent).
                why = "reconfigure not confirmed before restart"
            if done:
                self.mark(entry.id, ActionStatus.APPLIED, now, detail="reconciled")
                report.completed.append(entry.id)
            else:
                self.mark(entry.id, ActionStatus.ROLLED_BACK, now, detail=f"reconciled: {why}")
                report.rolled_back.append(entry.id)
        self._sweep_companions(backend, snapshot, report, act=act)
        log.info(
            "journal.reconciled",
            completed=report.completed,
            rolled_back=report.rolled_back,
            adopted=report.adopted,
            cancelled=report.cancelled,
        )
        return report

    def _sweep_companions(
        self,
        backend: SlurmBackend,
        snapshot: ClusterSnapshot,
        report: ReconcileReport,
        *,
        act: bool,
    ) -> None:
        now = snapshot.taken_at
        active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
        for link in self.companions():
            if link.companion_id not in active:
                self.end_companion(link.companion_id, now)
        for job in active.values():
            if orphan_reason(job, active) is None or not act:
                continue
            action = Action(
                ActionKind.CANCEL_COMPANION,
                job.job_id,
                job.node_count,
                0,
                reason="orphan at start-up",
            )
            action_id = self.record_intent(action, now)
            try:
                backend.cancel(job.job_id)
            except SlurmError as exc:
                self.mark(action_id, ActionStatus.FAILED, now, detail=str(exc))
                report.errors.append(f"cancel {job.job_id}: {exc}")
                continue
            self.mark(action_id, ActionStatus.APPLIED, now)
            self.end_companion(job.job_id, now)
            report.cancelled.append(job.job_id)


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


def _reads_back(action: Action) -> bool:
    """Whether a row written from ``action`` reads back (``_action``) as this very action:
    plain ints and strings, string pairs (~10 us an intent in the simulator)."""
    return (
        type(action.kind) is ActionKind
        and type(action.job_id) is int
        and type(action.from_nodes) is int
        and type(action.to_nodes) is int
        and type(action.reason) is str
        and type(action.extra) is tuple
        and all(
            type(p) is tuple and len(p) == 2 and type(p[0]) is str and type(p[1]) is str
            for p in action.extra
        )
    )


def _action(
    job_id: object, kind: object, frm: object, to: object, reason: object, extra: object
) -> Action:
    """An action as its row's columns read back (``extra`` is JSON)."""
    pairs = tuple((str(k), str(v)) for k, v in json.loads(str(extra)))
    return Action(ActionKind(str(kind)), int(job_id), int(frm), int(to), str(reason), pairs)  # type: ignore[call-overload]


def _entry(row: tuple[object, ...]) -> JournalEntry:
    (aid, job_id, kind, frm, to, status, created, updated, reason, detail, extra, iid, dl, comp) = (
        row
    )
    action = _action(job_id, kind, frm, to, reason, extra)
    return _entry_of(aid, action, status, created, updated, detail, iid, dl, comp)


def _entry_of(
    aid: object,
    action: Action,
    status: object,
    created: object,
    updated: object,
    detail: object,
    iid: object,
    dl: object,
    comp: object = None,
) -> JournalEntry:
    return JournalEntry(
        id=int(aid),  # type: ignore[call-overload]
        action=action,
        status=ActionStatus(str(status)),
        created_at=float(created),  # type: ignore[arg-type]
        updated_at=float(updated),  # type: ignore[arg-type]
        detail=str(detail),
        instruction_id=None if iid is None else str(iid),
        deadline=None if dl is None else float(dl),  # type: ignore[arg-type]
        companion_id=None if comp is None else int(comp),  # type: ignore[call-overload]
    )
