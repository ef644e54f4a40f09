"""The step boundary: where a training process acts on resizes, signals and checkpoints.

Both training APIs stand on it: :class:`~slurm_elastic.agent.torch.ElasticTrainer` (its
flags ride on its own gradient all-reduce) and the drop-in API of
:mod:`slurm_elastic.agent.elastic` (the script's DDP reduces the gradients; the flags take
one small all-reduce of their own after the optimizer step).  Either way every rank learns
the same flags at the same step boundary, and then :meth:`StepBoundary.act` does the same
thing on every rank.

Per rank, between two steps::

    TRAINING --(control.json: hold)----------> HOLDING   checkpoint, barrier, held.json
    HOLDING  --(resume)----------------------> TRAINING
    HOLDING  --(resume, restart)-------------> EXIT 75   torch elastic re-forms the group
    HOLDING  --(no resume in hold_timeout_s)-> TRAINING  (the launcher gave up the shrink)
    TRAINING --(SIGTERM on any rank)---------> EXIT 75   every node's first rank saves
    TRAINING --(a collective failed)---------> EXIT 75   a peer vanished: same save
    TRAINING --(SIGUSR1, or control.json: checkpoint, or every N steps)--> save, TRAINING
    TRAINING --(control.json: leave, this node not kept)--> EXIT 0   torchft mode only

Exit 75 (EX_TEMPFAIL) is the resize exit: torch elastic restarts the workers on any
non-zero exit, and :mod:`slurm_elastic.agent.torchrun` logs it as a resize, not a failure.
The checkpoint holds the last *completed* step: an update is applied only after its
all-reduce succeeded, so whichever node survives has the step on disk.
"""

from __future__ import annotations

import datetime
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import structlog

from slurm_elastic.errors import AgentError, MissingExtra

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError:
    raise MissingExtra("slurm_elastic.agent", "torch", "agent") from None

from slurm_elastic.agent.checkpoint import (
    atomic_write,
    checkpoint_path,
    list_checkpoints,
    open_checkpoint,
    prune,
)
from slurm_elastic.agent.jobdir import CHECKPOINTS, DONE, HELD, Control, ControlReader, write_json
from slurm_elastic.agent.modes import (
    FALLBACK_ENV,
    LEAVE_ACTION,
    LEFT_EXIT,
    REPLICA_ENV,
    TORCHFT,
    left_name,
)
from slurm_elastic.agent.progress import ProgressReporter
from slurm_elastic.agent.sampler import SamplerState
from slurm_elastic.agent.stopping import AGENT_MARKER

log = structlog.get_logger("slurm_elastic.agent")

RESTART_EXIT = 75  # EX_TEMPFAIL: torch elastic restarts the group on any non-zero exit
BACKEND_ENV = "SLURM_ELASTIC_BACKEND"  # overrides the process-group backend


@dataclass(slots=True)
class Progress:
    """Where training is: optimizer steps completed and the position in the data."""

    step: int = 0
    data: SamplerState = field(default_factory=SamplerState)
    extra: dict[str, Any] = field(default_factory=dict)  # the script's own, restored as saved

    @property
    def epoch(self) -> int:
        """The epoch under way (the next one to run when the last ended exactly)."""
        return self.data.epoch

    @property
    def offset(self) -> int:
        """Samples of this epoch the whole job has trained on."""
        return self.data.offset


# --------------------------------------------------------------------------- hardware


def backend_for(cuda: bool, override: str | None = None) -> str:
    """The process-group backend: ``override`` (``$SLURM_ELASTIC_BACKEND``), else NCCL where
    CUDA is present, else gloo."""
    if override:
        return override
    return "nccl" if cuda else "gloo"


def default_backend() -> str:
    return backend_for(torch.cuda.is_available(), os.environ.get(BACKEND_ENV) or None)


