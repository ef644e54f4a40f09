"""What Slurm shows about the demo's jobs, folded into per-job size timelines.

Sizes come from the queue (``SlurmBackend.read_cluster``), never from what the daemon
intended: a running job's size is its own node count plus the nodes of its running
companion jobs (how it grows).  A pending elastic job whose node range Slurm reports as
``n-n`` (while it was submitted as a range) has been pinned: when it then starts at
``n`` that is a start-at-size.

Pure: snapshots in, events out; the caller owns the clock and the Slurm calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from slurm_elastic.marker import companion_parent
from slurm_elastic.types import ClusterSnapshot, JobState, JobView

START, START_AT_SIZE, SHRINK, GROW, END = "start", "start_at_size", "shrink", "grow", "end"


@dataclass(frozen=True, slots=True)
class Event:
    """One change the demo saw a job go through (start, pin, shrink, grow, end)."""

    t: float  # POSIX time of the observation that showed it
    job_id: int
    kind: str  # START | START_AT_SIZE | SHRINK | GROW | END
    from_nodes: int
    to_nodes: int
    detail: str = ""


@dataclass(slots=True)
class JobTrack:
    """What the demo has seen of one job so far, poll by poll."""

    job_id: int
    name: str
    elastic: bool
    submitted_range: tuple[int, int]
    submit_t: float
    state: str = "PENDING"
    pinned: int | None = None  # last pinned pending size seen
    start_t: float | None = None
    end_t: float | None = None
    size: int = 0  # current observed size (0 while pending / after the end)
    sizes: list[tuple[float, int]] = field(default_factory=list)  # (t, size) at every change
    companions: set[int] = field(default_factory=set)  # companion job ids ever seen
    events: list[Event] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.end_t is not None


def effective_sizes(snapshot: ClusterSnapshot) -> dict[int, int]:
    """Running job id -> own nodes + nodes of its running companions."""
    sizes = {j.job_id: j.node_count for j in snapshot.jobs if j.state is JobState.RUNNING}
    for job in snapshot.jobs:
        parent = companion_parent(job.comment)
        if parent is not None and job.state is JobState.RUNNING and parent in sizes:
            sizes[parent] += job.node_count
    return sizes


def _pinned(job: JobView, submitted: tuple[int, int]) -> int | None:
    pinned = job.max_nodes is not None and job.min_nodes == job.max_nodes
    return job.min_nodes if pinned and submitted[0] != submitted[1] else None


class Observer:
    """Track the demo's jobs across snapshots."""

    def __init__(self) -> None:
        self.tracks: dict[int, JobTrack] = {}

    def track(self, track: JobTrack) -> None:
        self.tracks[track.job_id] = track

    def add(self, snapshot: ClusterSnapshot) -> list[Event]:
        t = snapshot.taken_at
        views = {j.job_id: j for j in snapshot.jobs}
        sizes = effective_sizes(snapshot)
        for job in snapshot.jobs:
            parent = companion_parent(job.comment)
            if parent in self.tracks:
                self.tracks[parent].companions.add(job.job_id)
        new: list[Event] = []
        for tr in self.tracks.values():
            if tr.finished:
                continue
            view = views.get(tr.job_id)
            new += self._step(tr, view, sizes.get(tr.job_id), t)
        return new

    def _step(self, tr: JobTrack, view: JobView | None, size: int | None, t: float) -> list[Event]:
        events: list[Event] = []
        if view is None or view.state.is_finished or view.state is JobState.COMPLETING:
            tr.state = "ENDED" if view is None else view.state.value
            events.append(Event(t, tr.job_id, END, tr.size, 0, tr.state.lower()))
            tr.end_t = t
            self._resize(tr, t, 0)
            tr.events += events
            return events
        tr.state = view.state.value
        if view.is_pending:
            tr.pinned = _pinned(view, tr.submitted_range) or tr.pinned
        elif size is not None:
            if tr.start_t is None:
                tr.start_t = t
                at_size = tr.elastic and tr.pinned == size
                kind = START_AT_SIZE if at_size else START
                detail = f"pinned {size}-{size} while pending" if at_size else ""
                events.append(Event(t, tr.job_id, kind, 0, size, detail))
            elif size != tr.size:
                kind = GROW if size > tr.size else SHRINK
                events.append(Event(t, tr.job_id, kind, tr.size, size))
            self._resize(tr, t, size)
        tr.events += events
        return events

    @staticmethod
    def _resize(tr: JobTrack, t: float, size: int) -> None:
        if size != tr.size or not tr.sizes:
            tr.sizes.append((t, size))
        tr.size = size


def segments(track: JobTrack, until: float) -> list[tuple[float, float, int]]:
    """(start, end, nodes) stretches at one non-zero size."""
    out: list[tuple[float, float, int]] = []
    points = [*track.sizes, (until, 0)]
    for (t0, n), (t1, _) in itertools.pairwise(points):
        if n > 0 and t1 > t0:
            out.append((t0, t1, n))
    return out
