"""The torchft mode with real processes (torchft lighthouse, torchrun, gloo, CPU), no Slurm.

Each "node" is the node agent's command and environment for this mode
(``replica_group_argv``, ``node_env``) around the example; the lighthouse is the launcher's
(``agent.lighthouse``).  A group leaves on ``control.json``'s ``leave``, another joins
mid-run and is healed from a peer, and one is killed: the survivors' processes never
restart, every sample is trained on once per epoch, and the weights equal those of one
process never resized.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.agent.jobdir import Control, LaunchInfo, read_json, write_json
from slurm_elastic.agent.lighthouse import Lighthouse
from slurm_elastic.agent.node import TORCHRUN_VARIABLES, node_env
from slurm_elastic.agent.rendezvous import choose_port, replica_group_argv
from slurm_elastic.samplelog import lineage, read_records, samples_per_epoch

pytestmark = [pytest.mark.torch]
torch = pytest.importorskip("torch")
pytest.importorskip("torchft")
from slurm_elastic.agent.replicas import Membership  # noqa: E402  (needs torch and torchft)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_mlp.py"
SAMPLES = 600
ARGS = ["--samples", str(SAMPLES), "--global-batch", "40", "--micro-batch", "8", "--seed", "5"]


@pytest.fixture
def lighthouse() -> Iterator[Lighthouse]:
    server = Lighthouse("127.0.0.1", choose_port("127.0.0.1"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def launch_info(
    lighthouse: Lighthouse, job_dir: Path, argv: list[str], nproc: int = 1
) -> LaunchInfo:
    """What the parent launcher writes in the torchft mode (``agent.launcher``)."""
    return LaunchInfo(
        job_id=1,
        argv=("python", *argv),
        nproc_per_node=nproc,
        rdzv_host=lighthouse.host,
        rdzv_port=lighthouse.port,
        rdzv_id="test",
        min_nodes=1,
        max_nodes=4,
        batch_host="n1",
        max_restarts=0,
        api="",
        job_dir=str(job_dir),
        created_at=0.0,
        mode="torchft",
    )


class Groups:
    """The replica groups of one job: ``torchrun --standalone`` each, as the node agent runs."""

    def __init__(
        self, tmp: Path, lighthouse: Lighthouse, epochs: int, sleep: float, nproc: int = 1
    ) -> None:
        self.nproc = nproc
        self.tmp = tmp
        self.lighthouse = lighthouse
        self.job_dir = tmp / "job"
        self.job_dir.mkdir()
        self.log = tmp / "samples"
        self.out = tmp / "final.pt"
        self.args = [*ARGS, "--epochs", str(epochs), "--sample-sleep", str(sleep)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str) -> None:
        script = [str(EXAMPLE), *self.args, "--sample-log", str(self.log), "--out", str(self.out)]
        script += ["--checkpoint-dir", str(self.tmp / "ck")]
        info = launch_info(self.lighthouse, self.job_dir, script, self.nproc)
        env = node_env(info, "127.0.0.1", {**own_environment(), "SLURMD_NODENAME": node}, node)
        with open(self.tmp / f"{node}.out", "wb") as out:
            self.procs[node] = subprocess.Popen(
                replica_group_argv(info, python=sys.executable),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def workers(self, node: str) -> set[int]:
        """The worker processes of ``node``: with one per node, the node agent's command is
        the worker itself (``replica_group_argv``)."""
        return {self.procs[node].pid}

    def records(self) -> list[dict]:
        return read_records(self.log)

    def steps_done(self) -> int:
        return max((r["step"] for r in self.records()), default=-1)

    def wait_step(self, step: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.steps_done() < step:
            if time.monotonic() > deadline:
                pytest.fail(f"no step {step} in {timeout}s:\n{self.outputs()}")
            time.sleep(0.05)

    def wait_trained(self, pid: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(r["pid"] == pid for r in self.records()):
            failed = any(proc.poll() not in (None, 0) for proc in self.procs.values())
            if failed or time.monotonic() > deadline:
                pytest.fail(f"process {pid} trained nothing in {timeout}s:\n{self.outputs()}")
            time.sleep(0.05)

    def wait_all_trained(self, nodes: tuple[str, ...]) -> None:
        """Every process of ``nodes`` in the quorum, however late one started, and two more
        steps taken together."""
        for node in nodes:
            for pid in self.workers(node):
                self.wait_trained(pid)
        self.wait_step(self.steps_done() + 2)

    def ask_to_leave(self, keep: tuple[str, ...]) -> None:
        """What the follower writes for a stop-free shrink: the groups outside ``keep`` leave."""
        write_json(
            self.job_dir / "control.json",
            Control(1, "leave", instruction_id="t", keep_nodes=keep).to_json(),
        )

    def close_leave(self, keep: tuple[str, ...]) -> None:
        """What the follower writes once the answers are in: groups that form later stay."""
        write_json(
            self.job_dir / "control.json",
            Control(1, "leave_closed", instruction_id="t", keep_nodes=keep).to_json(),
        )

    def wait_world(self, world: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(r["world"] == world for r in self.records()):
            if time.monotonic() > deadline:
                pytest.fail(f"no step at {world} groups in {timeout}s:\n{self.outputs()}")
            time.sleep(0.05)

    def wait(self, node: str, timeout: float = 120.0) -> int:
        try:
            return self.procs[node].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{node} did not end in {timeout}s:\n{self.outputs()}")

    def outputs(self) -> str:
        return "\n".join(
            f"--- {node}\n{(self.tmp / f'{node}.out').read_text(errors='replace')[-3000:]}"
            for node in self.procs
        )

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def own_environment() -> dict[str, str]:
    """This process's environment less what belongs to a job or a torchrun: importing
    ``agent.elastic`` (an earlier test) gives it a one-process RANK and MASTER_PORT."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "TORCHFT")) and k not in TORCHRUN_VARIABLES
    }


