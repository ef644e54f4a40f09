"""Progress reports received from running jobs, kept per job and bounded.

The HTTP API thread adds reports while the control loop reads them, hence the lock.
Only the most recent ``max_per_job`` reports of each job are kept: the models fit
recent behaviour, and a job that reports every second for a week must not grow the
daemon's memory without bound.
"""

from __future__ import annotations

import threading
from collections import deque

from slurm_elastic.types import ProgressReport

DEFAULT_MAX_PER_JOB = 512


class ReportStore:
    """The latest progress reports of each job, bounded and thread-safe."""

    def __init__(self, max_per_job: int = DEFAULT_MAX_PER_JOB) -> None:
        if max_per_job < 1:
            raise ValueError(f"max_per_job must be >= 1, got {max_per_job}")
        self._max = max_per_job
        self._lock = threading.Lock()
        self._by_job: dict[int, deque[ProgressReport]] = {}

    def add(self, report: ProgressReport) -> None:
        with self._lock:
            queue = self._by_job.get(report.job_id)
            if queue is None:
                queue = self._by_job[report.job_id] = deque(maxlen=self._max)
            queue.append(report)

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

    def job_ids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._by_job))
