"""The launcher's follower against the daemon's real HTTP API and instruction board.

No jobs run: a thread stands in for the workers (it answers ``hold`` with ``held.json``) and
the node count is a function.  Acks are MUNGE-signed, so munged must run (it comes up with
the local cluster, hence the ``slurm`` mark).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.agent.follower import ControlWriter, Follower
from slurm_elastic.agent.jobdir import Control, ControlReader, read_json, write_json
from slurm_elastic.daemon.api import ApiContext, ApiServer
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.protocol import AckStatus, Instruction, InstructionKind

pytestmark = [pytest.mark.slurm]
JOB = 4242


@pytest.fixture
def daemon(slurm_cluster: object) -> Iterator[tuple[ApiServer, InstructionBoard]]:
    board = InstructionBoard()
    context = ApiContext(
        reports=ReportStore(),
        board=board,
        metrics=DaemonMetrics(),
        owner_of=lambda job: os.geteuid() if job == JOB else None,
        size_of=lambda job: None,  # no cycle runs here: no size is known
        status_document=lambda: None,
        health=lambda _now: (True, "test"),
        clock=time.time,
    )
    server = ApiServer(context, "127.0.0.1", 0)
    server.start()
    yield server, board
    server.stop()


def post(
    board: InstructionBoard,
    target: int,
    keep: tuple[str, ...] = ("n1",),
    release: tuple[int, ...] = (),
) -> Instruction:
    instruction = Instruction(
        id=f"i-{time.monotonic_ns()}",
        kind=InstructionKind.SHRINK,
        target_nodes=target,
        keep_nodes=keep,
        deadline=time.time() + 10,
        release=release,
    )
    board.post(JOB, instruction)
    return instruction


def follower(
    tmp_path: Path, url: str, sizes: list[int], *, library: bool = True, mode: str = "torchrun"
) -> Follower:
    """``library``: the workers use the training library (it wrote agent.json), so shrinks
    go through the hold protocol; without it, through the signal contract."""
    if library:
        write_json(tmp_path / "agent.json", {"generation": 1})
    return Follower(
        mode=mode,
        job_id=JOB,
        job_dir=tmp_path,
        api=url,
        min_nodes=1,
        batch_host="n1",
        control=ControlWriter(tmp_path),
        node_count=lambda: sizes[0],
        poll_s=0.1,
        hold_timeout_s=1.0,
        applied_grace_s=1.0,
        stop_grace_s=1.0,
    )


def fake_workers(tmp_path: Path, step: int) -> threading.Thread:
    """Answer the first hold like rank 0 does: held.json with the request's seq."""

    def run() -> None:
        reader = ControlReader(tmp_path)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            control = reader.read()
            if control is not None and control.action == "hold":
                write_json(tmp_path / "held.json", {"seq": control.seq, "step": step})
                return
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_hold_ack_ready_then_restart_once_slurm_shrank(tmp_path: Path, daemon) -> None:
    server, board = daemon
    sizes = [2]
    instruction = post(board, 1)
    fake_workers(tmp_path, step=77)
    f = follower(tmp_path, server.url, sizes)

    def shrink_after_ack() -> None:  # the daemon's next cycle: scontrol update NumNodes=1
        while board.ack_for(instruction.id) is None:
            time.sleep(0.02)
        sizes[0] = 1

    threading.Thread(target=shrink_after_ack, daemon=True).start()
    f.poll_once()
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.READY and ack.step == 77
    assert ControlReader(tmp_path).read() == Control(1, "resume", restart=True)
    # srun's report of the removed node's task is the shrink's, the kept node's is not.
    assert f.removal.expects("n2") and not f.removal.expects("n1")
    f.poll_once()  # the same instruction again: already answered, nothing new
    assert ControlReader(tmp_path).read().seq == 1


