"""The drop-in API (``agent.elastic``) for DDP scripts: its sampler, and real processes.

The script is ``examples/ddp_tutorial/train_elastic.py``, the tutorial-shaped DDP script
(``train.py`` beside it) made elastic: DDP, a ``DataLoader`` with two workers, the elastic
batch sampler, ``restore``/``step_done``.  Real torchrun and gloo processes, no Slurm (the
end-to-end resize through the daemon is in ``test_agent_e2e.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.agent.jobdir import Control, read_json, write_json
from slurm_elastic.samplelog import read_records, samples_per_epoch, steps_lost

pytestmark = [pytest.mark.torch]
torch = pytest.importorskip("torch")

from slurm_elastic.agent.elastic import SAMPLE_LOG_ENV, BatchSampler  # noqa: E402
from slurm_elastic.agent.sampler import SamplerState  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "examples" / "ddp_tutorial" / "train.py"
ELASTIC = REPO / "examples" / "ddp_tutorial" / "train_elastic.py"
SAMPLES = 480  # 10 steps an epoch at the global batch of 48: equal shares at 1, 2 or 3 ranks
# 2 epochs; the tutorial's own snapshot every 2 epochs: after epoch 0 only.
ARGS = ["2", "2", "--samples", str(SAMPLES), "--batch_size", "48"]


# --------------------------------------------------------------------------- the sampler


def walk(sampler: BatchSampler, plan: list[tuple[int, int]], epochs: int) -> dict[int, list[int]]:
    """Train ``epochs`` epochs through ``plan`` ((world size, steps) ..., the last size to the
    end): every step's shares of every rank, per epoch, checked on the way."""
    position, seen = SamplerState(), {}
    segments = iter(plan)
    world, left = next(segments)
    while position.epoch < epochs:
        if left == 0:
            world, left = next(segments, (world, -1))
        shares = [sampler.expected(position, world, rank) for rank in range(world)]
        sizes = [len(s) for s in shares]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, sizes
        size = sampler.step_size(position.offset, world)
        assert sum(sizes) == size
        seen.setdefault(position.epoch, []).extend(i for s in shares for i in s)
        position = sampler.sampler.advance(position, size)
        left -= 1
    return seen


@settings(max_examples=200, deadline=None)
@given(
    samples=st.integers(1, 120),
    global_batch=st.integers(1, 40),
    plan=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=5),
)
def test_every_sample_once_per_epoch_whatever_the_sizes(
    samples: int, global_batch: int, plan: list[tuple[int, int]]
) -> None:
    biggest = max(world for world, _ in plan)
    if global_batch < biggest or samples < biggest:
        return  # refused (below)
    sampler = BatchSampler(samples, global_batch, seed=7, max_world_size=biggest)
    seen = walk(sampler, plan, epochs=2)
    assert sorted(seen) == [0, 1]
    for order in seen.values():
        assert sorted(order) == list(range(samples))


def test_a_remainder_too_small_for_every_rank_joins_the_step_before() -> None:
    sampler = BatchSampler(50, 24, max_world_size=3)
    # 2 left after two steps: fewer than the 3 ranks the job may have, at any size now.
    assert [sampler.step_size(o, 1) for o in (0, 24)] == [24, 26]
    assert [sampler.step_size(o, 3) for o in (0, 24)] == [24, 26]
    assert sampler.steps_left(0, 2) == 2
    assert [BatchSampler(50, 24).step_size(o, 1) for o in (0, 24, 48)] == [24, 24, 2]
    # Without a stated maximum the world of the moment protects itself.
    assert BatchSampler(50, 24).step_size(24, 3) == 26


def test_the_batches_continue_inside_an_epoch() -> None:
    sampler = BatchSampler(100, 10, seed=3)
    whole = list(sampler.batches(SamplerState(), 2, 1))
    resumed = list(sampler.batches(SamplerState(epoch=0, offset=30), 2, 1))
    assert len(whole) == 10 and resumed == whole[3:]


def test_a_world_larger_than_the_global_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot give each of 4 ranks a sample"):
        next(BatchSampler(100, 3).batches(SamplerState(), 4, 0))


