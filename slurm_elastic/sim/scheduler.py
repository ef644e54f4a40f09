"""Slurm-like FIFO + EASY backfill, as a pure function over one partition.

Slurm's main scheduler starts jobs in priority order (here: submit order, Slurm's
``priority/basic``) until the first one that does not fit; the backfill scheduler then
gives that job a reservation at the earliest time enough nodes are free (its *shadow
time*) and starts later jobs now only if they fit now and either end before the shadow
time or use only nodes the reserved job will not need (*extra* nodes).  Run time
estimates are the jobs' real run times at their requested size (the trace has no time
limits; perfect estimates are the usual convention in trace simulators).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