def test_companions_given_back_end_by_themselves_before_the_ack(tmp_path: Path, daemon) -> None:
    """A shrink from 3 nodes (2 + companion 501) to 2 releases the companion: the follower
    names it in release.json and acks only once Slurm no longer shows it running, so that
    the daemon has nothing to cancel (no "CANCELLED" lines in the companion's output)."""
    server, board = daemon
    sizes = [3]
    running = {501}
    instruction = post(board, 2, keep=("n1", "n2"), release=(501,))
    fake_workers(tmp_path, step=12)
    f = follower(tmp_path, server.url, sizes)
    f.running = lambda ids: running & set(ids)
    seen_at_ack: list[set[int]] = []

    def companion_leaves() -> None:  # the companion's node agents (agent.stopping)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            record = read_json(tmp_path / "release.json")
            if record and record["jobs"] == [501]:
                time.sleep(0.3)  # torchrun stops, srun and the batch script end
                running.clear()
                sizes[0] = 2
                break
            time.sleep(0.02)
        while board.ack_for(instruction.id) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        seen_at_ack.append(set(running))

    watcher = threading.Thread(target=companion_leaves, daemon=True)
    watcher.start()
    f.poll_once()
    watcher.join(5)
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.READY and ack.step == 12
    assert seen_at_ack == [set()]  # the companion had ended when the job acked
    assert ControlReader(tmp_path).read() == Control(1, "resume", restart=True)


def test_a_companion_that_does_not_leave_is_left_to_the_daemon(tmp_path: Path, daemon) -> None:
    """A companion still running after RELEASE_TIMEOUT_S: the follower acks anyway (the
    daemon cancels it when it applies the shrink)."""
    server, board = daemon
    instruction = post(board, 2, keep=("n1", "n2"), release=(502,))
    fake_workers(tmp_path, step=3)
    f = follower(tmp_path, server.url, [3])
    f.running = lambda ids: set(ids)  # never ends
    clock = [1000.0]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    f.clock = tick
    f.release(instruction)
    assert clock[0] - 1000.0 >= 20.0  # it waited out RELEASE_TIMEOUT_S, then went on


def test_refusals_and_silent_workers_answer_failed(tmp_path: Path, daemon) -> None:
    server, board = daemon
    f = follower(tmp_path, server.url, [2])
    refused = post(board, 1, keep=("n2",))
    f.poll_once()
    ack = board.ack_for(refused.id)
    assert ack.status is AckStatus.FAILED and "batch host n1" in ack.detail
    assert ControlReader(tmp_path).read() is None  # nothing asked of the workers

    silent = post(board, 1)
    f.poll_once()  # nobody writes held.json: the hold times out
    ack = board.ack_for(silent.id)
    assert ack.status is AckStatus.FAILED and "did not reach a checkpoint" in ack.detail
    assert ControlReader(tmp_path).read() == Control(1, "resume", restart=False)
    assert not f.removal.expects("n2")  # no shrink agreed: a task ending now is an error


def test_withdrawn_instruction_resumes_in_place(tmp_path: Path, daemon) -> None:
    server, board = daemon
    instruction = post(board, 1)
    fake_workers(tmp_path, step=5)
    f = follower(tmp_path, server.url, [2])

    def withdraw_after_ack() -> None:  # the daemon rolled back (e.g. a Slurm error)
        while board.ack_for(instruction.id) is None:
            time.sleep(0.02)
        board.clear(JOB)

    threading.Thread(target=withdraw_after_ack, daemon=True).start()
    f.poll_once()
    assert ControlReader(tmp_path).read() == Control(1, "resume", restart=False)


