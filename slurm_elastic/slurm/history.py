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
    rows without an owner's name are left out (module docstring)."""
    groups: dict[int, list[AcctRecord]] = {}
    for record in records:
        if not record.user.strip():
            continue
        groups.setdefault(record.job_id, []).append(record)
    return tuple(_fold(rows) for rows in groups.values())


def _fold(rows: list[AcctRecord]) -> JobHistory:
    # Chronological order: each record's submission is when that allocation period was
    # created (the resize or requeue time), so it orders resize chains and requeued runs
    # alike; ties keep sacct's order.
    ordered = sorted(
        rows, key=lambda r: r.submit_time if r.submit_time is not None else float("-inf")
    )
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
