"""Launcher pieces without a cluster: torchrun command, Slurm environment, launch.json,
instruction refusal, progress reporting, and the CLI's errors."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.agent import launcher
from slurm_elastic.agent.allocation import cpus_per_node, srun_env
from slurm_elastic.agent.follower import refusal
from slurm_elastic.agent.jobdir import LaunchInfo, companion_environment, save_environment
from slurm_elastic.agent.launcher import (
    RunOptions,
    resolve_sizes,
    srun_argv,
    watch_lighthouse,
    watch_parent,
)
from slurm_elastic.agent.lighthouse import LighthouseSettings
from slurm_elastic.agent.modes import FtTimeouts
from slurm_elastic.agent.node import is_loopback, node_env
from slurm_elastic.agent.progress import ProgressReporter
from slurm_elastic.agent.rendezvous import (
    choose_port,
    parse_conf,
    replica_group_argv,
    script_args,
    torchrun_argv,
)
from slurm_elastic.cli import cli
from slurm_elastic.errors import AgentError
from slurm_elastic.protocol import Instruction
from slurm_elastic.types import JobState, JobView
from tests.slurm_cluster import wait_until


def info(**changes: object) -> LaunchInfo:
    base = dict(
        job_id=42,
        argv=("python", "train.py", "--epochs", "3"),
        nproc_per_node=1,
        rdzv_host="127.0.0.1",
        rdzv_port=20042,
        rdzv_id="slurm-elastic-42",
        min_nodes=1,
        max_nodes=3,
        batch_host="n1",
        max_restarts=100,
        api="http://127.0.0.1:8790",
        job_dir="/shared/.slurm-elastic/job-42",
        created_at=1.0,
    )
    base.update(changes)
    return LaunchInfo(**base)  # type: ignore[arg-type]


def job(comment: str, nodes: int = 2) -> JobView:
    return JobView(
        job_id=42,
        name="train",
        user="alice",
        user_id=1000,
        account="a",
        partition="batch",
        qos="normal",
        state=JobState.RUNNING,
        state_reason="None",
        node_count=nodes,
        min_nodes=nodes,
        max_nodes=None,
        nodes=tuple(f"n{i}" for i in range(1, nodes + 1)),
        batch_host="n1",
        comment=comment,
    )


# --------------------------------------------------------------------------- torchrun


def test_batch_host_alone_hosts_the_store_with_fast_rendezvous_settings() -> None:
    host = torchrun_argv(info(), python="/py", is_host=True, local_addr="127.0.0.1")
    other = torchrun_argv(info(), python="/py", is_host=False, local_addr=None)
    assert host[:3] == ["/py", "-m", "slurm_elastic.agent.torchrun"]
    assert "--nnodes=1:3" in host and "--rdzv-backend=c10d" in host
    assert "--rdzv-endpoint=127.0.0.1:20042" in host and "--rdzv-id=slurm-elastic-42" in host
    conf = next(a for a in host if a.startswith("--rdzv-conf="))
    assert conf == (
        "--rdzv-conf=is_host=1,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
    )
    assert "is_host=0" in next(a for a in other if a.startswith("--rdzv-conf="))
    assert "--local-addr=127.0.0.1" in host and not any("local-addr" in a for a in other)
    assert host[-3:] == ["train.py", "--epochs", "3"]


def test_rendezvous_settings_can_be_overridden_but_not_is_host() -> None:
    conf = parse_conf(" last_call_timeout=5 , join_timeout=60")
    assert conf == {"last_call_timeout": "5", "join_timeout": "60"}
    argv = torchrun_argv(info(rdzv_conf=conf), python="/py", is_host=False, local_addr=None)
    assert "last_call_timeout=5" in next(a for a in argv if a.startswith("--rdzv-conf="))
    for bad in ("is_host=1", "oops", "k="):
        with pytest.raises(ValueError):
            parse_conf(bad)
    result = CliRunner().invoke(cli, ["run", "--rdzv-conf", "is_host=1", "--", "python", "x.py"])
    assert result.exit_code == 2 and "is_host is set per node" in result.output
    bad_signal = CliRunner().invoke(cli, ["run", "--stop-signal", "USR9", "--", "python", "x"])
    assert bad_signal.exit_code == 2 and "not a signal name: 'USR9'" in bad_signal.output


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python3", "train.py", "-x"], ["train.py", "-x"]),
        (
            ["/usr/bin/python3.11", "-m", "pkg.train", "--lr", "1"],
            ["--module", "pkg.train", "--lr", "1"],
        ),
        (["./run.sh", "a"], ["--no-python", "./run.sh", "a"]),
        (["python", "-u", "train.py"], ["--no-python", "python", "-u", "train.py"]),
    ],
)
def test_script_args(argv: list[str], expected: list[str]) -> None:
    assert script_args(argv) == expected


def test_the_port_is_drawn_at_random_and_skips_a_busy_one() -> None:
    """Issue 38, class 5: the port was 20000 + job id % 12000, so anyone who saw the job
    id in squeue knew where its rendezvous store or lighthouse listened."""
    drawn = {choose_port("127.0.0.1") for _ in range(20)}
    assert len(drawn) > 15 and all(20000 <= port < 32000 for port in drawn)
    first = drawn.pop()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        assert choose_port("127.0.0.1", tries=1000) != first


def test_node_env_sets_the_required_torch_switch_and_pins_gloo_to_loopback() -> None:
    env = node_env(info(), "127.0.0.1", {"PATH": "/bin"})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["SLURM_ELASTIC_JOB_ID"] == "42" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in node_env(info(), "10.1.2.3", {})
    # The largest world: 3 nodes of 2 processes (agent.elastic's sampler plans with it).
    assert node_env(info(nproc_per_node=2), None, {})["SLURM_ELASTIC_MAX_WORLD"] == "6"
    assert is_loopback("127.0.0.1") and not is_loopback("node-a") and not is_loopback(None)


def test_the_torchft_mode_runs_one_replica_group_per_node_that_joins_the_lighthouse() -> None:
    ft = info(mode="torchft", nproc_per_node=2, ft_timeout_s=7.5)
    argv = replica_group_argv(ft, python="/py")
    assert argv[:3] == ["/py", "-m", "slurm_elastic.agent.torchrun"]
    assert "--standalone" in argv and "--nnodes=1" in argv and "--max-restarts=0" in argv
    assert "--nproc-per-node=2" in argv and argv[-3:] == ["train.py", "--epochs", "3"]
    # One process per node runs the script itself (no torchrun: one Python start less).
    one = info(mode="torchft")
    assert replica_group_argv(one, python="/py") == ["/py", "train.py", "--epochs", "3"]
    module = info(mode="torchft", argv=("python3", "-m", "pkg.train", "-x"))
    assert replica_group_argv(module, python="/py") == ["/py", "-m", "pkg.train", "-x"]
    wrapper = info(mode="torchft", argv=("./run.sh", "a"))
    assert replica_group_argv(wrapper, python="/py") == ["./run.sh", "a"]
    env = node_env(ft, "127.0.0.1", {"PATH": "/bin"}, "n2")
    assert env["SLURM_ELASTIC_MODE"] == "torchft"
    assert env["TORCHFT_LIGHTHOUSE"] == "http://127.0.0.1:20042"
    assert env["SLURM_ELASTIC_REPLICA"] == "n2" and env["SLURM_ELASTIC_NODE_ADDR"] == "127.0.0.1"
    assert env["SLURM_ELASTIC_FT_TIMEOUT_S"] == "7.5" and env["RUST_LOG"] == "warn"
    assert env["SLURM_ELASTIC_LIGHTHOUSE_EPOCH"] == "0"  # the job's first lighthouse
    assert node_env(ft, None, {"RUST_LOG": "info"}, "n3")["RUST_LOG"] == "info"  # the user's
    assert "SLURM_ELASTIC_MODE" not in node_env(info(), "127.0.0.1", {}, "n2")
    # A one-process group runs the script without torchrun: a MASTER_PORT or RANK from the
    # batch script's environment would be every node's, so none reaches it.
    leaked = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"}
    alone = node_env(info(mode="torchft"), "127.0.0.1", leaked, "n2")
    assert not set(leaked) & set(alone)
    assert node_env(info(), "127.0.0.1", leaked, "n2")["MASTER_PORT"] == "29500"  # torchrun's


# --------------------------------------------------------------------------- Slurm side


def test_srun_env_describes_the_shrunk_allocation() -> None:
    stale = {
        "SLURM_NNODES": "3",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_NODELIST": "n[1-3]",
        "SLURM_JOB_CPUS_PER_NODE": "4(x3)",
        "SLURM_NTASKS": "3",
        "SLURM_NPROCS": "3",
        "SLURM_TASKS_PER_NODE": "1(x3)",
        "HOME": "/root",
    }
    env = srun_env(stale, ("n1", "n2"))
    assert env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "n[1-2]"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "4(x2)"
    assert not {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"} & set(env)
    assert env["HOME"] == "/root" and stale["SLURM_NNODES"] == "3"
    with pytest.raises(AgentError, match="no nodes"):
        srun_env(stale, ())
    assert cpus_per_node("8,4") == 8 and cpus_per_node("") is None


def test_srun_runs_one_node_agent_per_node() -> None:
    argv = srun_argv(info(), 2, "parent", relaunch=True)
    assert argv[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
    ]
    assert "--overlap" in argv and argv[-3:] == [
        "slurm_elastic.agent.node",
        info().job_dir,
        "parent",
    ]


def test_sizes_come_from_the_marker_and_options_override() -> None:
    assert resolve_sizes(job("elastic:min=1,max=4"), RunOptions(argv=())) == (1, 4)
    assert resolve_sizes(job("no marker", nodes=3), RunOptions(argv=())) == (1, 3)
    assert resolve_sizes(job("elastic:min=1,max=4"), RunOptions(argv=(), max_nodes=2)) == (1, 2)
    with pytest.raises(AgentError, match="invalid node range"):
        resolve_sizes(job("elastic"), RunOptions(argv=(), min_nodes=3, max_nodes=2))


def test_launch_json_round_trip_and_clear_errors(tmp_path: Path) -> None:
    saved = info(job_dir=str(tmp_path))
    saved.save()
    assert LaunchInfo.load(tmp_path) == saved
    with pytest.raises(AgentError, match=r"no launch\.json"):
        LaunchInfo.load(tmp_path / "other")
    with pytest.raises(AgentError, match="malformed"):
        LaunchInfo.from_json({"job_id": "x"})
    ft = info(job_dir=str(tmp_path), mode="torchft")
    ft.save()
    assert LaunchInfo.load(tmp_path) == ft and ft.lighthouse == "http://127.0.0.1:20042"
    with pytest.raises(AgentError, match="unknown mode 'mpi'"):
        LaunchInfo.from_json({**ft.to_json(), "mode": "mpi"})


# --------------------------------------------------------------------------- instructions


def instruction(target: int, keep: tuple[str, ...] = ("n1",), kind: str = "shrink") -> Instruction:
    return Instruction(id="i1", kind=kind, target_nodes=target, keep_nodes=keep, deadline=0.0)


@pytest.mark.parametrize(
    ("ins", "current", "why"),
    [
        (instruction(1), 3, None),
        (instruction(1, keep=()), 2, None),
        (instruction(0), 2, "below the job's minimum"),
        (instruction(2), 2, "not smaller"),
        (instruction(1, keep=("n2",)), 2, "batch host n1"),
        (instruction(1, kind="grow"), 2, "unknown instruction kind"),
    ],
)
def test_refusal(ins: Instruction, current: int, why: str | None) -> None:
    answer = refusal(ins, current_nodes=current, min_nodes=1, batch_host="n1")
    assert answer is None if why is None else why in (answer or "")


def test_malformed_instruction_is_a_clear_error() -> None:
    with pytest.raises(AgentError, match="malformed instruction"):
        Instruction.from_json({"id": "x", "kind": "shrink"})


# --------------------------------------------------------------------------- progress


def test_reports_never_block_or_fail_training_and_only_the_newest_is_sent() -> None:
    calls: list[dict] = []
    gate = threading.Event()

    def slow_failing_post(url: str, body: dict) -> int:
        calls.append(body)
        gate.wait(5)
        raise AgentError("cannot reach http://127.0.0.1:9/v1/jobs/7/report: refused")

    reporter = ProgressReporter("http://127.0.0.1:9", 7, interval_s=0.05, post=slow_failing_post)
    started = time.monotonic()
    for step in range(1000):
        reporter.offer(step=step, nodes=2, loss=1.0 / (step + 1), global_batch=48)
    assert time.monotonic() - started < 1.0  # offering never waits for the network
    gate.set()
    reporter.close(timeout_s=5)
    assert reporter.sent == 0 and reporter.failed == len(calls) >= 1
    assert calls[-1]["step"] == 999 and len(calls) <= 3
    assert reporter.url == "http://127.0.0.1:9/v1/jobs/7/report"


def test_reports_count_successes() -> None:
    reporter = ProgressReporter("http://x", 1, interval_s=0.01, post=lambda url, body: 202)
    reporter.offer(step=1, nodes=1, epoch=None)
    reporter.close()
    assert reporter.sent == 1 and reporter.failed == 0


# --------------------------------------------------------------------------- torchft timeouts


def test_torchft_timeouts_follow_from_one_setting_in_their_hierarchy() -> None:
    levels = FtTimeouts.derive(5.0, {})
    assert (levels.heartbeat_s, levels.join_window_s) == (0.75, 1.5)  # the lighthouse's
    assert levels.collective_s == 5.0 and levels.quorum_s == levels.connect_s == 60.0
    # A long collective timeout lengthens the quorum's: a recovery must fit inside it.
    long = FtTimeouts.derive(100.0, {})
    assert long.quorum_s == long.connect_s == 201.5
    # The lighthouse runs with the same levels.
    assert LighthouseSettings().argv("h", 1)[2:4] == [
        "--join_timeout_ms=1500",
        "--heartbeat_timeout_ms=750",
    ]


@pytest.mark.parametrize(
    ("timeout_s", "env", "message"),
    [
        # The survivors would give up on a lost group before the lighthouse drops it.
        (0.5, {}, "collective timeout 0.5 s breaks torchft's timeout hierarchy"),
        # torchft's own overrides win over what the library passes: checked the same way.
        (5.0, {"TORCHFT_QUORUM_TIMEOUT_SEC": "10"}, "quorum timeout 10 s breaks"),
        (5.0, {"TORCHFT_TIMEOUT_SEC": "40", "TORCHFT_QUORUM_TIMEOUT_SEC": "60"}, "needs 81.5 s"),
        (5.0, {"TORCHFT_CONNECT_TIMEOUT_SEC": "90"}, "connect timeout 90 s breaks"),
        # torchft reads them with int(): a fraction would crash every worker at start.
        (5.0, {"TORCHFT_TIMEOUT_SEC": "2.5"}, "$TORCHFT_TIMEOUT_SEC must be a positive whole"),
        (5.0, {"TORCHFT_QUORUM_TIMEOUT_SEC": "0"}, "must be a positive whole number"),
        (5000.0, {}, "--ft-timeout must be in (0, 3600] seconds"),
    ],
)
def test_torchft_timeouts_out_of_order_are_refused(
    timeout_s: float, env: dict[str, str], message: str
) -> None:
    with pytest.raises(AgentError, match=re.escape(message)):
        FtTimeouts.derive(timeout_s, env)


def test_torchft_overrides_that_keep_the_hierarchy_are_taken() -> None:
    env = {
        "TORCHFT_TIMEOUT_SEC": "20",
        "TORCHFT_QUORUM_TIMEOUT_SEC": "300",
        "TORCHFT_CONNECT_TIMEOUT_SEC": " 30",
    }
    levels = FtTimeouts.derive(5.0, env)
    assert (levels.collective_s, levels.quorum_s, levels.connect_s) == (20.0, 300.0, 30.0)
    # The levels above an override follow it.
    levels = FtTimeouts.derive(5.0, {"TORCHFT_TIMEOUT_SEC": "40"})
    assert (levels.collective_s, levels.quorum_s, levels.connect_s) == (40.0, 81.5, 81.5)


def test_run_refuses_a_torchft_timeout_out_of_order_in_one_line() -> None:
    result = CliRunner().invoke(
        cli, ["run", "--mode", "torchft", "--ft-timeout", "0.6", "--", "python", "x.py"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "slurm-elastic run: collective timeout 0.6 s breaks torchft's timeout hierarchy "
        "(slurm-elastic run --help, --ft-timeout): it must be longer than the lighthouse's "
        "heartbeat timeout (0.75 s)"
    ]
    result = CliRunner().invoke(
        cli,
        ["run", "--mode", "torchft", "--", "python", "x.py"],
        env={"TORCHFT_QUORUM_TIMEOUT_SEC": "5", "SLURM_JOB_ID": ""},
    )
    assert result.exit_code == 2 and "quorum timeout 5 s breaks" in result.output
    # The torchrun mode has no such levels: the same environment is not its concern.
    result = CliRunner().invoke(
        cli,
        ["run", "--", "python", "x.py"],
        env={"TORCHFT_QUORUM_TIMEOUT_SEC": "5", "SLURM_JOB_ID": ""},
    )
    assert result.exit_code == 2 and "$SLURM_JOB_ID is not set" in result.output


# --------------------------------------------------------------------------- CLI


def test_run_outside_a_slurm_job_is_a_one_line_error() -> None:
    result = CliRunner().invoke(cli, ["run", "--", "python", "train.py"], env={"SLURM_JOB_ID": ""})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "slurm-elastic run: $SLURM_JOB_ID is not set: "
        "run slurm-elastic run inside a Slurm batch job"
    ]


def test_join_takes_no_command() -> None:
    result = CliRunner().invoke(cli, ["run", "--join", "5", "--", "python", "x.py"])
    assert result.exit_code == 2 and "--join takes the command" in result.output
    result = CliRunner().invoke(cli, ["run", "--join", "5", "--mode", "torchft"])
    assert result.exit_code == 2 and "--join takes the mode" in result.output
    result = CliRunner().invoke(cli, ["run", "--mode", "mpi", "--", "python", "x.py"])
    assert result.exit_code == 2 and "'mpi' is not one of" in result.output


def test_cli_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from click.testing import CliRunner; from slurm_elastic.cli import cli;"
        "r = CliRunner().invoke(cli, ['run', '--help']); assert r.exit_code == 0, r.output;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_torchrun_drops_only_its_lines_for_a_planned_resize() -> None:
    """The workers' exit 75 at a resize is not torchrun's ERROR, nor the SIGTERM of the
    other workers a WARNING; any other exit code keeps its error line."""
    import logging

    from slurm_elastic.agent.torchrun import ResizeExits

    def record(level: int, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("torch", level, "api.py", 1, msg, args, None)

    failed = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
    keep = ResizeExits().filter
    assert not keep(record(logging.ERROR, failed, 75, 0, 31073, "python"))
    assert not keep(record(logging.WARNING, "Sending process %s closing signal %s", 1, "SIGTERM"))
    assert keep(record(logging.ERROR, failed, 1, 0, 31073, "python"))
    assert keep(record(logging.ERROR, failed, -9, 0, 31073, "python"))
    assert keep(record(logging.WARNING, "something else %s", 75))
    # The signal contract: while the workers are being stopped, their end by the stop
    # signal (SIGUSR1: -10) or by the SIGKILL after the grace is the stop's, not an error.
    stopping = [True]
    contract = ResizeExits(lambda: stopping[0], 10).filter
    assert not contract(record(logging.ERROR, failed, -10, 0, 31073, "python"))
    assert not contract(record(logging.ERROR, failed, -9, 0, 31073, "python"))
    assert contract(record(logging.ERROR, failed, -11, 0, 31073, "python"))
    stopping[0] = False
    assert contract(record(logging.ERROR, failed, -10, 0, 31073, "python"))


def test_a_companion_runs_in_its_parents_environment_but_keeps_its_own_job_variables(
    tmp_path: Path,
) -> None:
    parent = {
        "PATH": "/home/u/venv/bin:/usr/bin",
        "NCCL_SOCKET_IFNAME": "ib0",
        "SLURM_ELASTIC_BACKEND": "gloo",
        "SLURM_JOB_ID": "5",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TMPDIR": "/tmp/job5",
    }
    path = save_environment(tmp_path, parent)
    assert path.stat().st_mode & 0o777 == 0o600  # it may hold the user's tokens
    own = {"PATH": "/usr/bin", "HOME": "/home/u", "SLURM_JOB_ID": "9", "CUDA_VISIBLE_DEVICES": "2"}
    assert companion_environment(own, tmp_path) == {
        "PATH": "/home/u/venv/bin:/usr/bin",
        "NCCL_SOCKET_IFNAME": "ib0",
        "SLURM_ELASTIC_BACKEND": "gloo",
        "HOME": "/home/u",
        "SLURM_JOB_ID": "9",
        "CUDA_VISIBLE_DEVICES": "2",
    }
    # An older parent wrote no environment: the companion's own.
    assert companion_environment(own, tmp_path / "none") == own


def test_an_environment_file_others_may_write_is_refused(tmp_path: Path) -> None:
    """Issue 38, class 1: never used, and the companion stops with one line saying why
    (it used to run on in its own environment, which hid the attack)."""
    save_environment(tmp_path, {"LD_PRELOAD": "/tmp/evil.so"})
    assert ((tmp_path / "environment.json").stat().st_mode & 0o777) == 0o600
    (tmp_path / "environment.json").chmod(0o666)
    with pytest.raises(AgentError, match=r"environment\.json may be written by other users"):
        companion_environment({"HOME": "/h"}, tmp_path)


class _RecordedStep:
    def __init__(self) -> None:
        self.forwarded: list[int] = []
        self.stopping = False

    def forward(self, signum: int, _frame: object) -> None:
        self.forwarded.append(signum)
        self.stopping = True


@pytest.mark.parametrize(
    ("done", "ends_by_itself", "stopped"),
    [(True, True, False), (True, False, True), (False, False, True)],
    ids=["training-done-ends", "training-done-hangs", "parent-failed"],
)
def test_a_companion_whose_parent_finished_training_ends_by_itself(
    done: bool, ends_by_itself: bool, stopped: bool
) -> None:
    """The parent is gone.  If training is done (done.json), the companion's workers are
    ending too: they get the finish grace before the step is stopped (stopping it makes
    Slurm write "CANCELLED" error lines).  Otherwise the step is stopped at once."""
    step = _RecordedStep()
    watcher = watch_parent(
        7,
        step,  # type: ignore[arg-type]
        0.05,
        done=lambda: done,
        running=lambda _job: False,
        finish_grace_s=0.5,
    )
    if ends_by_itself:
        time.sleep(0.2)
        watcher.set()  # launch_steps returned: the step ended by itself
    time.sleep(0.8)
    watcher.set()
    assert step.forwarded == ([signal.SIGTERM] if stopped else [])


def test_a_companion_that_joins_after_training_ended_leaves_without_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grown in the seconds between the end of training (done.json) and the parent's own
    end: the companion's launcher exits 0 at once, no srun (whose stop would put Slurm's
    "CANCELLED" lines in its output)."""
    from dataclasses import replace

    from slurm_elastic.agent import launcher
    from slurm_elastic.agent.jobdir import job_dir, write_json

    parent = replace(job("elastic"), work_dir=str(tmp_path))
    directory = job_dir(tmp_path, 42)
    directory.mkdir(parents=True)
    info(job_dir=str(directory)).save()
    write_json(directory / "done.json", {"step": 150, "time": 1.0})
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setattr(launcher, "read_job", lambda _job_id: parent)

    def no_srun(*_args: object) -> int:
        raise AssertionError("srun started after training ended")

    monkeypatch.setattr(launcher._Step, "run", no_srun)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)  # keep pytest's handlers
    assert launcher.run(RunOptions(argv=(), join=42)) == 0