def test_a_script_without_the_library_is_shrunk_by_the_signal_contract(
    tmp_path: Path, daemon
) -> None:
    """No agent.json: the follower asks every node to stop its workers (control "signal"),
    waits for their stopped-<node>.json (at most the grace), then acks ready with the work
    that may be redone; no hold, no held.json, no retry."""
    server, board = daemon
    sizes = [2]
    instruction = post(board, 1)
    f = follower(tmp_path, server.url, sizes, library=False)

    def nodes_stop() -> None:  # what each node's StopWatcher writes
        reader = ControlReader(tmp_path)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            control = reader.read()
            if control is not None and control.action == "signal":
                for node, trained in (("n1", 120.0), ("n2", 95.5)):
                    record = {"seq": control.seq, "node": node, "trained_since_start_s": trained}
                    write_json(tmp_path / f"stopped-{node}.json", record)
                while board.ack_for(instruction.id) is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                sizes[0] = 1  # the daemon shrank the job
                return
            time.sleep(0.02)

    threading.Thread(target=nodes_stop, daemon=True).start()
    f.poll_once()
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.READY, ack
    assert "signal contract: 2 of 2 nodes stopped" in ack.detail
    assert "up to 120s of training" in ack.detail
    control = ControlReader(tmp_path).read()
    assert control is not None and (control.seq, control.action) == (1, "signal")
    assert f.removal.expects("n1") and f.removal.expects("n2")  # every task may end
    assert not (tmp_path / "held.json").exists()


def test_the_signal_contract_goes_ahead_after_the_grace_when_nodes_stay_silent(
    tmp_path: Path, daemon
) -> None:
    server, board = daemon
    instruction = post(board, 1)
    f = follower(tmp_path, server.url, [2], library=False)
    started = time.monotonic()
    f.poll_once()  # nobody writes stopped-*.json: the grace (1 s) + 5 s, then the shrink
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.READY
    assert "0 of 2 nodes stopped" in ack.detail
    assert time.monotonic() - started < 15


def test_a_stop_free_shrink_asks_the_leaving_groups_to_leave_and_acks_once_they_left(
    tmp_path: Path, daemon
) -> None:
    """The torchft mode: ``leave`` names the nodes that stay; the group on n2 answers with
    left-n2.json (as agent.boundary does); the ack says how many left after which step, and
    nothing is held or resumed."""
    server, board = daemon
    sizes = [2]
    instruction = post(board, 1, keep=("n1",))

    def group_on_n2() -> None:
        reader = ControlReader(tmp_path)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            control = reader.read()
            if control is not None and control.action == "leave" and "n2" not in control.keep_nodes:
                left = {"seq": control.seq, "step": 31, "node": "n2"}
                write_json(tmp_path / "left-n2.json", left)
                return
            time.sleep(0.02)

    def shrink_after_ack() -> None:
        while board.ack_for(instruction.id) is None:
            time.sleep(0.02)
        sizes[0] = 1

    threading.Thread(target=group_on_n2, daemon=True).start()
    threading.Thread(target=shrink_after_ack, daemon=True).start()
    follower(tmp_path, server.url, sizes, mode="torchft").poll_once()
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.READY and ack.step == 31, ack
    assert ack.detail.startswith("stop-free: 1 of 1 replica groups left the quorum after step 31")
    # The leave is closed once answered (same seq): a group that forms later stays.
    control = ControlReader(tmp_path).read()
    assert control is not None and control.keep_nodes == ("n1",)
    assert (control.seq, control.action) == (1, "leave_closed"), control


def test_a_stop_free_shrink_that_no_group_answers_fails(tmp_path: Path, daemon) -> None:
    server, board = daemon
    instruction = post(board, 1, keep=("n1",))
    follower(tmp_path, server.url, [2], mode="torchft").poll_once()
    ack = board.ack_for(instruction.id)
    assert ack is not None and ack.status is AckStatus.FAILED
    assert "no replica group left the quorum in time" in ack.detail
    control = ControlReader(tmp_path).read()  # closed too: the wait for answers is over
    assert control is not None and control.action == "leave_closed", control
    unnamed = post(board, 1, keep=())
    follower(tmp_path, server.url, [2], mode="torchft").poll_once()
    ack = board.ack_for(unnamed.id)
    assert ack is not None and ack.status is AckStatus.FAILED
    assert "must name the nodes that stay" in ack.detail
