"""The status document: what the daemon did last, published after every cycle.

One JSON object, written atomically (temp file + fsync + rename) to ``<state_dir>/status.json``
and served at ``GET /v1/status``.  ``slurm-elastic status`` reads either.  Its shape is
versioned (``"version": 1``); fields are only ever added.

    {
      "version": 1,
      "generated_at": 1795241949.2,          # when this document was made (POSIX s)
      "daemon": {"pid", "started_at", "mode", "policy", "interval_s", "config_files"},
      "cycle": {"count", "ok", "error", "started_at", "finished_at", "duration_s",
                "slurm_calls", "last_ok_at"},
      "plan": {"solver", "status", "objective", "solve_s", "gap", "note", "decisions"} | null,
      "plan.decisions": [ {job_id, current_nodes, target_nodes, partition, rule,
                           predicted_gain, resize_cost, detail, candidates} ],
                 # partition: where a job of several partitions starts (null otherwise)
                 # candidates: every size weighed, [{nodes, steps_per_s, predicted_gain,
                 # resize_cost}] ascending (the job's predicted rate there)
      "jobs": [ {job_id, partition, name, user, state, nodes, min, max, size_step, target,
                 reason, loan, step, samples_per_s, reported_at, saved_s, fallback,
                 measured} ],
                 # measured: [{nodes, steps_per_s}], the rate measured at each size
                 # min/max/size_step null: not elastic; loan: nodes held above the job's
                 # entitlement (null unless a running elastic job); step: the last reported
                 # training step; saved_s: the time resizes saved the job so far
                 # (reports.Tally); fallback: why a job launched stop-free now restarts
                 # (protocol.Fallback; null: it does not)
      "actions": [ {kind, job_id, from_nodes, to_nodes, outcome, detail, ...} ],
      "nodes_on_loan": 3,                      # summed over the jobs' loans
      "reclaims": [ {borrower, waiting_job, nodes, planned_at, freed_at, seconds,
                     detail} ],                # the latest 20 loans given back, newest last
      "gpu_types": {"a100": "a100", "batch": ""}  # partition -> its GPUs' type ("" untyped,
                                               # "mixed"; cluster_state.partition_gpu_types)
    }
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
VERSION = 1


@dataclass(frozen=True, slots=True)
class CycleInfo:
    """When the last cycle ran and how it ended (the status document's ``cycle``)."""

    count: int  # cycles run since the daemon started, failed ones included
    ok: bool
    started_at: float
    finished_at: float
    error: str | None = None
    slurm_calls: int = 0
    last_ok_at: float | None = None  # when the last successful cycle finished

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """Who this daemon is: pid, start time, mode, policy, config files."""

    pid: int
    started_at: float
    mode: str
    policy: str
    interval_s: float
    config_files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CycleContent:
    """What one successful cycle produced, already in wire form (plain JSON values)."""

    jobs: tuple[dict[str, Any], ...] = ()
    plan: dict[str, Any] | None = None
    actions: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def json_safe(value: Any) -> Any:
    """NaN/inf (an unknown or never-ending estimate) become null: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def build_document(
    now: float, daemon: DaemonInfo, cycle: CycleInfo, content: CycleContent
) -> dict[str, Any]:
    """Pure: the status document for one cycle.  A failed cycle keeps the last good content."""
    return json_safe(
        {
            "version": VERSION,
            "generated_at": now,
            "daemon": {
                "pid": daemon.pid,
                "started_at": daemon.started_at,
                "mode": daemon.mode,
                "policy": daemon.policy,
                "interval_s": daemon.interval_s,
                "config_files": list(daemon.config_files),
            },
            "cycle": {
                "count": cycle.count,
                "ok": cycle.ok,
                "error": cycle.error,
                "started_at": cycle.started_at,
                "finished_at": cycle.finished_at,
                "duration_s": round(cycle.duration_s, 6),
                "slurm_calls": cycle.slurm_calls,
                "last_ok_at": cycle.last_ok_at,
            },
            "plan": content.plan,
            "jobs": list(content.jobs),
            "actions": list(content.actions),
            **content.extra,
        }
    )


def age_s(document: dict[str, Any], now: float) -> float:
    """Seconds since the document was generated (inf when it carries no timestamp)."""
    generated = document.get("generated_at")
    return now - float(generated) if isinstance(generated, int | float) else float("inf")


def write_atomic(path: Path, document: dict[str, Any], *, private: bool = False) -> None:
    """Readers see the old document or the new one, never half of one.  ``private``: mode
    0600 (Slurm's PrivateData hides some of it: users read it through the API, which shows
    each what Slurm would), else 0644 (``slurm-elastic status`` runs as any user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(document, indent=1, sort_keys=True, default=str, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=".status.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_document(path: Path) -> dict[str, Any]:
    """Raises OSError / ValueError; the CLI turns them into one-line errors."""
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict) or value.get("version") != VERSION:
        raise ValueError(f"{path} is not a version {VERSION} status document")
    return value
