"""The simulator's journal store: the journal's rows in dicts, nothing on disk.

The simulator runs the daemon's controller for tens of thousands of cycles; there the
daemon's SQLite journal (``actuate.journal.Journal``), a few queries a cycle, is a quarter
of the run.  ``MemoryJournal`` keeps the same rows, answers every ``JournalStore`` query
the same (``tests/test_journal.py`` runs one scenario on both and compares every answer),
and is never used by the daemon: a simulated cluster has nothing to recover after a crash.

The rows are stored once, as the daemon's store reads them back (``decode_action``:
ints, the kind by value, string pairs); indexes beside them answer the queries read
every cycle without a pass over every row: ids of open rows, of refused and retry rows, ids per
job, each job's last resize end, ids of links not ended, and closed rows and ended links
by age (for ``prune``).  (A prune keeps every row within the accounting
look-back, 30 days by default, so a pass over every row each cycle grows with the trace:
at 10,000 jobs a third of the run went in ``refusals``.)  They change only in ``_put_row``,
``_put_link`` and ``prune``.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace

from slurm_elastic.actuate.journal import (
    ActionStatus,
    CompanionLink,
    JournalEntry,
    Refusal,
    Retry,
    cut_own_allocation,
    decode_action,
    encode_extra,
    failed_in_a_row,
    newest_refusals,
    pending_retries,
)
from slurm_elastic.types import Action, ActionKind, ElasticSpec

_RESIZES = (ActionKind.SHRINK, ActionKind.GROW)


class MemoryJournal:
    """A ``JournalStore`` in memory, for one simulation (one thread).  Raises nothing of
    its own: there is no file to fail."""

    def __init__(self) -> None:
        self._rows: dict[int, JournalEntry] = {}  # by id; ids only grow: in id order
        self._last_id = 0  # never reused, like SQLite's AUTOINCREMENT
        self._open: set[int] = set()  # ids of rows intent or waiting
        self._refused: set[int] = set()  # ids of rows refused
        self._retry: set[int] = set()  # ids of rows retry
        # (updated_at, id) of every row put closed, and (ended_at, companion id) of every
        # link put ended, oldest first: a prune pops what is older than its limit instead of
        # passing over every row.  An entry whose row changed since is stale and dropped.
        self._closed_by_age: list[tuple[float, int]] = []
        # Per job, when its last shrink or grow ended (the answer of ``last_resize_at``),
        # worked out again from the job's rows whenever one of its resize rows is put or
        # pruned: read for every elastic job each cycle, written far less often.
        self._last_resize: dict[int, float] = {}
        self._ended_by_age: list[tuple[float, int]] = []
        self._by_job: dict[int, list[int]] = {}  # job id -> its rows' ids, in id order
        self._links: dict[int, CompanionLink] = {}  # by companion id
        self._active: set[int] = set()  # companion ids of links not ended
        self._specs: dict[int, ElasticSpec] = {}

    def close(self) -> None:
        """Nothing to release."""

    def _put_row(self, entry: JournalEntry) -> None:
        """Store a new or changed row, and keep the indexes in step with it."""
        if entry.id not in self._rows:
            self._by_job.setdefault(entry.job_id, []).append(entry.id)
        self._rows[entry.id] = entry
        for index, member in (
            (self._open, entry.status.is_open),
            (self._refused, entry.status is ActionStatus.REFUSED),
            (self._retry, entry.status is ActionStatus.RETRY),
        ):
            if member:
                index.add(entry.id)
            else:
                index.discard(entry.id)
        if not entry.status.is_open:
            heapq.heappush(self._closed_by_age, (entry.updated_at, entry.id))
        if entry.kind in _RESIZES:
            self._resize_ends_changed(entry.job_id)

    def _resize_ends_changed(self, job_id: int) -> None:
        ends = [
            e.updated_at
            for e in map(self._rows.__getitem__, self._by_job.get(job_id, ()))
            if e.kind in _RESIZES and not e.status.is_open
        ]
        if ends:
            self._last_resize[job_id] = max(ends)
        else:
            self._last_resize.pop(job_id, None)

    def _put_link(self, link: CompanionLink) -> None:
        self._links[link.companion_id] = link
        if link.ended_at is None:
            self._active.add(link.companion_id)
        else:
            self._active.discard(link.companion_id)
            heapq.heappush(self._ended_by_age, (link.ended_at, link.companion_id))

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
        self._last_id += 1
        # Stored as the SQLite store reads it back (e.g. a list extra as string pairs).
        stored = decode_action(
            action.job_id,
            str(action.kind),
            action.from_nodes,
            action.to_nodes,
            action.reason,
            encode_extra(action.extra),
        )
        self._put_row(
            JournalEntry(
                id=self._last_id,
                action=stored,
                status=ActionStatus(status),
                created_at=float(now),
                updated_at=float(now),
                instruction_id=None if instruction_id is None else str(instruction_id),
                deadline=None if deadline is None else float(deadline),
            )
        )
        return self._last_id

    def mark(
        self,
        action_id: int,
        status: ActionStatus,
        now: float,
        *,
        detail: str = "",
        companion_id: int | None = None,
    ) -> None:
        entry = self._rows.get(action_id)
        if entry is None:
            return
        self._put_row(
            replace(
                entry,
                status=ActionStatus(status),
                updated_at=float(now),
                detail=str(detail),
                companion_id=entry.companion_id if companion_id is None else int(companion_id),
            )
        )

    def get(self, action_id: int) -> JournalEntry | None:
        return self._rows.get(action_id)

    def open_actions(self) -> tuple[JournalEntry, ...]:
        return tuple(self._rows[i] for i in sorted(self._open))

    def actions_for(self, job_id: int) -> tuple[JournalEntry, ...]:
        return tuple(self._rows[i] for i in self._by_job.get(job_id, ()))

    def all_actions(self) -> tuple[JournalEntry, ...]:
        return tuple(self._rows.values())

    def last_resize_at(self, job_ids: Iterable[int] | None = None) -> dict[int, float]:
        if job_ids is None:
            return dict(self._last_resize)
        last = self._last_resize
        return {job_id: last[job_id] for job_id in job_ids if job_id in last}

    def grow_failures(self, job_id: int, limit: int = 100) -> tuple[int, float | None, str]:
        grows = [
            (str(e.status), e.updated_at, e.detail)
            for e in reversed(self.actions_for(job_id))
            if e.kind is ActionKind.GROW and e.status in (ActionStatus.APPLIED, ActionStatus.FAILED)
        ]
        return failed_in_a_row(grows[:limit])

    def shrunk_jobs(self) -> set[int]:
        return {
            e.job_id
            for e in self._rows.values()
            if e.kind is ActionKind.SHRINK
            and e.status is ActionStatus.APPLIED
            and cut_own_allocation(e.action)
        }

    def reconfigured_jobs(self) -> set[int]:
        return {
            e.job_id
            for e in self._rows.values()
            if e.kind is ActionKind.RECONFIGURE
            and e.status in (ActionStatus.APPLIED, ActionStatus.FAILED)
        }

    def refusals(self) -> tuple[Refusal, ...]:
        return newest_refusals(self._rows[i] for i in sorted(self._refused))

    def retries(self) -> tuple[Retry, ...]:
        jobs = {self._rows[i].job_id for i in self._retry}
        ids = sorted(i for job in jobs for i in self._by_job[job])
        return pending_retries(self._rows[i] for i in ids)

    def prune(self, before: float, keep_jobs: Collection[int] = ()) -> int:
        keep = set(keep_jobs)
        gone = 0
        kept: list[tuple[float, int]] = []  # old enough, but their job is still in Slurm
        while self._closed_by_age and self._closed_by_age[0][0] < before:
            at, i = heapq.heappop(self._closed_by_age)
            entry = self._rows.get(i)
            if entry is None or entry.status.is_open or entry.updated_at != at:
                continue  # stale: deleted, reopened, or put again (a newer entry exists)
            if entry.job_id in keep:
                kept.append((at, i))
                continue
            del self._rows[i]
            self._by_job[entry.job_id].remove(i)
            self._refused.discard(i)
            self._retry.discard(i)
            if entry.kind in _RESIZES:
                self._resize_ends_changed(entry.job_id)
            gone += 1
        kept_links: list[tuple[float, int]] = []
        while self._ended_by_age and self._ended_by_age[0][0] < before:
            at, c = heapq.heappop(self._ended_by_age)
            link = self._links.get(c)
            if link is None or link.ended_at != at:
                continue
            if link.parent_id in keep:
                kept_links.append((at, c))
                continue
            del self._links[c]
            gone += 1
        for heap, back in ((self._closed_by_age, kept), (self._ended_by_age, kept_links)):
            for item in back:
                heapq.heappush(heap, item)
        return gone

    # ------------------------------------------------------------------ companions

    def link_companion(
        self, parent_id: int, companion_id: int, nodes: int, action_id: int | None, now: float
    ) -> None:
        if companion_id not in self._links:
            self._put_link(
                CompanionLink(
                    int(companion_id),
                    int(parent_id),
                    int(nodes),
                    None if action_id is None else int(action_id),
                    float(now),
                )
            )

    def end_companion(self, companion_id: int, now: float) -> None:
        link = self._links.get(companion_id)
        if link is not None and link.ended_at is None:
            self._put_link(replace(link, ended_at=float(now)))

    def companions(self, *, active_only: bool = True) -> tuple[CompanionLink, ...]:
        ids = self._active if active_only else self._links
        return tuple(self._links[c] for c in sorted(ids))

    # ------------------------------------------------------------------ specs

    def remember_specs(self, specs: Mapping[int, ElasticSpec], now: float) -> None:
        for job_id, spec in specs.items():
            self._specs.setdefault(job_id, spec)

    def known_specs(self) -> dict[int, ElasticSpec]:
        return dict(self._specs)

    def forget_specs(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            self._specs.pop(job_id, None)
