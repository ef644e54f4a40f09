"""The torch library with real processes (torchrun, gloo, CPU), no Slurm.

World-size independence of the update, restore from a checkpoint, the hold/resume
protocol of a graceful shrink (including the torch elastic restart), and the checkpoint
written on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic.agent.checkpoint import list_checkpoints
from slurm_elastic.agent.jobdir import Control, read_json, write_json
from slurm_elastic.samplelog import read_records

pytestmark = [pytest.mark.torch]
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_mlp.py"
ARGS = ["--samples", "600", "--global-batch", "40", "--micro-batch", "8", "--seed", "5"]


def env_without_job(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def train(out: Path, *args: str, procs: int = 0, env: dict[str, str] | None = None) -> None:
    """Run the example to the end: ``procs`` > 0 under torchrun --standalone."""
    launcher = [sys.executable]
    if procs:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
    subprocess.run(
        [*launcher, str(EXAMPLE), *ARGS, "--out", str(out), *args],
        env=env or env_without_job(),
        check=True,
        capture_output=True,
        timeout=180,
    )


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-9, atol=1e-10), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Two epochs in one process: what every other run must end with."""
    tmp = tmp_path_factory.mktemp("reference")
    train(tmp / "ref.pt", "--epochs", "2", "--checkpoint-dir", str(tmp / "ck"))
    return weights(tmp / "ref.pt")


def test_three_ranks_with_uneven_shares_equal_one_process(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # 40 samples per step over 3 ranks: shares of 14, 13 and 13.
    train(tmp_path / "w.pt", "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ck"), procs=3)
    assert_same(weights(tmp_path / "w.pt"), reference)


