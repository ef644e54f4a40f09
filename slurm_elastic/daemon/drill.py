"""Resize drills: the daemon, with the target size of chosen jobs given by the caller.

``ResizeDrill`` runs the daemon's own control cycle (``daemon.controller.Controller``: one
batched Slurm read, classify, estimate from the jobs' progress reports, guard rails, diff,
the executor with its journal) in a background thread every ``interval_s``, behind the
daemon's HTTP API (MUNGE-authenticated reports and acks, the instruction board).  Only the
*policy* is replaced: jobs named in ``targets`` go to that size, every other job keeps its
own — the same pattern as the controller's live tests — until ``hand_over``, after which
the configured policy decides every job, as the deployed daemon does.  A graceful shrink
is therefore the daemon's instruction -> the job's ack -> ``scontrol update NumNodes``,
and a grow is the daemon's companion job running ``slurm-elastic run --join``.

Useful to operators ("does my job survive a resize?"), to the end-to-end tests and to
``scripts/bench_resize.py``.  The daemon never touches a job that is not marked elastic,
and neither does a drill.  Guard rails that only time or measure (cooldown, dwell,
payback) are off, because the caller decides when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import ActionStatus, Journal, JournalEntry
from slurm_elastic.config import Config
from slurm_elastic.daemon.api import ApiContext, ApiServer
from slurm_elastic.daemon.controller import Controller, CycleResult
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.result import Reclaim
from slurm_elastic.daemon.service import SnapshotTap
from slurm_elastic.errors import AgentError
from slurm_elastic.policy import allocate
from slurm_elastic.policy.fixed import fixed_plan
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import (
    AllocationProblem,
    Plan,
    ProgressReport,
)

log = structlog.get_logger("slurm_elastic.drill")

# Journal statuses that do not end a drill's resize: open, or to be asked again.
_NOT_ENDED = frozenset({ActionStatus.INTENT, ActionStatus.WAITING, ActionStatus.RETRY})


@dataclass(frozen=True, slots=True)
class DrillResult:
    job_id: int
    to_nodes: int
    decided_at: float  # when the target was set (the clock the benchmark starts)
    outcome: str  # the journal status: "applied" | "rolled_back" | "failed" | "refused"
    detail: str
    companion_id: int | None = None


def drill_config(
    state_dir: Path, interval_s: float, ack_timeout_s: float, agent: str, hard_shrink: bool = False
) -> Config:
    return Config.model_validate(
        {
            "mode": "enforce",
            "interval_s": interval_s,
            "state_dir": str(state_dir),
            "slurm": {"sacct_interval_s": 3600, "sacct_lookback_s": 3600},
            "guards": {
                "cooldown_s": 0,
                "min_dwell_s": 0,
                "payback_horizon_s": 0,
                "ack_timeout_s": ack_timeout_s,
                "hard_shrink": hard_shrink,
            },
            "grow": {"agent_command": agent},
        }
    )


class ResizeDrill:
    def __init__(
        self,
        backend: SlurmBackend,
        state_dir: Path,
        *,
        port: int = 0,
        interval_s: float = 0.5,
        ack_timeout_s: float = 60.0,
        agent_command: str = "slurm-elastic run",
        hard_shrink: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self.interval_s = interval_s
        self.config = drill_config(state_dir, interval_s, ack_timeout_s, agent_command, hard_shrink)
        self.reports = ReportStore()
        self.board = InstructionBoard()
        self.journal = Journal.in_state_dir(state_dir)
        self._tap = SnapshotTap(backend)
        self._lock = threading.Lock()
        self._targets: dict[int, int] = {}
        self._handed_over = False
        self.reclaims: list[Reclaim] = []  # every loan given back, in order
        self.controller = Controller(
            self._tap,
            self.config,
            reports=self.reports,
            journal=self.journal,
            agents=self.board,
            allocate=self._allocate,
        )
        self.last: CycleResult | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slurm-elastic-drill", daemon=True)
        context = ApiContext(
            reports=self.reports,
            board=self.board,
            metrics=DaemonMetrics(),
            owner_of=self._tap.owner_of,
            size_of=self.controller.size_of,
            status_document=lambda: None,
            health=lambda _now: (True, "drill"),
            clock=clock,
        )
        self.api = ApiServer(context, "127.0.0.1", port)

    @property
    def url(self) -> str:
        return self.api.url

    def __enter__(self) -> ResizeDrill:
        self.api.start()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.api.stop()
        self.journal.close()

    def reports_of(self, job_id: int) -> tuple[ProgressReport, ...]:
        return self.reports.history(job_id)

    # ------------------------------------------------------------------ the daemon

    def _allocate(self, problem: AllocationProblem, _policy: str) -> Plan:
        with self._lock:
            wanted = dict(self._targets)
            handed_over = self._handed_over
        if handed_over:
            policy = self.config.policy
            return allocate(problem, policy.name, fallback=policy.fallback)
        return fixed_plan(problem, wanted, solver="drill")

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.last = self.controller.run_once(self.clock())
                self.reclaims.extend(self.last.reclaims)
            except Exception as exc:  # a drill must keep cycling, as the daemon does
                log.exception("drill.cycle_failed", error=str(exc))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    # ------------------------------------------------------------------ the caller

    def hand_over(self) -> None:
        """From the next cycle the configured policy (``mip``) decides every job, loans and
        reclaims included, as the deployed daemon does; the drill's targets are dropped."""
        with self._lock:
            self._handed_over = True
            self._targets.clear()
        log.info("drill.handed_over", policy=self.config.policy.name)

    def resize(self, job_id: int, target: int, *, timeout_s: float = 120.0) -> DrillResult:
        """Set the job's target and wait for the daemon's resulting action to end.

        A shrink ends when Slurm applied it (after the job's ack) or was rolled back; a grow
        ends when the companion job is submitted (it then starts and joins on its own).  A
        ``retry`` (Slurm said "not now") is no end: the daemon asks again after its backoff.
        """
        before = max((e.id for e in self.journal.actions_for(job_id)), default=0)
        decided_at = self.clock()
        with self._lock:
            self._targets[job_id] = target
        log.info("drill.target", job_id=job_id, target=target)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            entry = self._settled(job_id, before)
            if entry is not None:
                return DrillResult(
                    job_id=job_id,
                    to_nodes=target,
                    decided_at=decided_at,
                    outcome=str(entry.status),
                    detail=entry.detail,
                    companion_id=entry.companion_id,
                )
            time.sleep(0.1)
        raise AgentError(f"the daemon did not resize job {job_id} within {timeout_s:g} s")

    def _settled(self, job_id: int, after: int) -> JournalEntry | None:
        for entry in self.journal.actions_for(job_id):
            if entry.id > after and entry.status not in _NOT_ENDED:
                return entry
        return None