def reference_weights(tmp: Path, epochs: int) -> dict[str, torch.Tensor]:
    """One process, never resized, the same data and rule."""
    env = own_environment()
    out = tmp / "reference.pt"
    subprocess.run(
        [sys.executable, str(EXAMPLE), *ARGS, "--epochs", str(epochs), "--out", str(out)],
        env={**env, "OMP_NUM_THREADS": "1"},
        check=True,
        capture_output=True,
        timeout=180,
        cwd=tmp,
    )
    return torch.load(out)


def assert_exactly_once(records: list[dict], epochs: int) -> None:
    seen = samples_per_epoch(records)
    assert sorted(seen) == list(range(epochs))
    for epoch, samples in seen.items():
        assert sorted(samples) == list(range(SAMPLES)), f"epoch {epoch}"


def is_subsequence(wanted: list[int], seen: list[int]) -> bool:
    it = iter(seen)
    return all(any(w == s for s in it) for w in wanted)


def test_a_group_leaves_and_another_joins_without_a_restart(
    tmp_path: Path, lighthouse: Lighthouse
) -> None:
    """2 groups -> n2 leaves on control.json -> 1 -> n3 and n4 join -> 3; to the end."""
    groups = Groups(tmp_path, lighthouse, epochs=3, sleep=0.01)
    try:
        groups.start("n1")
        groups.start("n2")
        workers = {node: groups.workers(node) for node in ("n1", "n2")}
        groups.wait_all_trained(("n1", "n2"))
        groups.ask_to_leave(keep=("n1",))
        assert groups.wait("n2", 60) == 0, groups.outputs()  # left cleanly
        left = read_json(groups.job_dir / "left-n2.json")
        assert left is not None and left["seq"] == 1 and left["node"] == "n2"
        groups.close_leave(keep=("n1",))
        left_at = groups.steps_done()
        groups.wait_step(left_at + 3)
        groups.start("n3")
        groups.start("n4")
        groups.wait_world(3)
        workers |= {node: groups.workers(node) for node in ("n3", "n4")}
        assert groups.workers("n1") == workers["n1"]
        assert groups.wait("n1", 180) == 0, groups.outputs()
        for node in ("n3", "n4"):
            assert groups.wait(node, 60) == 0, groups.outputs()
    finally:
        groups.close()

    records = groups.records()
    by_world = sorted({(r["gen"], r["world"]) for r in records})
    worlds = [w for _, w in by_world]
    assert is_subsequence([2, 1, 3], worlds) and worlds[-1] == 3, by_world
    assert_exactly_once(records, epochs=3)
    steps = sorted(lineage(records))
    assert steps == list(range(len(steps)))  # every step once in what the model kept
    # One worker process per group, from its first step to its last: nobody restarted.
    assert {r["pid"] for r in records} == set().union(*workers.values())
    assert all(len(pids) == 1 for pids in workers.values()), workers
    (n1,) = workers["n1"]
    assert n1 in {r["pid"] for r in lineage(records)[steps[-1]]}
    log = (tmp_path / "n3.out").read_text()
    assert "trainer.healed" in log, log[-2000:]
    # torchft's chatter about normal operation stays out of the job's output.
    for node in ("n1", "n2", "n3", "n4"):
        out = (tmp_path / f"{node}.out").read_text()
        assert "flight recorder" not in out and "GET /checkpoint" not in out, out[-2000:]
        assert "Warning" not in out and "Traceback" not in out, out[-2000:]
    final = torch.load(groups.out)
    reference = reference_weights(tmp_path, epochs=3)
    for key, value in reference.items():
        assert torch.allclose(final[key], value, rtol=1e-9, atol=1e-10), key