def test_restore_continues_exactly_where_the_checkpoint_left(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "7"]
    train(tmp_path / "one.pt", "--epochs", "1", *ckpt)
    assert list_checkpoints(tmp_path / "ck")[0][0] == 15  # 600 / 40 steps
    train(tmp_path / "two.pt", "--epochs", "2", *ckpt, "--sample-log", str(tmp_path / "log"))
    assert min(r["step"] for r in read_records(tmp_path / "log")) == 15  # nothing redone
    assert_same(weights(tmp_path / "two.pt"), reference)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_hold_then_restart_at_a_step_boundary_loses_nothing(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    """The graceful-shrink protocol: hold -> checkpoint + held.json -> resume(restart)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    log = tmp_path / "log"
    # Set by the node agent in a Slurm job; without it torch 2.13 deadlocks on the restart.
    env = env_without_job(
        SLURM_ELASTIC_JOB_DIR=str(job_dir), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"
    )
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += ["--max-restarts=2", str(EXAMPLE), *ARGS, "--epochs", "2"]
    argv += ["--sample-log", str(log), "--sample-sleep", "0.005", "--out", str(tmp_path / "w.pt")]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: any(r["step"] >= 4 for r in read_records(log)), 90, "training")
        write_json(job_dir / "control.json", Control(1, "hold", instruction_id="t").to_json())
        held = wait_for(lambda: read_json(job_dir / "held.json"), 30, "held.json")
        assert held["seq"] == 1
        assert list_checkpoints(job_dir / "checkpoints")[0][0] == held["step"]
        time.sleep(0.5)  # holding: nobody trains
        assert max(r["step"] for r in read_records(log)) == held["step"] - 1
        write_json(job_dir / "control.json", Control(1, "resume", restart=True).to_json())
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    recs = read_records(log)
    generations = sorted({r["gen"] for r in recs})
    assert len(generations) == 2  # torch elastic restarted the group once
    resumed = min(r["step"] for r in recs if r["gen"] == generations[1])
    assert resumed == held["step"]
    assert_same(weights(tmp_path / "w.pt"), reference)
    assert read_json(job_dir / "done.json")["step"] == 30


def test_sigterm_saves_the_last_completed_step(tmp_path: Path) -> None:
    log = tmp_path / "log"
    argv = [sys.executable, str(EXAMPLE), *ARGS, "--epochs", "2", "--sample-sleep", "0.01"]
    argv += ["--checkpoint-dir", str(tmp_path / "ck"), "--sample-log", str(log)]
    proc = subprocess.Popen(argv, env=env_without_job(), stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(r["step"] >= 3 for r in read_records(log)), 90, "training")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 75  # "restart me", as torch elastic expects
    finally:
        proc.kill()
    last_logged = max(r["step"] for r in read_records(log))
    # The step under way when SIGTERM came was finished, then saved: nothing to redo.
    assert list_checkpoints(tmp_path / "ck")[0][0] == last_logged + 1


def test_torchrun_wrapper_keeps_a_planned_restart_out_of_the_error_log(tmp_path: Path) -> None:
    """Two workers leave with the resize exit code once, as at a resize, then finish.
    Plain torchrun logs it as a failure (the control: this test could fail); our wrapper,
    which the nodes run, restarts the same way and logs nothing of it.  A real failure
    (exit 3) is still an error line."""
    script = tmp_path / "leave_once.py"
    script.write_text(
        "import os, sys\n"
        "first = os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'\n"
        "sys.exit(int(os.environ['EXIT_FIRST']) if first else 0)\n"
    )
    common = ["--standalone", "--nproc-per-node=2", "--max-restarts=1", str(script)]

    def run(module: str, first_exit: int) -> subprocess.CompletedProcess[str]:
        env = env_without_job(EXIT_FIRST=str(first_exit), PYTHONPATH=str(REPO))
        return subprocess.run(
            [sys.executable, "-m", module, *common],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    plain = run("torch.distributed.run", 75)
    assert plain.returncode == 0 and "failed (exitcode: 75)" in plain.stderr
    ours = run("slurm_elastic.agent.torchrun", 75)
    assert ours.returncode == 0, ours.stderr
    assert "failed (exitcode: 75)" not in ours.stderr and "closing signal" not in ours.stderr
    broken = run("slurm_elastic.agent.torchrun", 3)
    assert broken.returncode == 0 and "failed (exitcode: 3)" in broken.stderr


def test_torchrun_wrapper_ends_on_sigterm_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Slurm ends a step with SIGTERM (a companion given back, scancel): plain torchrun
    raises SignalException through 30 lines of traceback (the control); the wrapper says
    so in one line and exits 143, as a process the signal killed."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(120)\n")

    def stopped(module: str) -> tuple[int, str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--standalone", "--nproc-per-node=1", str(script)],
            env=env_without_job(PYTHONPATH=str(REPO)),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            time.sleep(8)  # torchrun up, its worker started
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
        return proc.returncode, out

    rc, out = stopped("torch.distributed.run")
    assert rc != 0 and "Traceback" in out and "SignalException" in out
    rc, out = stopped("slurm_elastic.agent.torchrun")
    assert rc == 128 + signal.SIGTERM, out[-2000:]
    assert "Traceback" not in out and "agent.torchrun_stopped" in out, out[-2000:]


@pytest.mark.parametrize(
    ("control", "leaves"),
    [
        (Control(4, "leave", keep_nodes=("n1", "n2")), True),  # open, its node dropped
        (Control(4, "leave_closed", keep_nodes=("n1", "n2")), False),  # answered: history
        (Control(4, "leave", keep_nodes=("n1", "n3")), False),  # its node is kept
        (Control(4, "checkpoint"), False),  # not a leave
    ],
)
def test_a_group_formed_during_an_open_leave_of_its_node_leaves(
    control: Control, leaves: bool
) -> None:
    """The rule ``test_agent_replicas`` runs with real groups: the torchft mode's groups
    take an open leave of their node as addressed to them, a closed one as history."""
    from slurm_elastic.agent.boundary import leave_open

    assert leave_open(control, "n3") is leaves
    assert not leave_open(control, "")  # the torchrun mode has no replica
