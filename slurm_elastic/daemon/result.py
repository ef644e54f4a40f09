"""What one control cycle produced: the result the service publishes, and the status rows.

``CycleResult`` is the controller's answer to ``run_once(now)``; the service turns it into
the status document, metrics and log lines, and ``slurm-elastic plan``/``explain`` print it.
``status_rows`` gives every active job one REASON: the last word of this cycle's actions
on it, else why it is frozen, else what the plan says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_elastic.actuate.executor import ActionRecord
from slurm_elastic.cluster_state import Classification, ElasticJob, partition_gpu_types
from slurm_elastic.types import (
    ActionKind,
    ActionOutcome,
    ClusterSnapshot,
    CycleErrorKind,
    ElasticSpec,
    Explanation,
    JobView,
    Plan,
)


@dataclass(frozen=True, slots=True)
class JobStatusRow:
    """One line of ``slurm-elastic status``."""

    job_id: int
    partition: str
    name: str
    user: str
    state: str
    nodes: int
    min_nodes: int | None
    max_nodes: int | None
    target: int | None
    reason: str
    # The marker's step: the sizes are min, min + size_step, ... (elastic jobs only).  Not
    # "step", which the status document gives the job's last reported training step.
    size_step: int | None = None
    loan: int | None = None  # nodes held above its entitlement (running elastic jobs)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "partition": self.partition,
            "name": self.name,
            "user": self.user,
            "state": self.state,
            "nodes": self.nodes,
            "min": self.min_nodes,
            "max": self.max_nodes,
            "size_step": self.size_step,
            "target": self.target,
            "reason": self.reason,
            "loan": self.loan,
        }


@dataclass(frozen=True, slots=True)
class RowInputs:
    """What ``status_rows`` reads beyond a cycle's result's own ``plan`` and ``actions``:
    kept by the result, turned into rows when read."""

    cls: Classification
    frozen: Mapping[int, str]
    loans: Mapping[int, int] = field(default_factory=dict)  # running elastic job -> on loan


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A loan given back: the borrower's shrink was applied for a pending job.

    ``seconds`` runs from the cycle that first planned it (the shrink's journal entry) to
    the cycle that applied it: the checkpoint wait, and the nodes free from then on."""

    borrower: int
    waiting_job: int
    nodes: int  # given back
    planned_at: float
    freed_at: float
    detail: str

    @property
    def seconds(self) -> float:
        return self.freed_at - self.planned_at

    def to_json(self) -> dict[str, Any]:
        return {
            "borrower": self.borrower,
            "waiting_job": self.waiting_job,
            "nodes": self.nodes,
            "planned_at": self.planned_at,
            "freed_at": self.freed_at,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class CycleResult:
    """``jobs`` (the status rows) is built on first read from ``rows_from`` with the
    result's ``plan`` and ``actions``: the service
    reads it once per cycle for the status document, the simulator never (building every
    row of every cycle was ~2% of a 1,000-job simulation)."""

    now: float
    ok: bool
    error: str | None
    duration_s: float
    slurm_calls: int  # Slurm read calls of this cycle's snapshot
    history_calls: int  # accounting reads this cycle: sacct + sacctmgr (QOS); 0 on most
    snapshot_age_s: float | None
    mode: str
    error_kind: CycleErrorKind | None = None  # the head of ``error``, for the metric's label
    plan: Plan | None = None
    actions: tuple[ActionRecord, ...] = ()
    rows_from: RowInputs | None = None
    explanations: Mapping[int, Explanation] = field(default_factory=dict)
    reclaims: tuple[Reclaim, ...] = ()  # loans given back this cycle
    nodes_on_loan: int = 0  # after this cycle's plan was made (before its shrinks)
    # The snapshot and the configured types (``cluster.gpu_types``) that ``gpu_types`` reads
    # when asked: the service asks once per cycle, the simulator never.
    gpu_types_from: tuple[ClusterSnapshot, Mapping[str, str]] | None = None
    _rows: tuple[JobStatusRow, ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def jobs(self) -> tuple[JobStatusRow, ...]:
        """One status row per active job (none for a failed cycle)."""
        rows = self._rows
        if rows is None:
            src, plan = self.rows_from, self.plan
            if src is None:
                rows = ()
            else:
                assert plan is not None  # a result with rows has its plan
                rows = status_rows(src.cls, plan, src.frozen, self.actions, src.loans)
            object.__setattr__(self, "_rows", rows)
        return rows

    @property
    def gpu_types(self) -> Mapping[str, str]:
        """Partition -> the type of its GPUs (``cluster_state.partition_gpu_types``)."""
        if self.gpu_types_from is None:
            return {}
        snapshot, configured = self.gpu_types_from
        return partition_gpu_types(snapshot, configured)

    @property
    def job_count(self) -> int:
        """``len(self.jobs)`` without building the rows (one row per active job)."""
        src = self.rows_from
        return 0 if src is None else len(src.cls.jobs)

    @property
    def applied(self) -> tuple[ActionRecord, ...]:
        return tuple(r for r in self.actions if r.outcome is ActionOutcome.APPLIED)

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "now": self.now,
            "ok": self.ok,
            "error": self.error,
            "duration_s": self.duration_s,
            "slurm_calls": self.slurm_calls,
            "history_calls": self.history_calls,
            "snapshot_age_s": self.snapshot_age_s,
            "mode": self.mode,
            "plan": None
            if plan is None
            else {
                "solver": plan.solver,
                "status": str(plan.status),
                "objective": plan.objective,
                "gap": plan.gap,
                "solve_s": plan.solve_s,
                "note": plan.note,
                "decisions": [
                    {
                        "job_id": d.job_id,
                        "current_nodes": d.current_nodes,
                        "target_nodes": d.target_nodes,
                        "partition": d.partition,
                        "predicted_gain": d.explanation.predicted_gain,
                        "resize_cost": d.explanation.resize_cost,
                        "rule": d.explanation.rule,
                        "detail": d.explanation.detail,
                        "candidates": [
                            {
                                "nodes": c.nodes,
                                "steps_per_s": c.steps_per_s,
                                "predicted_gain": c.predicted_gain,
                                "resize_cost": c.resize_cost,
                            }
                            for c in (plan.weighed.of(i) if plan.weighed else ())
                        ],
                    }
                    for i, d in enumerate(plan.decisions)
                ],
            },
            "actions": [r.to_json() for r in self.actions],
            "jobs": [row.to_json() for row in self.jobs],
            "reclaims": [r.to_json() for r in self.reclaims],
            "nodes_on_loan": self.nodes_on_loan,
            "gpu_types": dict(self.gpu_types),
        }


def status_rows(
    cls: Classification,
    plan: Plan,
    frozen: Mapping[int, str],
    records: Sequence[ActionRecord],
    loans: Mapping[int, int] | None = None,
) -> tuple[JobStatusRow, ...]:
    by_job: dict[int, str] = {}
    for rec in records:
        # The last word on a job wins: an applied action over an earlier blocked one.
        by_job[rec.action.job_id] = _record_reason(rec)
    targets = plan.targets()
    rows: list[JobStatusRow] = []
    for job_id, job in sorted(cls.jobs.items()):
        ej = cls.elastic.get(job_id)
        if ej is None:
            reason = by_job.get(job_id) or cls.not_elastic.get(job_id, "not elastic")
            rows.append(_row(job, job.node_count, None, None, reason))
            continue
        target = targets.get(job_id)
        reason = by_job.get(job_id) or frozen.get(job_id) or _plan_reason(ej, target)
        nodes = ej.effective_nodes if job.is_running else job.node_count
        loan = (loans or {}).get(job_id, 0) if job.is_running else None
        rows.append(_row(job, nodes, ej.spec, target, reason, loan))
    return tuple(rows)


def _row(
    job: JobView,
    nodes: int,
    spec: ElasticSpec | None,
    target: int | None,
    reason: str,
    loan: int | None = None,
) -> JobStatusRow:
    return JobStatusRow(
        job.job_id,
        job.partition,
        job.name,
        job.user,
        job.state.value,
        nodes,
        None if spec is None else spec.min_nodes,
        None if spec is None else spec.max_nodes,
        target,
        reason,
        None if spec is None else spec.step,
        loan,
    )


def _record_reason(rec: ActionRecord) -> str:
    a = rec.action
    change = f"{a.kind.value} {a.from_nodes}->{a.to_nodes}"
    outcome = rec.outcome
    if outcome is ActionOutcome.BLOCKED:
        return f"blocked: {rec.detail}"
    if outcome is ActionOutcome.SHADOW:
        return f"shadow: would {change}"
    if outcome is ActionOutcome.DEFERRED:
        return f"deferred: {change} (max resizes per cycle)"
    grow_started = a.kind is ActionKind.GROW and outcome is ActionOutcome.APPLIED
    if outcome is ActionOutcome.WAITING or grow_started:
        return rec.detail  # "shrinking: awaiting ack", "grow: companion 123 pending"
    return f"{change} {rec.outcome}: {rec.detail}"


def _plan_reason(ej: ElasticJob, target: int | None) -> str:
    if target is None:
        return "not planned"
    if ej.job.is_pending:
        return "pending: no room at min size" if target == 0 else f"pending: start at {target}"
    return "at target" if target == ej.effective_nodes else f"target {target}"
