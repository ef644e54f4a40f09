"""The launcher's side of a shrink: follow the daemon's instructions (docs/CONTRACTS.md).

For each new ``shrink`` instruction:

1. refuse at once (``ack failed``) what would break the job: below its minimum, dropping
   the batch host (which hosts the rendezvous store), or an unknown kind;
2. ``hold``: the workers agree (inside their gradient all-reduce) on a step boundary, rank
   0 checkpoints, and every rank waits; rank 0 confirms in ``held.json``;
3. end the companions the shrink gives back (``release.json``: their node agents stop
   torchrun and leave, so they finish as completed jobs, not cancelled ones), at most
   ``RELEASE_TIMEOUT_S``;
4. ``POST ack {"status": "ready", "step": k}``: the daemon may now ``scontrol update``;
5. wait until Slurm shows the target size (the tasks on the parent's removed nodes are
   SIGKILLed while idle: nothing is lost), or until the daemon withdraws the instruction or
   the deadline passes;
6. ``resume``: with ``restart`` the survivors exit so that torch elastic re-forms the group
   at the new size and restores the checkpoint; without it (nothing changed) they simply
   carry on from where they held.

In the torchft mode (``agent.replicas``) nothing holds and nothing restarts: step 2 is
``leave`` (``keep_nodes``: the replica groups on the other nodes finish their step, leave
the quorum and exit; each writes ``left-<node>.json``), and after the ack the daemon's
``scontrol update`` takes nodes whose groups are already gone.

The pure part (``refusal``) decides; ``Follower`` only moves data between the daemon, the
job directory and Slurm.  Time comes from the injected ``clock``.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from slurm_elastic.agent.allocation import still_running
from slurm_elastic.agent.jobdir import CONTROL, HELD, RELEASE, Control, read_json, write_json
from slurm_elastic.agent.modes import LEAVE_ACTION, LEAVE_CLOSED_ACTION, TORCHFT, TORCHRUN
from slurm_elastic.agent.owndir import OwnDir
from slurm_elastic.agent.srunlog import PlannedRemoval
from slurm_elastic.agent.stopping import AGENT_MARKER, STOP_ACTION
from slurm_elastic.errors import AgentError
from slurm_elastic.protocol import (
    MAX_DETAIL,
    AckBody,
    AckStatus,
    Instruction,
    InstructionKind,
    get_json,
    job_url,
    post_authenticated,
)

log = structlog.get_logger("slurm_elastic.agent")

# After a shrink is applied, how long srun may still report the removed nodes' tasks.
REMOVAL_TAIL_S = 30.0
# How long the companions a shrink gives back may take to end by themselves; the daemon
# cancels those still running when it applies the shrink.
RELEASE_TIMEOUT_S = 20.0


def refusal(
    instruction: Instruction, *, current_nodes: int, min_nodes: int, batch_host: str
) -> str | None:
    """Why this job must answer ``failed`` instead of shrinking; None when it can comply.

    ``current_nodes`` is the effective size: the parent's nodes plus running companions'.
    """
    if instruction.kind != InstructionKind.SHRINK:
        return f"unknown instruction kind {instruction.kind!r}"
    if instruction.target_nodes < min_nodes:
        return f"target {instruction.target_nodes} nodes is below the job's minimum {min_nodes}"
    if instruction.target_nodes >= current_nodes:
        return f"target {instruction.target_nodes} nodes is not smaller than {current_nodes}"
    if instruction.keep_nodes and batch_host not in instruction.keep_nodes:
        return f"the batch host {batch_host} hosts the rendezvous and cannot be removed"
    return None


class ControlWriter:
    """Issues numbered requests in ``control.json``; shared by the follower and signal paths."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        current = read_json(directory / CONTROL)
        self._seq = int(current["seq"]) if current else 0

    def issue(self, action: str, **fields: Any) -> Control:
        with self._lock:
            self._seq += 1
            return self._write(Control(seq=self._seq, action=action, **fields))

    def answer(self, seq: int, action: str, **fields: Any) -> Control:
        """A follow-up (``resume``) to request ``seq``: same number, so workers match it."""
        with self._lock:
            return self._write(Control(seq=seq, action=action, **fields))

    def _write(self, control: Control) -> Control:
        write_json(self.directory / CONTROL, control.to_json())
        log.info("agent.control", seq=control.seq, action=control.action, restart=control.restart)
        return control


