"""Issue 38, class 5: torchft kill requests from outside a job (no cluster, no torch).

torchft 0.2's managers and lighthouse end a replica group on an unauthenticated kill
request.  The launcher tells those ends from the job's own failures by the manager's log
line, does not spend its relaunch budget on them, and past ``OUTSIDE_KILL_LIMIT`` falls back
to the restart mode; the workers' reports then say so and ``status`` shows it.  The live
attack (another user's requests against a running 3-node job) is
``tests/test_outside_kills_live.py``.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.agent import launcher
from slurm_elastic.agent.jobdir import DONE, LaunchInfo, write_json
from slurm_elastic.agent.launcher import (
    OUTSIDE_KILL_LIMIT,
    OutsideKills,
    RunOptions,
    fall_back_to_restart,
    launch_steps,
    watch_outside_kills,
)
from slurm_elastic.agent.modes import FALLBACK_ENV, MODE_ENV, TORCHFT, TORCHRUN
from slurm_elastic.agent.node import COMPANION, PARENT, node_env, rust_log
from slurm_elastic.agent.srunlog import PlannedRemoval, StepReport, copy_stderr
from slurm_elastic.daemon.api import parse_report
from slurm_elastic.daemon.commands import FALLBACK_TEXT, _status_row, explain_lines
from slurm_elastic.errors import ReportRejected
from slurm_elastic.protocol import Fallback
from tests.slurm_cluster import wait_until
from tests.test_agent_launcher import info, job

# What torchft 0.2.0's manager wrote to its stderr before exiting 1, captured here on
# 2026-12-07 (a one-process group under RUST_LOG=warn; POST /replica/<id>/kill to its
# lighthouse, which forwards the kill to the manager: torchft src/lighthouse.rs, manager.rs).
KILL_LINE = (
    b"2026-12-07T20:02:26.276 [WARN] [torchft::manager] - got kill request: killed from dashboard\n"
)


# --------------------------------------------------------------------------- srun's stderr


def test_a_kill_request_line_is_counted_told_and_passed_through() -> None:
    told: list[int] = []
    report = StepReport(on_kill_request=lambda: told.append(1))
    src = io.BytesIO(
        b"step 10 loss 0.3\n"
        + KILL_LINE
        + b"srun: error: n2: task 1: Exited with exit code 1\n"
        # The job's own text mentioning it (not torchft's line) is not a kill request.
        + b"print: got kill request: from my own script\n"
        + KILL_LINE.replace(b"dashboard", b"anything a caller of Kill writes")
    )
    out = io.BytesIO()
    copy_stderr(src, PlannedRemoval(), out, report)
    assert (report.kill_requests, len(told), report.task_failures) == (2, 2, 1)
    assert out.getvalue() == src.getvalue()  # the job's output keeps every line
    assert not report.tasks_succeeded()


@pytest.mark.parametrize(
    ("asked", "level"),
    [(None, "warn"), ("", "warn"), ("error", "warn"), ("INFO", "info"), ("debug", "debug")],
)
def test_torchft_logs_at_warn_or_more_so_the_kill_line_is_never_hidden(
    asked: str | None, level: str
) -> None:
    assert rust_log(asked) == level
    ft = info(mode=TORCHFT)
    env = {} if asked is None else {"RUST_LOG": asked}
    assert node_env(ft, "10.0.0.2", env, "n2")["RUST_LOG"] == level


# --------------------------------------------------------------------------- the budget


class _ScriptedStep(launcher._Step):
    """srun steps that end as scripted: (rc, kill requests, training done after it)."""

    def __init__(self, outcomes: list[tuple[int, int, bool]], job_dir: Path) -> None:
        super().__init__(out=io.BytesIO())  # type: ignore[arg-type]
        self.outcomes = outcomes
        self.job_dir = job_dir
        self.runs: list[list[str]] = []

    def run(self, argv: list[str], env: dict[str, str]) -> int:
        rc, kills, done = self.outcomes[len(self.runs)]
        self.runs.append(argv)
        self.report = StepReport(on_kill_request=self.outside.add)
        for _ in range(kills):
            self.report.note(KILL_LINE)
        if done:
            write_json(self.job_dir / DONE, {"step": 150, "time": 1.0})
        return rc


@pytest.fixture
def parent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchInfo:
    first = info(job_dir=str(tmp_path))
    first.save()
    monkeypatch.setattr(launcher, "read_job", lambda _job_id: job("elastic", nodes=3))
    monkeypatch.setattr(launcher, "end_old_steps", lambda *_a, **_k: None)
    return first


def test_steps_that_outside_kills_ended_do_not_spend_the_relaunch_budget(
    parent_dir: LaunchInfo,
) -> None:
    """Five steps ended by kill requests (three groups each), then training completes:
    with a budget of 1 relaunch the job still completes (on 108c305 it failed at the second)."""
    outcomes = [(1, 3, False)] * 5 + [(0, 0, True)]
    step = _ScriptedStep(outcomes, Path(parent_dir.job_dir))
    opts = RunOptions(argv=("python", "train.py"), max_relaunches=1)
    assert launch_steps(parent_dir, 42, PARENT, opts, step) == 0
    assert len(step.runs) == 6
    assert step.outside.count == 15 and step.outside.reached.is_set()


def test_the_jobs_own_failures_still_spend_it(parent_dir: LaunchInfo) -> None:
    outcomes = [(1, 0, False)] * 3 + [(0, 0, True)]
    step = _ScriptedStep(outcomes, Path(parent_dir.job_dir))
    opts = RunOptions(argv=("python", "train.py"), max_relaunches=1)
    assert launch_steps(parent_dir, 42, PARENT, opts, step) == 1
    assert len(step.runs) == 2  # the first run and one relaunch


def test_a_companion_past_the_limit_pays_for_further_kills(parent_dir: LaunchInfo) -> None:
    """A companion has no mode of its own to fall back to: once its groups were killed
    OUTSIDE_KILL_LIMIT times, further kills spend its budget, so an attacker cannot keep it
    relaunching forever (the parent's training goes on without it)."""
    outcomes = [(1, 1, False)] * (OUTSIDE_KILL_LIMIT + 5)
    step = _ScriptedStep(outcomes, Path(parent_dir.job_dir))
    opts = RunOptions(argv=(), max_relaunches=1, join=42)
    assert launch_steps(parent_dir, 43, COMPANION, opts, step) == 1
    # Free until the limit (the limit's own step included), then two spent: 1 + 1 relaunch.
    assert len(step.runs) == OUTSIDE_KILL_LIMIT + 1


# --------------------------------------------------------------------------- the fallback


def test_outside_kills_reach_the_limit_once() -> None:
    outside = OutsideKills(limit=3)
    for _ in range(2):
        outside.add()
    assert not outside.reached.is_set()
    outside.add()
    assert outside.reached.is_set() and outside.count == 3


def test_the_watch_falls_back_once_at_the_limit_and_never_while_the_job_ends() -> None:
    outside, calls = OutsideKills(limit=2), []
    watch = watch_outside_kills(
        outside, lambda: calls.append(time.monotonic()), ending=lambda: False
    )
    try:
        outside.add()
        time.sleep(0.2)
        assert calls == []
        outside.add()
        outside.add()
        wait_until(lambda: len(calls) == 1, 5, "the fallback")
        assert outside.handled.wait(5)  # a relaunch waiting on it goes ahead
        time.sleep(0.2)
        assert len(calls) == 1
    finally:
        watch.set()
    ending, late = OutsideKills(limit=1), []
    watch = watch_outside_kills(ending, lambda: late.append(1), ending=lambda: True)
    ending.add()
    assert ending.handled.wait(5)
    watch.set()
    assert late == []  # training done or the launcher stopping: nothing to fall back for


def test_the_fallback_says_the_restart_mode_in_launch_json_and_ends_the_step_with_term(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[tuple[int, str | None]] = []
    monkeypatch.setattr(
        launcher, "end_old_steps", lambda job, signal_name=None: ended.append((job, signal_name))
    )
    first = info(mode=TORCHFT, job_dir=str(tmp_path))
    first.save()
    after = fall_back_to_restart(first, 42, kills=3)
    assert ended == [(42, "TERM")]  # healthy groups: each saves its last completed step
    stored = LaunchInfo.load(tmp_path)
    assert stored == after and (stored.mode, stored.fallback) == (TORCHRUN, "outside_kills")
    env = node_env(stored, "10.0.0.2", {}, "n2")
    assert env[FALLBACK_ENV] == "outside_kills" and MODE_ENV not in env
    assert FALLBACK_ENV not in node_env(first, "10.0.0.2", {}, "n2")


def test_a_relaunch_after_the_fallback_waits_for_it_then_runs_torchrun(
    parent_dir: LaunchInfo,
) -> None:
    """Every group killed: the step ends at once, while the fallback thread may still be
    rewriting launch.json.  The relaunch (free) waits for it, and runs under torchrun with a
    rendezvous of its own, never in the mode being left."""
    ft = replace(parent_dir, mode=TORCHFT)
    ft.save()
    step = _ScriptedStep([(1, OUTSIDE_KILL_LIMIT, False), (0, 0, True)], Path(ft.job_dir))
    step.outside.watched = True  # as watch_outside_kills does

    def fallback_later() -> None:
        time.sleep(0.3)
        replace(LaunchInfo.load(Path(ft.job_dir)), mode=TORCHRUN, fallback="x").save()
        step.outside.handled.set()

    threading.Thread(target=fallback_later, daemon=True).start()
    opts = RunOptions(argv=("python", "train.py"), max_relaunches=0, mode=TORCHFT)
    assert launch_steps(ft, 42, PARENT, opts, step) == 0
    assert len(step.runs) == 2
    stored = LaunchInfo.load(Path(ft.job_dir))
    assert stored.mode == TORCHRUN and stored.rdzv_id == "slurm-elastic-42-1"


# --------------------------------------------------------------------------- what status shows


def test_a_report_names_its_fallback_only_from_the_daemons_list() -> None:
    report = parse_report(
        42, {"step": 5, "nodes": 3, "fallback": "outside_kills"}, received_at=1.0, slurm_nodes=3
    )
    assert report.fallback == Fallback.OUTSIDE_KILLS
    with pytest.raises(ReportRejected, match="fallback"):
        parse_report(
            42, {"step": 5, "nodes": 3, "fallback": "\x1b[2Jrm -rf"}, received_at=1.0, slurm_nodes=3
        )


def test_status_and_explain_say_why_a_stop_free_job_restarts() -> None:
    row = {
        **{"job_id": 42, "name": "t", "user": "alice", "partition": "batch", "state": "RUNNING"},
        **{"nodes": 3, "min": 1, "max": 3, "reason": "at target", "fallback": "outside_kills"},
    }
    assert _status_row(row)[-1] == f"at target; {FALLBACK_TEXT['outside_kills']}"
    assert _status_row({**row, "fallback": None})[-1] == "at target"
    lines = explain_lines({"job": row, "decision": None, "actions": [], "plan": "plan: -"})
    assert f"  mode: {FALLBACK_TEXT['outside_kills']}" in lines