def test_a_group_that_forms_during_a_leave_of_its_node_leaves_too(
    tmp_path: Path, lighthouse: Lighthouse
) -> None:
    """Issue 20, item 6 (found by the end-to-end benchmark): a shrink decided while a
    grow's companion was still starting names the companion's node.  Its group forms while
    the leave is open and leaves at its first boundary (it took the leave as answered, and
    the shrink waited out its timeout); once the leave is closed a group that forms stays."""
    groups = Groups(tmp_path, lighthouse, epochs=2, sleep=0.01)
    try:
        groups.start("n1")
        groups.wait_all_trained(("n1",))
        groups.ask_to_leave(keep=("n1",))
        groups.start("n3")  # the companion, starting while the shrink that drops it is out
        assert groups.wait("n3", 90) == 0, groups.outputs()  # left cleanly
        left = read_json(groups.job_dir / "left-n3.json")
        assert left is not None and left["seq"] == 1 and left["node"] == "n3", left
        groups.close_leave(keep=("n1",))
        groups.start("n4")  # a later companion on another node: the leave is history
        groups.wait_world(2)
        assert groups.wait("n1", 180) == 0 and groups.wait("n4", 60) == 0, groups.outputs()
    finally:
        groups.close()
    assert_exactly_once(groups.records(), epochs=2)


def test_a_killed_group_costs_the_others_a_redone_step_not_a_restart(
    tmp_path: Path, lighthouse: Lighthouse
) -> None:
    groups = Groups(tmp_path, lighthouse, epochs=1, sleep=0.02)
    try:
        for node in ("n1", "n2", "n3"):
            groups.start(node)
        survivors = groups.workers("n1") | groups.workers("n2")
        (victim,) = groups.workers("n3")
        # Under load a group may start late and the others train without it for a while:
        # the kill lands once all three are in the quorum and have trained.
        for pid in survivors | {victim}:
            groups.wait_trained(pid)
        groups.wait_step(groups.steps_done() + 1)
        assert groups.procs["n3"].poll() is None, "the training ended before the kill"
        killed_at = groups.steps_done()
        os.kill(victim, signal.SIGKILL)
        assert groups.wait("n1", 180) == 0, groups.outputs()
        assert groups.wait("n2", 60) == 0, groups.outputs()
    finally:
        groups.close()
    records = groups.records()
    assert_exactly_once(records, epochs=1)
    assert {r["pid"] for r in records} == survivors | {victim}  # no survivor restarted
    assert max(r["step"] for r in records) > killed_at + 1  # the survivors trained on
    final = torch.load(groups.out)
    reference = reference_weights(tmp_path, epochs=1)
    for key, value in reference.items():
        assert torch.allclose(final[key], value, rtol=1e-9, atol=1e-10), key


def test_groups_of_two_processes_train_exactly(tmp_path: Path, lighthouse: Lighthouse) -> None:
    """Two processes per node: each group runs under its own torchrun (``--standalone``),
    sums its gradients inside, then across the quorum; a group joins mid-run."""
    groups = Groups(tmp_path, lighthouse, epochs=2, sleep=0.02, nproc=2)
    try:
        groups.start("n1")
        groups.wait_step(3)
        groups.start("n2")
        groups.wait_world(4)
        for node in ("n1", "n2"):
            assert groups.wait(node, 120) == 0, groups.outputs()
    finally:
        groups.close()
    records = groups.records()
    assert_exactly_once(records, epochs=2)
    final = torch.load(groups.out)
    for key, value in reference_weights(tmp_path, epochs=2).items():
        assert torch.allclose(final[key], value, rtol=1e-9, atol=1e-10), key


def test_a_per_group_batch_follows_the_quorum_and_sees_each_sample_once(
    tmp_path: Path, lighthouse: Lighthouse
) -> None:
    """``--batch-mode linear`` (each rank keeps its batch, the global batch follows the
    world): a step's global batch is the micro batch times the groups in that step's quorum,
    and a group leaving mid-epoch loses no sample and repeats none."""
    groups = Groups(tmp_path, lighthouse, epochs=1, sleep=0.01)
    groups.args += ["--batch-mode", "linear"]
    try:
        groups.start("n1")
        groups.start("n2")
        groups.wait_all_trained(("n1", "n2"))
        groups.ask_to_leave(keep=("n1",))
        assert groups.wait("n2", 60) == 0, groups.outputs()
        assert groups.wait("n1", 180) == 0, groups.outputs()
    finally:
        groups.close()
    records = groups.records()
    assert_exactly_once(records, epochs=1)
    kept = lineage(records)
    sizes = {(rows[0]["world"], sum(len(r["idx"]) for r in rows)) for rows in kept.values()}
    # micro batch 8 per group; an epoch's last step may be short (600 is no multiple of 16).
    assert {(2, 16), (1, 8)} <= sizes, sizes
    assert all(n <= 8 * world for world, n in sizes), sizes


def test_a_new_lighthouse_numbers_its_steps_after_the_old_ones() -> None:
    """A new lighthouse numbers its quorums from 1 again: the lighthouse's epoch keeps the
    sample log's generations growing, so the steps redone after it supersede the old ones."""
    old = Membership(2, 0, 1, 0, quorum_id=500, retries=3, lighthouse_epoch=0)
    new = Membership(2, 0, 1, 0, quorum_id=1, retries=0, lighthouse_epoch=1)
    assert new.generation > old.generation
    assert Membership(2, 0, 1, 0, 7, 2).generation == 7002  # the first lighthouse: as before