class _FakeLighthouse:
    """A lighthouse process that ``die()`` ends; ``start`` brings it back unless told not to."""

    def __init__(self, can_start: bool = True) -> None:
        self.running = True
        self.starts = 0
        self.can_start = can_start

    def alive(self) -> bool:
        return self.running

    @property
    def returncode(self) -> int | None:
        return None if self.running else -9

    def start(self, timeout_s: float = 30.0) -> None:
        if not self.can_start:
            raise AgentError("the torchft lighthouse did not start: Address already in use")
        self.starts += 1
        self.running = True

    def die(self) -> None:
        self.running = False


def _watched(
    lighthouse: _FakeLighthouse, step: _RecordedStep, done: bool = False
) -> tuple[threading.Event, list[float]]:
    ended: list[float] = []
    watcher = watch_lighthouse(
        lighthouse,
        step,  # type: ignore[arg-type]
        0.02,
        end_step=lambda: ended.append(time.monotonic()),
        done=lambda: done,
    )
    return watcher, ended


def test_a_lighthouse_that_dies_is_replaced_and_the_step_relaunched_from_checkpoints() -> None:
    """Issue 20: with its lighthouse gone every group would wait out the quorum timeout; the
    launcher starts a new one and ends the step, which launch_steps relaunches."""
    lighthouse, step = _FakeLighthouse(), _RecordedStep()
    watcher, ended = _watched(lighthouse, step)
    try:
        time.sleep(0.1)
        assert (lighthouse.starts, ended) == (0, [])  # alive: nothing to do
        lighthouse.die()
        wait_until(lambda: len(ended) == 1, 5, "the step ended")
        assert lighthouse.starts == 1 and lighthouse.alive() and step.forwarded == []
        lighthouse.die()  # again: each death is one relaunch (bounded by --max-relaunches)
        wait_until(lambda: len(ended) == 2, 5, "the step ended again")
        assert lighthouse.starts == 2
    finally:
        watcher.set()


