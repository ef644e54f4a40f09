"""Progress reports to the daemon, from rank 0, without ever slowing or failing training.

``offer()`` only stores the newest report (O(1), no I/O); a daemon thread posts the newest
one every ``interval_s`` with a MUNGE credential (``protocol.post_authenticated``, the
one client implementation).  An unreachable or refusing daemon costs a bounded timeout in
that thread and one log line per outage, never an exception in the training loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.protocol import job_url, post_authenticated

log = structlog.get_logger("slurm_elastic.agent")

Poster = Callable[[str, dict[str, Any]], int]  # (url, body) -> HTTP status


def _post(url: str, body: dict[str, Any]) -> int:
    return post_authenticated(url, body, timeout_s=3.0).status


class ProgressReporter:
    def __init__(
        self,
        api: str,
        job_id: int,
        *,
        interval_s: float = 5.0,
        post: Poster = _post,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = job_url(api, job_id, "report")
        self.interval_s = interval_s
        self._post = post
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._failing = False
        self.sent = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name="slurm-elastic-report", daemon=True)
        self._thread.start()

    def offer(self, **fields: Any) -> None:
        """Queue the newest report (ProgressReport fields except ``job_id``); never blocks."""
        report = {k: v for k, v in fields.items() if v is not None}
        report.setdefault("time", self._clock())
        with self._lock:
            self._pending = report

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is pending (bounded) and stop the thread."""
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _take(self) -> dict[str, Any] | None:
        with self._lock:
            report, self._pending = self._pending, None
            return report

    def _loop(self) -> None:
        while True:
            stopping = self._stopped.is_set()
            report = self._take()
            if report is not None:
                self._send(report)
            if stopping:
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _send(self, report: dict[str, Any]) -> None:
        try:
            status = self._post(self.url, report)
        except (SlurmElasticError, OSError) as exc:
            status, detail = 0, str(exc)
        else:
            detail = f"HTTP {status}"
        if 200 <= status < 300:
            self.sent += 1
            if self._failing:
                log.info("agent.report_recovered", url=self.url)
            self._failing = False
            return
        self.failed += 1
        if not self._failing:  # one line per outage, not one per report
            log.warning("agent.report_failed", url=self.url, detail=detail)
        self._failing = True