def test_the_drop_ins_refuse_the_stop_free_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``--mode torchft`` DDP would average inside each node only: each node would
    train alone, silently.  The drop-ins say so instead."""
    from slurm_elastic.agent import elastic
    from slurm_elastic.agent.modes import MODE_ENV
    from slurm_elastic.errors import AgentError

    monkeypatch.setenv(MODE_ENV, "torchft")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for call in (
        lambda: BatchSampler(100, 10),
        elastic.init_process_group,
        lambda: elastic.restore(model, optimizer),
    ):
        with pytest.raises(AgentError, match="run this script with slurm-elastic run --mode"):
            call()
    monkeypatch.setenv(MODE_ENV, "torchrun")
    assert BatchSampler(100, 10).global_batch == 10


def test_the_import_leaves_no_torchrun_variables_to_the_tests_subprocesses() -> None:
    """This module imported agent.elastic, which set RANK and MASTER_PORT in os.environ; the
    conftest fixture takes them back before each test, or every job and subprocess a test
    starts would inherit a stale port (tests/conftest.py: TORCHRUN_VARIABLES)."""
    from tests.conftest import _OUTER_ENV

    assert "MASTER_PORT" in _OUTER_ENV
    for name, value in _OUTER_ENV.items():
        assert os.environ.get(name) == value, name


# --------------------------------------------------------------------------- processes


def env_without_job(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "LOCAL_"))}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def launcher(procs: int) -> list[str]:
    if procs == 0:
        return [sys.executable]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={procs}",
    ]


def train(cwd: Path, procs: int, *more: str, script: Path = ELASTIC) -> str:
    """Run the script to the end in ``cwd`` (0 procs: plain python); its output."""
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [*launcher(procs), str(script), *ARGS, "--out", str(cwd / "final.pt"), *more],
        cwd=cwd,
        env=env_without_job(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        # float64; only the summation order of the gradients differs between world sizes.
        assert torch.allclose(a[key], b[key], rtol=1e-9, atol=1e-12), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The elastic script under plain python: one process, never resized."""
    work = tmp_path_factory.mktemp("reference")
    train(work, 0)
    return torch.load(work / "final.pt")


