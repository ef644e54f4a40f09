"""Progress reports received from running jobs, kept per job and bounded.

The HTTP API thread adds reports while the control loop reads them, hence the lock.
Only the most recent ``max_per_job`` reports of each job are kept: the models fit
recent behaviour, and a job that reports every second for a week must not grow the
daemon's memory without bound.  What ``slurm-elastic status`` tells a user about the
whole of their job (the time its resizes saved it so far) is a :class:`Tally`, a few
numbers per job updated with every report.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from slurm_elastic.types import ProgressReport

DEFAULT_MAX_PER_JOB = 512


@dataclass(slots=True)
class Tally:
    """A job's progress since its first report, against the size it started at.

    *Time saved so far* is how much sooner the job got where it is than it would have at
    its first size: ``steps / base_rate - elapsed``, where ``steps`` and ``elapsed`` run from
    the first report to the last, and ``base_rate`` is the job's steps per second measured
    at its first size (step deltas between consecutive reports at that size, the way the
    model measures speed: never the job's own ``samples_per_s``).  Resizes count with
    their cost: steps lost to a restart from a checkpoint, and the time a restart takes,
    lower it.  Negative: the job is behind where it would be (it gave nodes to others).
    Unknown (None) until the first size has been measured.
    """

    first: ProgressReport
    last: ProgressReport
    base_steps: int = 0  # steps measured at the first size...
    base_seconds: float = 0.0  # ...and the time they took

    def add(self, report: ProgressReport) -> None:
        last, self.last = self.last, report
        if report.time < last.time:
            self.last = last  # out of order: keep the newest
            return
        at_first_size = report.nodes == last.nodes == self.first.nodes and report.nodes > 0
        if at_first_size and report.step >= last.step and report.time > last.time:
            self.base_steps += report.step - last.step
            self.base_seconds += report.time - last.time

    def saved_s(self) -> float | None:
        if self.base_steps <= 0 or self.base_seconds <= 0:
            return None
        base_rate = self.base_steps / self.base_seconds
        steps = self.last.step - self.first.step
        return steps / base_rate - (self.last.time - self.first.time)


class ReportStore:
    """The latest progress reports of each job, bounded and thread-safe."""

    def __init__(self, max_per_job: int = DEFAULT_MAX_PER_JOB) -> None:
        if max_per_job < 1:
            raise ValueError(f"max_per_job must be >= 1, got {max_per_job}")
        self._max = max_per_job
        self._lock = threading.Lock()
        self._by_job: dict[int, deque[ProgressReport]] = {}
        self._tallies: dict[int, Tally] = {}

    def add(self, report: ProgressReport) -> None:
        with self._lock:
            queue = self._by_job.get(report.job_id)
            if queue is None:
                queue = self._by_job[report.job_id] = deque(maxlen=self._max)
                self._tallies[report.job_id] = Tally(first=report, last=report)
            else:
                self._tallies[report.job_id].add(report)
            queue.append(report)

    def saved_s(self, job_id: int) -> float | None:
        """The job's time saved so far (:class:`Tally`), None while unknown."""
        with self._lock:
            tally = self._tallies.get(job_id)
            return None if tally is None else tally.saved_s()

    def history(self, job_id: int) -> tuple[ProgressReport, ...]:
        """Oldest first, at most ``max_per_job``."""
        with self._lock:
            return tuple(self._by_job.get(job_id, ()))

    def latest(self, job_id: int) -> ProgressReport | None:
        with self._lock:
            queue = self._by_job.get(job_id)
            return queue[-1] if queue else None

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._by_job.pop(job_id, None)
            self._tallies.pop(job_id, None)

    def job_ids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._by_job))
