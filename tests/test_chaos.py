"""The chaos run, short: the real daemon SIGKILLed inside and between its actions.

``scripts/chaos.py --kills 20`` is the full run (docs/admin-guide.md); here 3 kills (one
inside an action before its Slurm call, with the journal's last write torn; one after the
Slurm call, before the journal recorded it; one at a random moment) and a slurmctld outage
of 10 s, on real elastic torch jobs and rigid jobs a third of the full run's length.  Its
verdict comes from Slurm and the journal, not from the daemon's own view (the script's
docstring lists each check).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts import chaos
from slurm_elastic.actuate.journal import ActionStatus, Journal
from slurm_elastic.demo.workload import DemoJob
from slurm_elastic.types import Action, ActionKind, ClusterSnapshot, JobState, JobView
from tests.slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parent.parent


def last_line_counts(stdout: str) -> dict[str, str]:
    last = stdout.strip().splitlines()[-1]
    return dict(item.split("=", 1) for item in last.split())


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.default_slurm_only(
    "what the daemon does when killed is version-free; the Slurm calls it repeats or "
    "reconciles (pins, NumNodes shrinks, companion submits and cancels) are each run live on "
    "every version by the daemon, reconcile and end-to-end tests"
)
def test_a_short_chaos_run_repeats_forgets_and_orphans_nothing(
    clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "chaos"
    argv = [
        sys.executable,
        str(REPO / "scripts" / "chaos.py"),
        "--kills=3",
        "--seed=3",
        "--outage-s=10",
        f"--slurm={clean_queue.version}",
        f"--instance={clean_queue.instance}",
        f"--out={out}",
        "--time-limit-s=420",
        "--job-scale=0.3",
    ]
    done = subprocess.run(
        argv, cwd=REPO, env=clean_queue.env, capture_output=True, text=True, timeout=600
    )
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    counts = last_line_counts(done.stdout)
    assert done.returncode == 0, tail
    assert counts["kills"] == "3" and int(counts["resizes"]) >= 1, tail
    for key in ("repeated", "forgotten", "orphans", "below_min", "unmarked_touched"):
        assert counts[key] == "0", tail
    completed, submitted = counts["jobs_completed"].split("/")
    assert completed == submitted and int(submitted) >= 3, tail
    # The kills landed where they were aimed, the torn journal was recovered, and the
    # outage happened.
    assert counts["kills_before"] == "1" and counts["kills_after"] == "1", tail
    assert counts["torn"] == "1" and counts["torn_recovered"] == "1", tail
    assert counts["outages"] == "1" and counts["daemon_exits"] == "0", tail
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == {
        key: [] for key in ("repeated", "forgotten", "orphans", "below_min", "unmarked_touched")
    }


# --------------------------------------------------------------------------- the verdict itself


def _view(job_id: int, nodes: tuple[str, ...], **over: object) -> JobView:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "name": f"job{job_id}",
        "user": "alice",
        "user_id": 1000,
        "account": "a",
        "partition": "batch",
        "qos": "normal",
        "state": JobState.RUNNING if nodes else JobState.PENDING,
        "state_reason": "None",
        "node_count": len(nodes) or 1,
        "min_nodes": len(nodes) or 1,
        "max_nodes": None,
        "nodes": nodes,
        "batch_host": nodes[0] if nodes else None,
        "comment": "",
    }
    fields.update(over)
    return JobView(**fields)


def _snap(*jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(taken_at=0.0, jobs=tuple(jobs), nodes=(), partitions=())


ELASTIC = chaos.Submitted(DemoJob("mlp", 0, 2, 3, True), "torchft", 0.0)
RIGID = chaos.Submitted(DemoJob("rigid", 0, 1, 1, False, sleep_s=5), "torchft", 0.0)


def test_the_watcher_sees_each_kind_of_harm_in_the_queue() -> None:
    findings = chaos.Findings()
    watcher = chaos.Watcher({1: ELASTIC, 2: RIGID}, findings, grace_s=10)
    companion = "slurm-elastic:companion-of=1"
    # Fine: 1 own node + 1 companion node meets the minimum of 2; rigid at its size.
    watcher.poll(
        _snap(
            _view(1, ("n1",)),
            _view(5, ("n2",), comment=companion),
            _view(2, ("n3",)),
        ),
        now=100,
        daemon_up_since=0,
    )
    assert findings == chaos.Findings()
    # Below the minimum, and without the batch host; the rigid job resized.
    watcher.poll(
        _snap(_view(1, ("n2",), batch_host="n1"), _view(2, ("n3", "n4"))),
        now=101,
        daemon_up_since=0,
    )
    assert len(findings.below_min) == 2 and len(findings.unmarked_touched) == 1
    assert watcher.shrinks_seen == []  # 1 node before and after
    # The parent ends; its companion stays: an orphan only once the daemon had its grace.
    watcher.poll(_snap(_view(5, ("n2",), comment=companion)), now=102, daemon_up_since=0)
    watcher.poll(_snap(_view(5, ("n2",), comment=companion)), now=111, daemon_up_since=0)
    assert findings.orphans == []
    watcher.poll(_snap(_view(5, ("n2",), comment=companion)), now=120, daemon_up_since=115)
    assert findings.orphans == []  # the daemon was down until 115
    watcher.poll(_snap(_view(5, ("n2",), comment=companion)), now=126, daemon_up_since=115)
    assert len(findings.orphans) == 1


def test_the_journal_check_finds_open_repeated_unlinked_and_unexplained(tmp_path: Path) -> None:
    journal = Journal.in_state_dir(tmp_path)
    grow = Action(ActionKind.GROW, 1, 2, 3)
    first = journal.record_intent(grow, 1.0)
    journal.mark(first, ActionStatus.APPLIED, 2.0, companion_id=5)
    journal.link_companion(1, 5, 1, first, 2.0)
    journal.link_companion(1, 6, 1, first, 2.0)  # a second companion for the same grow
    again = journal.record_intent(grow, 3.0)
    journal.mark(again, ActionStatus.APPLIED, 4.0)  # the same grow applied again in a row
    journal.record_intent(Action(ActionKind.SHRINK, 1, 3, 2), 5.0)  # left open
    journal.record_intent(Action(ActionKind.START_AT_SIZE, 2, 0, 1), 6.0)  # a rigid job
    journal.close()
    findings = chaos.Findings()
    watcher = chaos.Watcher({1: ELASTIC, 2: RIGID}, findings, grace_s=10)
    watcher.companions = {5: 1, 6: 1, 7: 1}  # 7: in Slurm, not in the journal
    watcher.shrinks_seen = [(1, 3, 2, 7.0)]  # no applied shrink explains it
    resizes = chaos.check_journal(tmp_path, {1: ELASTIC, 2: RIGID}, watcher, findings)
    assert resizes == 2
    assert len(findings.repeated) == 2  # two companions for one grow; a grow twice in a row
    assert len(findings.forgotten) == 4  # two open rows, companion 7, the shrink
    assert len(findings.unmarked_touched) == 1
    assert findings.orphans == [] and findings.below_min == []
