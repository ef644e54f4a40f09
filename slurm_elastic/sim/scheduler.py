"""Slurm-like FIFO + EASY backfill, as a pure function over one partition.

Slurm's main scheduler starts jobs in priority order (here: submit order, Slurm's
``priority/basic``) until the first one that does not fit; the backfill scheduler then
gives that job a reservation at the earliest time enough nodes are free (its *shadow
time*) and starts later jobs now only if they fit now and either end before the shadow
time or use only nodes the reserved job will not need (*extra* nodes).  Run time
estimates are the jobs' real run times at their requested size (the trace has no time
limits; perfect estimates are the usual convention in trace simulators).

A job submitted to several partitions (``sbatch -p t4,a100``) is handled by
:func:`first_fit_easy_backfill`, one pass over every partition at once: Slurm tries each of
the job's partitions and starts it in the first where it can start now, in the job's own
order (the partitions' priority tiers being equal); a job that can start in none gets its
EASY reservation in the one of its partitions where it would start earliest.  With every
job in one partition it starts exactly what :func:`fifo_easy_backfill` starts per
partition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


# Not frozen: a frozen dataclass's __init__ costs about five times more, and the simulator
# builds one per pending job at every scheduling pass; nothing keeps them past the call.
@dataclass(slots=True)
class Waiting:
    """A pending job as the backfill scheduler sees it."""

    job_id: int
    nodes: int
    runtime_s: float  # expected run time once started


@dataclass(slots=True)
class Holding:
    """Nodes a running job holds, and when they are expected back."""

    nodes: int
    end: float  # expected release time; inf when unknown


def fifo_easy_backfill(
    now: float, free: int, waiting: Sequence[Waiting], holding: Sequence[Holding]
) -> list[int]:
    """Ids of the ``waiting`` jobs (priority order) to start now on ``free`` nodes.

    What the pass reads, which a caller may rely on (``Cluster.schedule`` does): free nodes
    never grow during the pass, so a job asking more than ``free`` never starts. Its
    ``runtime_s`` is never read (the caller may leave it ``inf``), and of all such jobs
    only the first matters, as the head whose reservation the backfill keeps (or as one
    skipped behind that head): a caller may leave the others out (``read_by_backfill``).
    """
    started: list[int] = []
    releases = sorted((h.end, h.nodes) for h in holding)
    shadow: float | None = None
    extra = 0
    for job in waiting:
        if shadow is None:
            if job.nodes <= free:
                started.append(job.job_id)
                free -= job.nodes
                releases.append((now + job.runtime_s, job.nodes))
                releases.sort()
                continue
            shadow, extra = _reservation(free, job.nodes, releases)
            continue
        if job.nodes > free:
            continue
        if now + job.runtime_s <= shadow:
            started.append(job.job_id)
            free -= job.nodes
        elif job.nodes <= extra:
            started.append(job.job_id)
            free -= job.nodes
            extra -= job.nodes
    return started


@dataclass(slots=True)
class Candidate:
    """A pending job that may start in any of ``partitions`` (its own order), as the
    multi-partition pass sees it; ``runtime_s`` is its expected run time in each of them
    (aligned with ``partitions``: the partitions' GPUs may differ in speed)."""

    job_id: int
    nodes: int
    partitions: tuple[str, ...]
    runtime_s: tuple[float, ...]


@dataclass(slots=True)
class _Partition:
    """One partition's state during a pass: free nodes, expected releases (running jobs
    and the jobs this pass started before a reservation), and its EASY reservation."""

    free: int
    releases: list[tuple[float, int]]
    size: int  # every node it has: free now or held by a running job
    shadow: float | None = None
    extra: int = 0


def first_fit_easy_backfill(
    now: float,
    free: Mapping[str, int],
    waiting: Sequence[Candidate],
    holding: Mapping[str, Sequence[Holding]],
) -> list[tuple[int, str]]:
    """(job id, partition) of the ``waiting`` jobs (priority order) to start now.

    Per partition this is :func:`fifo_easy_backfill`: until a job is blocked there, jobs
    start while they fit; the first blocked job reserves the earliest time enough nodes are
    free (its shadow time), and later jobs start there only if they end by it or fit in its
    extra nodes.  A job listing several partitions starts in the first of them, in its own
    order, where it may start now by those rules.  If there is none, it reserves in the
    partition, among those of its list not reserved yet, where its shadow time is earliest
    (the first of them on a tie); a partition with fewer nodes than the job asks is never a
    candidate (Slurm does not consider a job in a partition it can never run in).

    ``free``: free nodes per partition (every partition the jobs name); ``holding``: the
    running jobs per partition.  As for :func:`fifo_easy_backfill`, free nodes never grow
    during the pass, so the run time of a job in a partition where it asks more than is
    free at the start is never read (the caller may leave it ``inf``), and a job that asks
    more than is free in each of its partitions matters only for a reservation: such jobs
    may be left out as :func:`read_by_first_fit` says.
    """
    parts = {
        name: _Partition(
            free=count,
            releases=sorted((h.end, h.nodes) for h in holding.get(name, ())),
            size=count + sum(h.nodes for h in holding.get(name, ())),
        )
        for name, count in free.items()
    }
    started: list[tuple[int, str]] = []
    for job in waiting:
        where = _first_fit(now, job, parts)
        if where is not None:
            started.append((job.job_id, where))
        else:
            _reserve(job, parts)
    return started


def _first_fit(now: float, job: Candidate, parts: Mapping[str, _Partition]) -> str | None:
    """Start ``job`` in the first of its partitions where the rules allow it now, if any."""
    for name, runtime in zip(job.partitions, job.runtime_s, strict=True):
        part = parts[name]
        if job.nodes > part.free:
            continue
        if part.shadow is None:
            part.releases.append((now + runtime, job.nodes))
            part.releases.sort()
        elif now + runtime <= part.shadow:
            pass  # ends before the reserved job needs the nodes
        elif job.nodes <= part.extra:
            part.extra -= job.nodes
        else:
            continue
        part.free -= job.nodes
        return name
    return None


def _reserve(job: Candidate, parts: Mapping[str, _Partition]) -> None:
    """The blocked ``job``'s EASY reservation: the earliest among its unreserved partitions
    that can hold it (``min`` keeps the first of equal shadow times: the job's order)."""
    options = [
        (*_reservation(parts[name].free, job.nodes, parts[name].releases), name)
        for name in job.partitions
        if parts[name].shadow is None and job.nodes <= parts[name].size
    ]
    if options:
        shadow, extra, name = min(options, key=lambda o: o[0])
        parts[name].shadow, parts[name].extra = shadow, extra


def read_by_first_fit(
    jobs: Sequence[tuple[int, tuple[str, ...]]],
    free: Mapping[str, int],
    size: Mapping[str, int],
) -> list[int]:
    """Indices of the jobs (``(nodes asked, partitions)``, priority order) whose presence
    can change what :func:`first_fit_easy_backfill` starts on ``free`` nodes, ``size``
    being every node of each partition (free or held by the running jobs it is given).

    A job that fits in the free nodes of one of its partitions is kept.  One that fits in
    none of them can only set a reservation, in a partition of its list large enough for
    it (its *candidates*), and is left out once all of those are surely reserved: a
    blocked job reserves one of its candidates or finds them all reserved, so after as
    many kept blocked jobs with exactly its candidates as there are candidates, they are
    all reserved.  With one partition per job, each as large as the job, this keeps what
    :func:`read_by_backfill` keeps."""
    kept: list[int] = []
    blocked: dict[frozenset[str], int] = {}
    reserved: set[str] = set()
    for i, (nodes, partitions) in enumerate(jobs):
        if any(nodes <= free[p] for p in partitions):
            kept.append(i)
            continue
        candidates = frozenset(p for p in partitions if nodes <= size[p])
        if candidates <= reserved:
            continue  # also when there is none: the job can never run in its partitions
        kept.append(i)
        blocked[candidates] = blocked.get(candidates, 0) + 1
        if blocked[candidates] >= len(candidates):
            reserved |= candidates
    return kept


def read_by_backfill(requests: Sequence[int], free: int) -> list[int]:
    """Indices of the jobs (``requests``: nodes asked, priority order) whose presence can
    change what ``fifo_easy_backfill`` starts on ``free`` nodes: each that fits in ``free``
    and the first that does not."""
    kept: list[int] = []
    head_seen = False
    for i, nodes in enumerate(requests):
        if nodes <= free:
            kept.append(i)
        elif not head_seen:
            kept.append(i)
            head_seen = True
    return kept


def _reservation(free: int, need: int, releases: list[tuple[float, int]]) -> tuple[float, int]:
    """(shadow time, extra nodes) for a head job needing ``need`` nodes."""
    available = free
    for end, nodes in releases:
        available += nodes
        if available >= need:
            return end, available - need
    # Not enough nodes will ever be released (the job is larger than what is running
    # plus free); nothing can be promised, so only jobs ending "before never" backfill.
    return math.inf, 0
