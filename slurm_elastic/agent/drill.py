"""Resize drills: move a running elastic job to a chosen size through the daemon's own path.

Everything after the decision is the daemon's code: the decision becomes actions through
``actuate.diff``, is checked by the guard rails' hard limits (min/max, batch host), and is
applied by ``actuate.executor.Executor`` with a journal, the ``InstructionBoard`` served
by the daemon's HTTP API (MUNGE-authenticated acks and reports), and the Slurm CLI backend:
graceful shrink = instruction -> ack -> ``scontrol update NumNodes``, grow = companion job.
Only the *choice* of size is the caller's instead of the policy's, which makes the drill
useful to operators ("does my job survive a resize?"), to the end-to-end tests and to the
resize benchmark.  It never touches a job that is not marked elastic (``classify``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from slurm_elastic.actuate.diff import diff
from slurm_elastic.actuate.executor import ActionRecord, Executor
from slurm_elastic.actuate.guards import GuardKnobs, block_reason
from slurm_elastic.actuate.state import Classification, classify
from slurm_elastic.daemon.api import ApiContext, ApiServer
from slurm_elastic.daemon.instructions import InstructionBoard
from slurm_elastic.daemon.journal import Journal
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.errors import AgentError
from slurm_elastic.marker import resolve_spec
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import (
    ClusterSnapshot,
    Decision,
    Explanation,
    Plan,
    ProgressReport,
    SolverStatus,
)

log = structlog.get_logger("slurm_elastic.agent")


@dataclass(frozen=True, slots=True)
class DrillResult:
    job_id: int
    from_nodes: int
    to_nodes: int
    decided_at: float  # when the resize was decided (the clock the benchmark starts)
    outcome: str  # "applied" | "rolled_back" | "failed"
    detail: str
    companion_id: int | None = None


class ResizeDrill:
    def __init__(
        self,
        backend: SlurmBackend,
        *,
        port: int = 0,
        ack_timeout_s: float = 60.0,
        agent_command: str = "slurm-elastic run",
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.poll_s = poll_s
        self.reports = ReportStore()
        self.board = InstructionBoard()
        self.journal = Journal(":memory:")
        self.knobs = GuardKnobs(enforce=True, ack_timeout_s=ack_timeout_s)
        self.executor = Executor(
            backend, self.journal, self.board, self.knobs, agent_command=agent_command
        )
        self._latest: ClusterSnapshot | None = None
        context = ApiContext(
            reports=self.reports,
            board=self.board,
            metrics=DaemonMetrics(),
            owner_of=self._owner_of,
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
        return self

    def __exit__(self, *_exc: object) -> None:
        self.api.stop()

    def reports_of(self, job_id: int) -> tuple[ProgressReport, ...]:
        return self.reports.history(job_id)

    # ------------------------------------------------------------------ observe

    def classify(self) -> Classification:
        snapshot = self.backend.read_cluster(self.clock())
        self._latest = snapshot
        return classify(
            snapshot, lambda job: resolve_spec(job.comment, job.min_nodes, job.max_nodes)
        )

    def _owner_of(self, job_id: int) -> int | None:
        for attempt in range(2):
            snapshot = self._latest
            if attempt or snapshot is None:
                snapshot = self._latest = self.backend.read_cluster(self.clock())
            for job in snapshot.jobs:
                if job.job_id == job_id:
                    return job.user_id
        return None

    # ------------------------------------------------------------------ act

    def resize(self, job_id: int, target: int, *, timeout_s: float = 120.0) -> DrillResult:
        """Shrink (graceful, waits for the ack and the update) or grow (submits a companion)."""
        decided_at = self.clock()
        cls = self.classify()
        ej = cls.elastic.get(job_id)
        if ej is None:
            raise AgentError(f"job {job_id} is not a running elastic job")
        decision = Decision(job_id, ej.effective_nodes, target, Explanation(0.0, 0.0, "drill"))
        plan = Plan((decision,), "drill", SolverStatus.OPTIMAL, 0.0)
        actions = [a for a in diff(plan, cls, {}) if a.job_id == job_id]
        if not actions:
            raise AgentError(f"job {job_id} already has {ej.effective_nodes} nodes")
        action = actions[0]
        why = block_reason(action, ej, self.knobs, decided_at)
        if why is not None:
            raise AgentError(f"resize of job {job_id} to {target} nodes refused: {why}")
        log.info("drill.resize", job_id=job_id, from_nodes=ej.effective_nodes, to_nodes=target)
        record = self.executor.apply(action, cls.elastic, decided_at)
        deadline = decided_at + timeout_s
        while record.outcome == "waiting" and self.clock() < deadline:
            time.sleep(self.poll_s)
            records = self.executor.advance_shrinks(self.classify().elastic, self.clock())
            record = next((r for r in records if r.action.job_id == job_id), record)
        return self._result(record, decided_at)

    def _result(self, record: ActionRecord, decided_at: float) -> DrillResult:
        companion = None
        if record.outcome == "applied" and record.detail.startswith("grow: companion "):
            companion = int(record.detail.split()[2])
        return DrillResult(
            job_id=record.action.job_id,
            from_nodes=record.action.from_nodes,
            to_nodes=record.action.to_nodes,
            decided_at=decided_at,
            outcome=record.outcome,
            detail=record.detail,
            companion_id=companion,
        )