def test_a_lighthouse_that_cannot_be_replaced_stops_the_job_instead_of_a_hang() -> None:
    lighthouse, step = _FakeLighthouse(can_start=False), _RecordedStep()
    watcher, ended = _watched(lighthouse, step)
    try:
        lighthouse.die()
        wait_until(lambda: step.forwarded == [signal.SIGTERM], 5, "the launcher stopped")
        assert ended == []
    finally:
        watcher.set()


@pytest.mark.parametrize("why", ["stopping", "training-done"])
def test_a_lighthouse_that_ends_with_the_job_is_left_alone(why: str) -> None:
    lighthouse, step = _FakeLighthouse(), _RecordedStep()
    step.stopping = why == "stopping"
    watcher, ended = _watched(lighthouse, step, done=why == "training-done")
    try:
        lighthouse.die()
        time.sleep(0.3)
        assert (lighthouse.starts, ended, step.forwarded) == (0, [], [])
    finally:
        watcher.set()


def test_a_new_lighthouse_is_counted_in_launch_json_before_the_step_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relaunched groups (and companions' relaunches) read which lighthouse they meet in:
    their steps' generations must stay ahead of the old lighthouse's (agent.replicas)."""
    ended: list[tuple[int, str | None]] = []
    monkeypatch.setattr(
        launcher, "end_old_steps", lambda job, signal_name=None: ended.append((job, signal_name))
    )
    first = info(mode="torchft", job_dir=str(tmp_path))
    first.save()
    launcher.relaunch_with_new_lighthouse(first, 42)
    launcher.relaunch_with_new_lighthouse(first, 42)
    assert LaunchInfo.load(tmp_path).lighthouse_epoch == 2
    assert ended == [(42, "KILL"), (42, "KILL")]  # stuck in a quorum: no checkpoint to wait for
    assert (
        node_env(LaunchInfo.load(tmp_path), "127.0.0.1", {}, "n1")["SLURM_ELASTIC_LIGHTHOUSE_EPOCH"]
        == "2"
    )