def test_the_elastic_script_trains_the_same_on_any_number_of_ranks(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    for procs in (2, 3):
        output = train(tmp_path / f"p{procs}", procs)
        assert_same(torch.load(tmp_path / f"p{procs}" / "final.pt"), reference)
        assert output.count("Epoch 1 | Batchsize: ") == procs  # the tutorial's print, per rank
    # The job's checkpoint, not the tutorial's older snapshot (after epoch 0), decides where
    # a rerun starts: at the end, so nothing is trained again.
    rerun = train(tmp_path / "p2", 2)
    assert "Resuming training from snapshot at Epoch 1" in rerun  # the script's code still runs
    assert "Batchsize" not in rerun
    assert_same(torch.load(tmp_path / "p2" / "final.pt"), reference)


def test_the_plain_script_still_runs_under_torchrun(tmp_path: Path) -> None:
    output = train(tmp_path, 2, script=PLAIN)
    assert output.count("Epoch 1 | Batchsize: 48 | Steps: 5") == 2  # its per-rank batch of 48


def test_a_restart_at_another_size_continues_exactly(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Two ranks train, hold at a step boundary (checkpoint + held.json) as for a shrink,
    and are killed; three ranks start on the same job directory and finish.  Every sample
    once per epoch, no step redone, the weights of the run that never resized."""
    job_dir, log = tmp_path / "job", tmp_path / "log"
    job_dir.mkdir()
    env = env_without_job(
        SLURM_ELASTIC_JOB_DIR=str(job_dir),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # as the node agent sets it
        **{SAMPLE_LOG_ENV: str(log)},
    )
    argv = [str(ELASTIC), *ARGS, "--sample-sleep", "0.01", "--out", str(tmp_path / "final.pt")]
    first = subprocess.Popen(
        [*launcher(2), *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: any(r["step"] >= 5 for r in read_records(log)), 120, "training")
        write_json(job_dir / "control.json", Control(1, "hold", instruction_id="t").to_json())
        held = wait_for(lambda: read_json(job_dir / "held.json"), 60, "held.json")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    # What the launcher does before the group re-forms at the new size.
    write_json(job_dir / "control.json", Control(1, "resume", restart=True).to_json())
    second = subprocess.run(
        [*launcher(3), *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert second.returncode == 0, second.stderr[-3000:]

    records = read_records(log)
    worlds = [w for _, w in sorted({(r["gen"], r["world"]) for r in records})]
    assert worlds == [2, 3]
    assert steps_lost(records) == [0]
    assert min(r["step"] for r in records if r["world"] == 3) == held["step"]
    for epoch, seen in samples_per_epoch(records).items():
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch}"
    assert_same(torch.load(tmp_path / "final.pt"), reference)
    assert read_json(job_dir / "done.json")["step"] == 20


def test_step_done_out_of_step_with_the_loader_is_an_error(tmp_path: Path) -> None:
    script = "\n".join(
        [
            "import torch",
            "from torch.utils.data import DataLoader",
            "from slurm_elastic.agent import elastic",
            "model = torch.nn.Linear(2, 1)",
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
            "state = elastic.restore(model, opt)",
            "data = [torch.zeros(2)] * 8",
            "for batch in DataLoader(data, batch_sampler=elastic.BatchSampler(data, 2)):",
            "    elastic.step_done(state)",
            "    elastic.step_done(state)",  # two steps per batch: not what the sampler gave
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env_without_job(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "call step_done() once per batch" in done.stderr
    assert not (tmp_path / "checkpoints").exists() or not any(
        p.name.endswith(".pt") and "00000002" in p.name
        for p in (tmp_path / "checkpoints").iterdir()
    )


def test_the_port_changes_at_most_ten_lines() -> None:
    """Issue 23's bound on the porting diff, on the two scripts the docs show."""
    numstat = subprocess.run(
        ["git", "diff", "--no-index", "--numstat", str(PLAIN), str(ELASTIC)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    added, removed = int(numstat[0]), int(numstat[1])
    assert 0 < added + removed <= 10, (added, removed)
    # docs/porting.md shows this very diff.
    diff = subprocess.run(
        ["git", "diff", "--no-index", str(PLAIN), str(ELASTIC)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    shown = (REPO / "docs" / "porting.md").read_text().split("```diff\n", 1)[1].split("```", 1)[0]
    assert shown == diff[diff.index("@@") :]


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_to_the_process_group_saves_the_last_step_despite_dataloader_workers(
    tmp_path: Path,
) -> None:
    """What torch elastic does to re-form the group at a grow: SIGTERM to the worker's whole
    process group.  The DataLoader's worker processes must not take the rank down with
    them: the rank ends its step, saves it, and leaves with the resize code."""
    log = tmp_path / "log"
    argv = [str(ELASTIC), *ARGS, "--sample-sleep", "0.01"]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=tmp_path,
        env=env_without_job(**{SAMPLE_LOG_ENV: str(log)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: any(r["step"] >= 3 for r in read_records(log)), 120, "training")
        os.killpg(proc.pid, signal.SIGTERM)
        err, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert "Traceback" not in err and "reason=terminate" in err
    last_logged = max(r["step"] for r in read_records(log))
    saved = sorted((tmp_path / "checkpoints").glob("ckpt-*.pt"))[-1].name
    assert saved == f"ckpt-{last_logged + 1:08d}.pt"  # the step under way, finished and kept


def _workers_share_the_temp_dir(answers: Any) -> None:
    """In a child of pytest (whose own temp dir must stay): make the sampler, then fork a
    DataLoader-like worker."""
    import multiprocessing
    import multiprocessing.util

    BatchSampler(50, 24)
    made = multiprocessing.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    seen: Any = multiprocessing.get_context("fork").Queue()
    worker = multiprocessing.get_context("fork").Process(
        target=lambda: seen.put(multiprocessing.util.get_temp_dir())
    )
    worker.start()
    worker.join(30)
    still_there = made is not None and os.path.isdir(made)  # the worker removed nothing
    answers.put((made, seen.get(timeout=10), still_there))


def test_dataloader_workers_share_the_samplers_temp_dir() -> None:
    """A worker with a directory of its own could print "OSError: [Errno 39] Directory not
    empty: '/tmp/pymp-...'" as it exits (a traceback in the job's output at a resize, seen
    in CI); the sampler makes the directory first, so workers share it."""
    import multiprocessing

    answers: Any = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(
        target=_workers_share_the_temp_dir, args=(answers,)
    )
    child.start()
    made, in_worker, after_worker = answers.get(timeout=60)
    child.join(30)
    assert made is not None and in_worker == made and after_worker
