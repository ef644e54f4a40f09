"""Collapse sacct's per-allocation records into one logical job.

Slurm writes a resized job to accounting several times under one job id: one
``RESIZING`` record per earlier allocation, then the current/final one.  The
records' own times are awkward (measured on 22.05.8): every record carries the
job's *original* start, and a later record's ``submission`` is the resize time.
So each allocation period following a RESIZING record is taken to run from that
record's end to its own end.  A requeued job likewise has one ``REQUEUED``
record per earlier run (``sacct -D``, and always in ``--json``); those runs are
separate allocations with their own start.

Both the JSON and the ``sacct -p`` parser produce :class:`AcctRecord` rows (through
:func:`records`, which leaves out a row that does not parse instead of failing the read)
and hand them to :func:`collapse`.  A row whose owner Slurm does not name (no ``user``:
the uid it recorded has no name) counts for nobody's history: priors are drawn from the
same user's jobs only (``model.priors``), and an unnamed owner cannot be that user.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.types import Allocation, JobHistory, JobState

log = structlog.get_logger(__name__)

Raw = TypeVar("Raw")


@dataclass(frozen=True, slots=True)
class AcctRecord:
    """One sacct row (one allocation period of a job), before collapsing."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state: JobState
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    node_count: int
    nodes: tuple[str, ...]
    comment: str = ""
    work_dir: str = ""
    het_job_id: int | None = None
    het_job_offset: int | None = None
    original_sluid: str = ""  # Slurm 26.05's OriginalSLUID (JSON): one per job, all records


def records(
    raws: Iterable[Raw], parse: Callable[[Raw, int], AcctRecord | None], what: str
) -> tuple[AcctRecord, ...]:
    """``parse(raw, index)`` of every raw row (None: not an allocation row); a row that
    raises SlurmParseError is left out with a warning.  The history only feeds priors:
    one job's unreadable row must not take the whole look-back window from everyone."""
    kept: list[AcctRecord] = []
    skipped = 0
    for index, raw in enumerate(raws):
        try:
            record = parse(raw, index)
        except SlurmParseError as exc:
            skipped += 1
            if skipped <= 3:  # a few examples; the count says the rest
                log.warning("history.row_skipped", source=what, error=str(exc))
            continue
        if record is not None:
            kept.append(record)
    if skipped:
        log.warning("history.rows_skipped", source=what, skipped=skipped, kept=len(kept))
    return tuple(kept)


def collapse(records: Iterable[AcctRecord]) -> tuple[JobHistory, ...]:
    """Group rows by job id (in first-seen order) and fold each group into a JobHistory;
    rows without an owner's name are left out (module docstring).

    One id can name two jobs in one window (Slurm's job counter reset with its state, or
    wrapped at ``MaxJobId``): the rows of one id are split into the jobs they belong to
    (``_runs``) and only the newest is kept, so that no history ever joins two jobs."""
    groups: dict[int, list[AcctRecord]] = {}
    for record in records:
        if not record.user.strip():
            continue
        groups.setdefault(record.job_id, []).append(record)
    histories = []
    for job_id, rows in groups.items():
        runs = _runs(_chronological(rows))
        if len(runs) > 1:
            log.warning("history.job_id_reused", job_id=job_id, jobs=len(runs))
        histories.append(_fold(runs[-1]))
    return tuple(histories)


def _chronological(rows: list[AcctRecord]) -> list[AcctRecord]:
    # Each record's submission is when that allocation period was created (the resize or
    # requeue time), so it orders resize chains and requeued runs alike; ties keep sacct's
    # order.
    return sorted(rows, key=lambda r: r.submit_time if r.submit_time is not None else -math.inf)


def _runs(ordered: list[AcctRecord]) -> list[list[AcctRecord]]:
    """The jobs behind one job id's rows, oldest first: each row continues the job of the
    row before it (``_continues``) or starts another job under the same id."""
    runs: list[list[AcctRecord]] = []
    for row in ordered:
        if runs and _continues(runs[-1][-1], row):
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


_CHAINED = frozenset({JobState.RESIZING, JobState.REQUEUED})
_SAME_SECOND = 1.0  # sacct's times are whole seconds


def _continues(previous: AcctRecord, row: AcctRecord) -> bool:
    """Whether ``row`` is the next allocation of ``previous``'s job.  Only a record that
    ended in ``RESIZING`` or ``REQUEUED`` has a next one.  After a resize, 26.05 names the
    job (``OriginalSLUID``, the same on every record of a resized job; a requeued run gets
    a new one).  Elsewhere the times tell: the next record is created when the previous
    one ends (measured on 22.05, 24.11 and 26.05, to the second)."""
    if previous.state not in _CHAINED:
        return False
    if previous.state is JobState.RESIZING and previous.original_sluid and row.original_sluid:
        return previous.original_sluid == row.original_sluid
    if previous.end_time is None or row.submit_time is None:
        return True  # nothing says otherwise: keep the rows together, as before
    return abs(row.submit_time - previous.end_time) <= _SAME_SECOND


def _fold(ordered: list[AcctRecord]) -> JobHistory:
    """One job's rows, in ``_chronological`` order, as one JobHistory."""
    allocations: list[Allocation] = []
    previous: AcctRecord | None = None
    for row in ordered:
        # After a RESIZING record the next period starts when that one ended; its own
        # start field still holds the job's original start.
        if previous is not None and previous.state is JobState.RESIZING:
            start = previous.end_time
        else:
            start = row.start_time
        # PENDING rows are failed start attempts (e.g. a het component that could not
        # start with its siblings); rows without nodes never ran.
        if row.state is not JobState.PENDING and row.nodes and start is not None:
            allocations.append(
                Allocation(
                    start=start,
                    end=row.end_time,
                    node_count=row.node_count or len(row.nodes),
                    nodes=row.nodes,
                )
            )
        previous = row
    first, last = ordered[0], ordered[-1]
    comment = next((r.comment for r in reversed(ordered) if r.comment), "")
    return JobHistory(
        job_id=last.job_id,
        name=last.name or first.name,
        user=last.user or first.user,
        account=last.account or first.account,
        partition=last.partition or first.partition,
        state=last.state,
        submit_time=first.submit_time,
        start_time=allocations[0].start if allocations else None,
        end_time=last.end_time,
        comment=comment,
        allocations=tuple(allocations),
        work_dir=last.work_dir or first.work_dir,
        het_job_id=last.het_job_id,
        het_job_offset=last.het_job_offset,
    )