@dataclass
class Follower:
    job_id: int
    job_dir: Path
    api: str
    min_nodes: int
    batch_host: str
    control: ControlWriter
    node_count: Callable[[], int]  # effective size now: own nodes + running companions'
    clock: Callable[[], float] = time.time
    poll_s: float = 1.0
    hold_timeout_s: float = 60.0
    applied_grace_s: float = 30.0  # after the deadline, how long to wait for scontrol
    # Told which nodes the shrink removes, so that srun's report of their killed tasks is
    # logged as the shrink's (agent.srunlog), not as an error.
    removal: PlannedRemoval = field(default_factory=PlannedRemoval)
    stop_grace_s: float = 30.0  # the signal contract's grace (agent.stopping)
    running: Callable[[tuple[int, ...]], set[int]] = still_running  # of the given job ids
    answered: set[str] = field(default_factory=set)
    mode: str = TORCHRUN  # agent.modes

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._warned = False

    # ------------------------------------------------------------------ loop

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="slurm-elastic-follower", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # the follower must never take the launcher down
                log.warning("agent.follow_failed", error=str(exc))
            self._stop.wait(self.poll_s)

    def fetch(self) -> Instruction | None:
        url = job_url(self.api, self.job_id, "instruction")
        try:
            answer = get_json(url, timeout_s=5.0)
        except AgentError as exc:
            if not self._warned:  # once: a job may well run without a daemon
                log.warning("agent.daemon_unreachable", url=url, error=str(exc))
                self._warned = True
            return None
        self._warned = False
        data = answer.body.get("instruction") if answer.status == 200 else None
        return Instruction.from_json(data) if isinstance(data, dict) else None

    def poll_once(self) -> None:
        instruction = self.fetch()
        if instruction is None or instruction.id in self.answered:
            return
        self.answered.add(instruction.id)
        self.handle(instruction)

    # ------------------------------------------------------------------ one shrink

    def handle(self, instruction: Instruction) -> None:
        before = self.node_count()
        log.info(
            "agent.instruction",
            id=instruction.id,
            kind=instruction.kind,
            target_nodes=instruction.target_nodes,
            current_nodes=before,
        )
        why = refusal(
            instruction,
            current_nodes=before,
            min_nodes=self.min_nodes,
            batch_host=self.batch_host,
        )
        if why is None and self.mode == TORCHFT and not instruction.keep_nodes:
            why = "a stop-free shrink must name the nodes that stay"
        if why is not None:
            self.ack(instruction, AckStatus.FAILED, 0, why)
            return
        if self.mode == TORCHFT:
            self.leave_by_quorum(instruction, before)
            return
        if OwnDir(self.job_dir).stat(AGENT_MARKER) is None:
            self.stop_by_signal(instruction, before)
            return
        request = self.control.issue(
            "hold", instruction_id=instruction.id, keep_nodes=instruction.keep_nodes
        )
        held_step = self.wait_held(request.seq, min(instruction.deadline, self.clock() + 60.0))
        if held_step is None:
            self.control.answer(request.seq, "resume", restart=False)
            self.ack(instruction, AckStatus.FAILED, 0, "workers did not reach a checkpoint in time")
            return
        window = instruction.deadline - self.clock() + self.applied_grace_s + REMOVAL_TAIL_S
        self.removal.open(instruction.keep_nodes, max(window, REMOVAL_TAIL_S))
        self.release(instruction)
        self.ack(instruction, AckStatus.READY, held_step, "checkpoint written, workers holding")
        after = self.wait_applied(instruction, before)
        self.control.answer(request.seq, "resume", restart=after < before)
        if after >= before:
            self.removal.close()  # nothing was removed: a task ending now is news
        log.info("agent.resumed", id=instruction.id, nodes=after, step=held_step)

    def stop_by_signal(self, instruction: Instruction, before: int) -> None:
        """The signal contract (``agent.stopping``) for a script without the library: every
        node stops its workers with the job's stop signal and grace, then the shrink goes
        ahead; what the script did since its own last checkpoint is redone, and the ack
        says how much that can be."""
        request = self.control.issue(
            STOP_ACTION, instruction_id=instruction.id, keep_nodes=instruction.keep_nodes
        )
        # Every node's workers are stopped, so every task may end: not an error.
        window = instruction.deadline - self.clock() + self.applied_grace_s + REMOVAL_TAIL_S
        self.removal.open((), max(window, REMOVAL_TAIL_S) + self.stop_grace_s)
        stopped = self.wait_answers(
            "stopped", request.seq, before, self.clock() + self.stop_grace_s + 5.0
        )
        lost = max((float(r.get("trained_since_start_s", 0.0)) for r in stopped), default=0.0)
        detail = (
            f"signal contract: {len(stopped)} of {before} nodes stopped their workers; up to "
            f"{lost:.0f}s of training since they started is redone from the script's own "
            "checkpoint"
        )
        self.release(instruction)
        self.ack(instruction, AckStatus.READY, 0, detail)
        after = self.wait_applied(instruction, before)
        log.info("agent.stopped_for_shrink", id=instruction.id, nodes=after, redone_up_to_s=lost)

    def leave_by_quorum(self, instruction: Instruction, before: int) -> None:
        """The torchft mode's shrink (module doc): the groups outside ``keep_nodes`` leave
        between two steps; the others never stop."""
        request = self.control.issue(
            LEAVE_ACTION, instruction_id=instruction.id, keep_nodes=instruction.keep_nodes
        )
        leaving = before - instruction.target_nodes
        until = min(instruction.deadline, self.clock() + self.hold_timeout_s)
        try:
            left = self.wait_answers("left", request.seq, leaving, until)
        finally:
            # Same seq: the groups that saw the leave are done with it; one that forms
            # from now on stays (until now it left: agent.boundary.leave_open).
            self.control.answer(
                request.seq,
                LEAVE_CLOSED_ACTION,
                instruction_id=instruction.id,
                keep_nodes=instruction.keep_nodes,
            )
        if not left:
            self.ack(instruction, AckStatus.FAILED, 0, "no replica group left the quorum in time")
            return
        window = instruction.deadline - self.clock() + self.applied_grace_s + REMOVAL_TAIL_S
        self.removal.open(instruction.keep_nodes, max(window, REMOVAL_TAIL_S))
        self.release(instruction)
        step = max(int(record.get("step", 0)) for record in left)
        detail = (
            f"stop-free: {len(left)} of {leaving} replica groups left the quorum after step "
            f"{step}; the others kept training"
        )
        self.ack(instruction, AckStatus.READY, step, detail)
        after = self.wait_applied(instruction, before)
        log.info("agent.shrunk_stop_free", id=instruction.id, nodes=after, step=step)

    def release(self, instruction: Instruction) -> None:
        """End the companions the shrink gives back, before the ack: each one's node agents
        stop torchrun and leave (``agent.stopping``), so it finishes as a completed job.
        Cancelled instead, Slurm would write its "CANCELLED" error lines into its output.
        Those still running after ``RELEASE_TIMEOUT_S`` the daemon cancels."""
        if not instruction.release:
            return
        write_json(
            self.job_dir / RELEASE,
            {"instruction_id": instruction.id, "jobs": list(instruction.release)},
        )
        until = self.clock() + RELEASE_TIMEOUT_S
        left: set[int] = set(instruction.release)
        while not self._stop.is_set():
            try:
                left = self.running(instruction.release)
            except AgentError as exc:
                log.warning("agent.release_unknown", error=str(exc))
                return
            if not left or self.clock() >= until:
                break
            time.sleep(0.2)
        log.info(
            "agent.released",
            id=instruction.id,
            companions=list(instruction.release),
            still_running=sorted(left),
        )

    def wait_answers(self, prefix: str, seq: int, count: int, until: float) -> list[dict[str, Any]]:
        """The nodes' answers to request ``seq`` (``<prefix>-<node>.json``: ``stopped`` under
        the signal contract, ``left`` in the torchft mode), once ``count`` of them are there
        or ``until`` passed."""
        found: list[dict[str, Any]] = []
        while not self._stop.is_set():
            found = []
            for name in OwnDir(self.job_dir).names():
                if not fnmatch.fnmatchcase(name, f"{prefix}-*.json"):
                    continue
                record = read_json(self.job_dir / name)
                if record is not None and record.get("seq") == seq:
                    found.append(record)
            if len(found) >= count or self.clock() >= until:
                break
            time.sleep(0.05)
        return found

    def wait_held(self, seq: int, until: float) -> int | None:
        until = min(until, self.clock() + self.hold_timeout_s)
        while self.clock() < until and not self._stop.is_set():
            held = read_json(self.job_dir / HELD)
            if held and int(held.get("seq", -1)) == seq:
                return int(held["step"])
            time.sleep(0.05)
        return None

    def wait_applied(self, instruction: Instruction, before: int) -> int:
        """The effective size once the daemon is done, or ``before`` if nothing changed.

        Done = Slurm shows the target size (the companions given back have ended and the
        parent shrank), or the daemon withdrew the instruction (it clears it in every end
        state), or the deadline passed.
        """
        until = instruction.deadline + self.applied_grace_s
        last_fetch = self.clock()
        while self.clock() < until and not self._stop.is_set():
            nodes = self.node_count()
            if nodes <= instruction.target_nodes:
                return nodes
            if self.clock() - last_fetch >= self.poll_s:
                last_fetch = self.clock()
                current = self.fetch()
                if current is None or current.id != instruction.id:
                    # Withdrawn: one last look in case the update landed just before.
                    return min(before, self.node_count())
            time.sleep(0.2)
        return min(before, self.node_count())

    def ack(self, instruction: Instruction, status: AckStatus, step: int, detail: str) -> None:
        # A refusal longer than the daemon takes is cut, not answered 400.
        body = AckBody(
            instruction_id=instruction.id, status=status, step=step, detail=detail[:MAX_DETAIL]
        )
        url = job_url(self.api, self.job_id, "ack")
        try:
            answer = post_authenticated(url, body.model_dump(mode="json"), timeout_s=5.0)
        except AgentError as exc:
            log.warning("agent.ack_failed", id=instruction.id, error=str(exc))
            return
        log.info("agent.ack", id=instruction.id, status=status, step=step, http=answer.status)
