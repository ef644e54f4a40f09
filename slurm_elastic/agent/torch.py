"""The training-script side: ``ElasticTrainer`` (torch; the ``agent`` extra).

A script written with it keeps training, correctly, while the daemon moves its job between
sizes::

    trainer = ElasticTrainer(model, optimizer, num_samples=len(data),
                             rule=BatchRule(global_batch=48, micro_batch=16), epochs=3)
    for step in trainer:
        loss_sum = 0.0
        for idx in step.micro_batches:            # this rank's samples of this step
            loss = loss_fn(model(x[idx]), y[idx], reduction="sum") * step.loss_scale
            loss.backward()
            loss_sum += loss.item()
        trainer.optimizer_step(loss_sum)

What it does for the script:

* **One all-reduce per step** carries the gradients *and* three control flags (hold,
  terminate, checkpoint) *and* the loss: every rank therefore learns at the same step
  boundary that the launcher wants a hold or that some rank got SIGTERM, at no extra
  collective.  Gradients are summed, and ``loss_scale`` is ``1/global batch``, so the update
  equals single-process training on the same global batch at any world size.
* **Elastic sampler** (``agent.sampler``): exactly once per epoch across resizes.
* **Atomic checkpoints** (``agent.checkpoint``): rank 0 writes temp + rename; on start every
  rank loads the checkpoint rank 0 picked (the newest that loads).
* **Zero lost steps on planned resizes**: on a hold rank 0 checkpoints the step boundary all
  ranks agreed on; on SIGTERM (torch elastic stopping the group to grow it) or a failed
  collective (a peer vanished) the first rank of every node saves its last *completed*
  step before exiting, so the step survives whichever node vanished.
* **Progress reports** from rank 0 (``agent.progress``), never blocking training.

torch is imported only here and in nothing the launcher or the daemon imports.
"""

from __future__ import annotations

import datetime
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import structlog

from slurm_elastic.errors import MissingExtra

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError:
    raise MissingExtra("ElasticTrainer", "torch", "agent") from None

from slurm_elastic.agent.batching import BatchRule
from slurm_elastic.agent.checkpoint import atomic_write, checkpoint_path, list_checkpoints, prune
from slurm_elastic.agent.jobdir import CHECKPOINTS, DONE, HELD, Control, ControlReader, write_json
from slurm_elastic.agent.progress import ProgressReporter
from slurm_elastic.agent.sampler import (
    ElasticSampler,
    SamplerState,
    micro_batches,
    rank_share,
)

log = structlog.get_logger("slurm_elastic.agent")

RESTART_EXIT = 75  # EX_TEMPFAIL: torch elastic restarts the group on any non-zero exit
_FLAGS = 4  # hold, terminate, checkpoint, loss: appended to the gradient buffer


@dataclass(frozen=True, slots=True)
class Step:
    index: int  # optimizer steps completed before this one (0-based step number)
    epoch: int
    offset: int  # samples of this epoch consumed job-wide before this step
    indices: np.ndarray  # every sample of this step, job-wide
    micro_batches: list[np.ndarray]  # this rank's share, split into forward passes
    loss_scale: float  # multiply a per-sample *sum* loss by this (1 / global batch)
    world_size: int


class ElasticTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        num_samples: int,
        rule: BatchRule,
        epochs: int,
        seed: int = 0,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 50,
        keep_checkpoints: int = 2,
        report_every_s: float = 5.0,
        timeout_s: float = 120.0,
        hold_timeout_s: float = 300.0,
        extra_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rule = rule
        self.epochs = epochs
        self.sampler = ElasticSampler(num_samples, seed)
        self.checkpoint_every = checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self.hold_timeout_s = hold_timeout_s
        self.extra_state = extra_state
        self.restored_extra: dict[str, Any] = {}
        self._own_group = _init_process_group(timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        job_dir = os.environ.get("SLURM_ELASTIC_JOB_DIR")
        self.job_dir = Path(job_dir) if job_dir else None
        default_ckpt = self.job_dir / CHECKPOINTS if self.job_dir else Path("checkpoints")
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_ckpt
        self._control = ControlReader(self.job_dir) if self.job_dir else None
        self._base_lrs = [group["lr"] for group in optimizer.param_groups]
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._flags = {"hold": False, "term": False, "ckpt": False}
        self._seen_seq = self._baseline_seq()
        self._current: Step | None = None
        self._saved_step = -1
        self._rates: deque[tuple[float, int]] = deque(maxlen=20)
        self.completed = 0
        self.state = SamplerState()
        self.loss: float | None = None
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self.generation = self._broadcast(time.time_ns())
        self._restore()
        self.reporter = self._make_reporter(report_every_s)
        log.info(
            "trainer.start",
            rank=self.rank,
            world_size=self.world_size,
            nodes=self.nodes,
            step=self.completed,
            epoch=self.state.epoch,
            offset=self.state.offset,
        )

    # ------------------------------------------------------------------ set-up

    def _broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _baseline_seq(self) -> int:
        """Requests issued before this group formed are answered, except an open hold."""
        control = self._control.read() if self._control else None
        if control is None:
            return 0
        return control.seq - 1 if control.action == "hold" else control.seq

    def _make_reporter(self, interval_s: float) -> ProgressReporter | None:
        job = os.environ.get("SLURM_ELASTIC_JOB_ID")
        api = os.environ.get("SLURM_ELASTIC_API")
        if self.rank != 0 or not job or not api:
            return None
        return ProgressReporter(api, int(job), interval_s=interval_s)

    def _restore(self) -> None:
        """Every rank loads the checkpoint rank 0 chose; without one, rank 0's weights."""
        chosen, state = -1, None
        if self.rank == 0:
            for step, path in list_checkpoints(self.checkpoint_dir):
                try:
                    state = torch.load(path, map_location="cpu", weights_only=False)
                except Exception as exc:  # a torn or foreign file: try the next older one
                    log.warning("trainer.checkpoint_unreadable", path=str(path), error=str(exc))
                    continue
                chosen = step
                break
        chosen = self._broadcast(chosen)
        if chosen < 0:
            for tensor in self.model.state_dict().values():
                dist.broadcast(tensor, src=0)
            return
        if state is None:
            state = torch.load(
                checkpoint_path(self.checkpoint_dir, chosen), map_location="cpu", weights_only=False
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.state = SamplerState.from_json(state["sampler"])
        self.completed = int(state["step"])
        self.restored_extra = dict(state.get("extra") or {})
        self._saved_step = self.completed
        log.info("trainer.restore", rank=self.rank, step=self.completed, path=str(chosen))

    # ------------------------------------------------------------------ the loop

    def __iter__(self) -> Iterator[Step]:
        while self.state.epoch < self.epochs:
            self._current = self._next_step()
            yield self._current
            if self._current is not None:
                raise RuntimeError("call trainer.optimizer_step() once per step")
        self._finish()

    def _next_step(self) -> Step:
        global_batch = self.rule.global_batch_for(self.world_size)
        indices = self.sampler.step_indices(self.state, global_batch)
        mine = rank_share(indices, self.world_size, self.rank)
        factor = self.rule.lr_factor(self.world_size)
        for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
            group["lr"] = base * factor
        return Step(
            index=self.completed,
            epoch=self.state.epoch,
            offset=self.state.offset,
            indices=indices,
            micro_batches=micro_batches(mine, self.rule.micro_batch),
            loss_scale=1.0 / len(indices),
            world_size=self.world_size,
        )

    @property
    def total_steps(self) -> int:
        """Steps of the whole run at the current world size (exact for ``accumulate``)."""
        per_epoch = self.sampler.steps_per_epoch(self.rule.global_batch_for(self.world_size))
        return per_epoch * self.epochs

    def optimizer_step(self, loss: float | torch.Tensor | None = None) -> None:
        """Sum gradients job-wide, apply them, then act on hold/terminate/checkpoint flags."""
        step = self._current
        if step is None:
            raise RuntimeError("optimizer_step() called outside an iteration of the trainer")
        local_loss = float(loss) if loss is not None else 0.0
        self._poll_control()
        buffer = self._flatten(local_loss)
        try:
            dist.all_reduce(buffer)
        except RuntimeError as exc:
            self._abort("collective_failed", exc)
        hold, term, ckpt, total_loss = (float(v) for v in buffer[-_FLAGS:])
        self._unflatten(buffer)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.completed += 1
        self.state = self.sampler.advance(self.state, len(step.indices))
        self.loss = total_loss if loss is not None else None
        self._current = None
        self._after_step(len(step.indices))
        if term > 0:
            self._exit("terminate")
        if hold > 0:
            self._hold()
        elif ckpt > 0 or self.completed % self.checkpoint_every == 0:
            self.save()

    def _flatten(self, local_loss: float) -> torch.Tensor:
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in self._params
        ]
        dtype = grads[0].dtype if grads else torch.float32
        flags = torch.tensor(
            [
                float(self._flags["hold"]),
                float(self._flags["term"]),
                float(self._flags["ckpt"]),
                local_loss,
            ],
            dtype=dtype,
        )
        self._flags["ckpt"] = False
        return torch.cat([*grads, flags])

    def _unflatten(self, buffer: torch.Tensor) -> None:
        offset = 0
        for p in self._params:
            n = p.numel()
            chunk = buffer[offset : offset + n].view_as(p)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n

    def _after_step(self, samples: int) -> None:
        now = time.monotonic()
        self._rates.append((now, samples))
        if self.reporter is None:
            return
        rate = None
        if len(self._rates) > 1:
            span = self._rates[-1][0] - self._rates[0][0]
            done = sum(s for _, s in list(self._rates)[1:])
            rate = done / span if span > 0 else None
        self.reporter.offer(
            step=self.completed,
            nodes=max(1, self.nodes),
            epoch=self.state.epoch + self.state.offset / self.sampler.num_samples,
            loss=self.loss if self.loss is not None and math.isfinite(self.loss) else None,
            samples_per_s=rate,
            global_batch=self.rule.global_batch_for(self.world_size),
            total_steps=self.total_steps,
        )

    # ------------------------------------------------------------------ control

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only flags here: the step boundary (or the hold loop) acts on them.
        if signum == signal.SIGTERM:
            self._flags["term"] = True
        else:
            self._flags["ckpt"] = True

    def _poll_control(self) -> Control | None:
        control = self._control.read() if self._control else None
        if control is not None and control.seq > self._seen_seq:
            if control.action == "hold":
                self._flags["hold"] = True
            elif control.action == "checkpoint":
                self._flags["ckpt"] = True
                self._seen_seq = control.seq
        return control

    def _hold(self) -> None:
        """Checkpoint the agreed boundary, confirm, wait for the launcher's resume."""
        control = self._poll_control()
        seq = control.seq if control is not None else self._seen_seq + 1
        self.save()
        try:
            dist.barrier()
        except RuntimeError as exc:
            self._abort("collective_failed", exc)
        if self.rank == 0 and self.job_dir is not None:
            write_json(self.job_dir / HELD, {"seq": seq, "step": self.completed})
        log.info("trainer.hold", rank=self.rank, step=self.completed, seq=seq)
        deadline = time.monotonic() + self.hold_timeout_s
        while time.monotonic() < deadline and not self._flags["term"]:
            control = self._control.read() if self._control else None
            if control is not None and control.seq >= seq and control.action == "resume":
                self._seen_seq = control.seq
                self._flags["hold"] = False
                if control.restart:
                    self._exit("restart", every_node=False)  # the hold checkpoint stands
                log.info("trainer.resume", rank=self.rank, step=self.completed)
                return
            time.sleep(0.05)
        if self._flags["term"]:
            self._exit("terminate")
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
        if not writer or self._saved_step == self.completed:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.state.to_json(),
            "step": self.completed,
            "world_size": self.world_size,
            "generation": self.generation,
            "extra": self.extra_state() if self.extra_state else {},
        }
        path = checkpoint_path(self.checkpoint_dir, self.completed)
        atomic_write(path, lambda handle: torch.save(state, handle))
        prune(self.checkpoint_dir, self.keep_checkpoints)
        self._saved_step = self.completed
        log.info("trainer.checkpoint", step=self.completed, path=str(path))

    def _abort(self, reason: str, exc: BaseException) -> None:
        # A peer vanished mid-step: the model still holds the last completed step (the
        # update is applied only after a successful all-reduce), so rank 0 saves exactly it.
        log.warning("trainer.peer_lost", rank=self.rank, step=self.completed, error=str(exc))
        self._exit(reason)

    def _exit(self, reason: str, *, every_node: bool = True) -> None:
        self.save(every_node=every_node)
        log.info("trainer.exit", rank=self.rank, step=self.completed, reason=reason)
        if self.reporter is not None:
            self.reporter.close(timeout_s=1.0)
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: tearing down a process group whose peers are gone can block.
        os._exit(RESTART_EXIT)

    def _finish(self) -> None:
        self.save()
        if self.rank == 0 and self.job_dir is not None:
            write_json(self.job_dir / DONE, {"step": self.completed, "time": time.time()})
        if self.reporter is not None:
            self.reporter.close()
        log.info("trainer.done", rank=self.rank, step=self.completed)
        if self._own_group:
            dist.barrier()
            dist.destroy_process_group()


def _init_process_group(timeout_s: float) -> bool:
    """Join torchrun's group (env://), or a one-process group outside torchrun."""
    if dist.is_initialized():
        return False
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True