def device_for(backend: str, local_rank: int) -> torch.device:
    """The device a rank's collectives use: its local GPU under NCCL, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_process_group(backend: str | None = None, timeout_s: float = 120.0) -> bool:
    """Join torchrun's group (env://), or make a one-process group outside torchrun.

    Returns True when this call created the group.  Under NCCL the rank's GPU is selected
    first (``LOCAL_RANK``), as NCCL needs one device per rank.
    """
    if dist.is_initialized():
        return False
    backend = backend or default_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def leave_open(control: Control, replica: str) -> bool:
    """Whether ``control`` is a torchft-mode leave of ``replica``'s node still waiting for
    its answers: a group that forms then, on a node the shrink drops, leaves too.  Once
    the launcher closes it (``leave_closed``, same seq) it is history, and a group that
    forms later stays wherever it runs."""
    return control.action == LEAVE_ACTION and bool(replica) and replica not in control.keep_nodes


# --------------------------------------------------------------------------- the boundary


class StepBoundary:
    """One rank's side of the job's control protocol (module doc), and its checkpoints."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        checkpoint_dir: str | Path | None = None,
        keep_checkpoints: int = 2,
        checkpoint_every: int = 50,
        hold_timeout_s: float = 300.0,
        report_every_s: float = 5.0,
        extra_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        self.device = device_for(dist.get_backend(), self.local_rank)
        job_dir = os.environ.get("SLURM_ELASTIC_JOB_DIR")
        self.job_dir = Path(job_dir) if job_dir else None
        default_ckpt = self.job_dir / CHECKPOINTS if self.job_dir else Path("checkpoints")
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_ckpt
        self.keep_checkpoints = keep_checkpoints
        self.checkpoint_every = checkpoint_every
        self.hold_timeout_s = hold_timeout_s
        self.extra_state = extra_state
        self.progress = Progress()
        self._control = ControlReader(self.job_dir) if self.job_dir else None
        self._flags = {"hold": False, "term": False, "ckpt": False, "leave": False}
        # The torchft mode's replica group is its node (agent.replicas).
        self.replica = os.environ.get(REPLICA_ENV, "")
        self._fallback = os.environ.get(FALLBACK_ENV)  # set by the node agent: status says why
        self._leave_seq = 0
        self._seen_seq = self._baseline_seq()
        self._saved_step = -1
        self._rates: deque[tuple[float, int]] = deque(maxlen=20)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self.generation = self.broadcast(time.time_ns())
        self.reporter = self._make_reporter(report_every_s)
        if self.rank == 0 and self.job_dir is not None:
            # The launcher answers this job's shrinks with the hold protocol, not the
            # signal contract of scripts without the library (agent.stopping).
            write_json(self.job_dir / AGENT_MARKER, {"generation": self.generation})

    # ------------------------------------------------------------------ set-up

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None

    def _baseline_seq(self) -> int:
        """Requests issued before this group formed are answered, except an open hold and,
        in the torchft mode, an open leave of this group's node: a companion's group that
        forms while the shrink dropping its node is out (the shrink was decided with the
        companion counted) leaves at its first boundary, instead of the shrink waiting out
        its timeout and being rolled back."""
        control = self._control.read() if self._control else None
        if control is None:
            return 0
        if control.action == "hold" or leave_open(control, self.replica):
            return control.seq - 1
        return control.seq

    def _make_reporter(self, interval_s: float) -> ProgressReporter | None:
        job = os.environ.get("SLURM_ELASTIC_JOB_ID")
        api = os.environ.get("SLURM_ELASTIC_API")
        if self.rank != 0 or not job or not api:
            return None
        return ProgressReporter(api, int(job), interval_s=interval_s)

    def restore(self, *, sync_weights: bool = True) -> Progress:
        """Every rank loads the checkpoint rank 0 chose (the newest that loads).

        Without a checkpoint the weights stay as they are, made equal to rank 0's when
        ``sync_weights`` (DDP does that itself when it wraps the model).
        """
        chosen, state = -1, None
        if self.rank == 0:
            for step, path in list_checkpoints(self.checkpoint_dir):
                try:
                    # Opened as only this user can have left it (agent.owndir): unpickling
                    # runs code, so a file another user planted is refused, never loaded.
                    with open_checkpoint(path) as handle:
                        state = torch.load(handle, map_location="cpu", weights_only=False)
                except AgentError:
                    raise
                except Exception as exc:  # a torn or foreign file: try the next older one
                    log.warning("trainer.checkpoint_unreadable", path=str(path), error=str(exc))
                    continue
                chosen = step
                break
        chosen = self.broadcast(chosen)
        if chosen < 0:
            if sync_weights:
                for tensor in self.model.state_dict().values():
                    dist.broadcast(tensor, src=0)
            return self.progress
        if state is None:
            with open_checkpoint(checkpoint_path(self.checkpoint_dir, chosen)) as handle:
                state = torch.load(handle, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress.data = SamplerState.from_json(state["sampler"])
        self.progress.step = int(state["step"])
        self.progress.extra = dict(state.get("extra") or {})
        self._saved_step = self.progress.step
        log.info("trainer.restore", rank=self.rank, step=self.progress.step, path=str(chosen))
        return self.progress

    def announce(self) -> None:
        """The group's first line: where this rank starts (after :meth:`restore`)."""
        data = self.progress.data
        log.info(
            "trainer.start",
            rank=self.rank,
            world_size=self.world_size,
            nodes=self.nodes,
            step=self.progress.step,
            epoch=data.epoch,
            offset=data.offset,
        )

    # ------------------------------------------------------------------ each step

    def take_flags(self) -> list[float]:
        """This rank's (hold, terminate, checkpoint) for the step's agreement; clears the
        one-shot checkpoint request."""
        self.poll_control()
        flags = [float(self._flags["hold"]), float(self._flags["term"]), float(self._flags["ckpt"])]
        self._flags["ckpt"] = False
        return flags

    def agree(self) -> tuple[bool, bool, bool]:
        """The job-wide flags, by their own all-reduce (for scripts whose DDP reduces the
        gradients).  A failed collective means a peer vanished: save and exit."""
        flags = torch.tensor(self.take_flags(), dtype=torch.float32, device=self.device)
        try:
            dist.all_reduce(flags)
        except RuntimeError as exc:
            self.abort("collective_failed", exc)
        hold, term, ckpt = (float(v) > 0 for v in flags.tolist())
        return hold, term, ckpt

    def act(self, *, hold: bool, term: bool, ckpt: bool) -> None:
        """After a completed step, every rank alike: exit, hold, or save when due."""
        if term:
            self.exit("terminate")
        if hold:
            self.hold()
        elif ckpt or self.progress.step % self.checkpoint_every == 0:
            self.save()

    def report(
        self,
        samples: int,
        *,
        samples_per_epoch: int,
        global_batch: int,
        total_steps: int | None,
        loss: float | None = None,
    ) -> None:
        """Offer the daemon a progress report (rank 0; never blocks training)."""
        now = time.monotonic()
        self._rates.append((now, samples))
        if self.reporter is None or self.rank != 0:  # torchft: rank 0 moves between groups
            return
        rate = None
        if len(self._rates) > 1:
            span = self._rates[-1][0] - self._rates[0][0]
            done = sum(s for _, s in list(self._rates)[1:])
            rate = done / span if span > 0 else None
        data = self.progress.data
        mode: dict[str, str] = {"mode": TORCHFT} if self.replica else {}  # priced as such
        if self._fallback:
            mode["fallback"] = self._fallback
        self.reporter.offer(
            **mode,
            step=self.progress.step,
            nodes=max(1, self.nodes),
            epoch=data.epoch + data.offset / samples_per_epoch,
            loss=loss if loss is not None and math.isfinite(loss) else None,
            samples_per_s=rate,
            global_batch=global_batch,
            total_steps=total_steps,
        )

    # ------------------------------------------------------------------ control

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only flags here: the step boundary (or the hold loop) acts on them.
        if signum == signal.SIGTERM:
            self._flags["term"] = True
        else:
            self._flags["ckpt"] = True

    def poll_control(self) -> Control | None:
        control = self._control.read() if self._control else None
        if control is not None and control.seq > self._seen_seq:
            if control.action == "hold":
                self._flags["hold"] = True
            elif control.action == "checkpoint":
                self._flags["ckpt"] = True
                self._seen_seq = control.seq
            elif control.action == LEAVE_ACTION:
                self._flags["leave"] = bool(self.replica) and self.replica not in control.keep_nodes
                self._seen_seq = control.seq
                self._leave_seq = control.seq
        return control

    def leave_requested(self) -> bool:
        """torchft mode: whether this rank's group is to leave the job (``leave``); read
        after :meth:`take_flags`, which polls ``control.json``."""
        return self._flags["leave"]

    def hold(self) -> None:
        """Checkpoint the agreed boundary, confirm, wait for the launcher's resume."""
        control = self.poll_control()
        seq = control.seq if control is not None else self._seen_seq + 1
        self.save()
        try:
            dist.barrier()
        except RuntimeError as exc:
            self.abort("collective_failed", exc)
        if self.rank == 0 and self.job_dir is not None:
            write_json(self.job_dir / HELD, {"seq": seq, "step": self.progress.step})
        log.info("trainer.hold", rank=self.rank, step=self.progress.step, seq=seq)
        deadline = time.monotonic() + self.hold_timeout_s
        while time.monotonic() < deadline and not self._flags["term"]:
            control = self._control.read() if self._control else None
            if control is not None and control.seq >= seq and control.action == "resume":
                self._seen_seq = control.seq
                self._flags["hold"] = False
                if control.restart:
                    self.exit("restart", every_node=False)  # the hold checkpoint stands
                log.info("trainer.resume", rank=self.rank, step=self.progress.step)
                return
            time.sleep(0.05)
        if self._flags["term"]:
            self.exit("terminate")
        log.warning("trainer.hold_timeout", rank=self.rank, seq=seq)
        self._seen_seq = seq
        self._flags["hold"] = False

    # ------------------------------------------------------------------ checkpoints

    def save(self, *, every_node: bool = False) -> None:
        """Rank 0 writes the state after the last completed step (idempotent per step).

        ``every_node``: the first rank of every node writes too.  Used when the group is
        breaking up: the replicas are identical, so whichever node survives has the step
        on disk, even if rank 0's node is the one that vanished.  Same content, same name,
        atomic renames: concurrent writers cannot tear the file.
        """
        writer = self.rank == 0 or (every_node and self.local_rank == 0)
        step = self.progress.step
        if not writer or self._saved_step == step:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.progress.data.to_json(),
            "step": step,
            "world_size": self.world_size,
            "generation": self.generation,
            "extra": self.extra_state() if self.extra_state else {},
        }
        path = checkpoint_path(self.checkpoint_dir, step)
        atomic_write(path, lambda handle: torch.save(state, handle))
        prune(self.checkpoint_dir, self.keep_checkpoints)
        self._saved_step = step
        log.info("trainer.checkpoint", step=step, path=str(path))

    def abort(self, reason: str, exc: BaseException) -> NoReturn:
        # A peer vanished mid-step: the model still holds the last completed step (the
        # update is applied only after a successful all-reduce), so this rank saves exactly it.
        log.warning("trainer.peer_lost", rank=self.rank, step=self.progress.step, error=str(exc))
        self.exit(reason)

    def exit(self, reason: str, *, every_node: bool = True) -> NoReturn:
        """Save, then leave with the resize exit code (module doc)."""
        self.save(every_node=every_node)
        log.info("trainer.exit", rank=self.rank, step=self.progress.step, reason=reason)
        if self.reporter is not None:
            self.reporter.close(timeout_s=1.0)
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: tearing down a process group whose peers are gone can block.
        os._exit(RESTART_EXIT)

    def leave(self) -> NoReturn:
        """torchft mode: this group left the quorum after a completed step; nothing to save
        (the groups that stay hold the state), nothing failed."""
        log.info("trainer.left", rank=self.rank, step=self.progress.step, replica=self.replica)
        if self.local_rank == 0 and self.job_dir is not None:
            record = {"seq": self._leave_seq, "step": self.progress.step, "node": self.replica}
            write_json(self.job_dir / left_name(self.replica), record)
        if self.reporter is not None:
            self.reporter.close(timeout_s=1.0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(LEFT_EXIT)  # as exit(): a process group whose peers moved on can block

    def finish(self) -> None:
        """Training is complete: the final checkpoint, ``done.json``, the last report."""
        self.save()
        if self.rank == 0 and self.job_dir is not None:
            write_json(self.job_dir / DONE, {"step": self.progress.step, "time": time.time()})
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None
        log.info("trainer.done", rank=self.rank, step=self.progress.step)
