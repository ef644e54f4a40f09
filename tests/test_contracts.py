"""Enums whose text is on the wire: status JSON, metric labels and log events keep the
exact strings they had when they were plain strings."""

from __future__ import annotations

import json

from prometheus_client import generate_latest

from slurm_elastic.actuate.journal import ActionStatus
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.types import ActionOutcome, CycleErrorKind
from tests.test_daemon_controller import make
from tests.test_daemon_controller_data import job, pending, snapshot


def test_the_wire_text_of_outcomes_and_error_kinds() -> None:
    assert [str(o) for o in ActionOutcome] == [
        "applied",
        "waiting",
        "failed",
        "rolled_back",
        "refused",
        "retry",
        "blocked",
        "deferred",
        "shadow",
    ]
    assert [str(k) for k in CycleErrorKind] == ["observe", "stale snapshot", "cycle"]
    # A shrink's journal status becomes its outcome when it ends.
    assert {ActionOutcome(s.value) for s in ActionStatus if not s.is_open} <= set(ActionOutcome)
    assert f"action.{ActionOutcome.ROLLED_BACK}" == "action.rolled_back"


def test_status_json_carries_plain_strings() -> None:
    snap = snapshot([pending(7), job(8, nodes=("n1", "n2", "n3"))])
    ctl, _, _, _ = make(snap, {7: 1, 8: 2}, mode="shadow", agents=(8,))
    result = ctl.run_once(1000.0)
    doc = result.to_json()
    outcomes = [a["outcome"] for a in doc["actions"]]
    assert outcomes == ["shadow", "shadow"] and {type(o) for o in outcomes} == {str}
    assert '"outcome": "shadow"' in json.dumps(doc)


def test_a_failed_cycle_names_its_kind_in_the_error_and_the_metric() -> None:
    ctl, _, _, _ = make(snapshot([pending(7)], taken_at=900.0), {7: 2})
    result = ctl.run_once(1000.0)
    assert result.error == "stale snapshot: 100s old > 60s"
    assert result.error_kind is CycleErrorKind.STALE_SNAPSHOT
    assert "error_kind" not in result.to_json()  # the status document is unchanged
    metrics = DaemonMetrics()
    metrics.record_cycle(ok=False, duration_s=0.1, finished_at=1.0, error_kind=result.error_kind)
    text = generate_latest(metrics.registry).decode()
    assert 'slurm_elastic_errors_total{kind="stale snapshot"} 1.0' in text
