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
* **Stop-free resizes** in the torchft mode (``agent.replicas``): each node is a replica
  group; every step starts with the quorum (a newcomer is healed there), its samples are
  split over the groups taking part, and a step not committed everywhere is redone.  The
  same script runs in both modes; ``optimizer_step`` returns whether the step counted.

The step boundary itself (hold, terminate, checkpoint, restore) is
:class:`~slurm_elastic.agent.boundary.StepBoundary`, shared with the drop-in API of
:mod:`slurm_elastic.agent.elastic` for scripts that keep their own DDP and DataLoader.

torch is imported only here and in nothing the launcher or the daemon imports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from slurm_elastic.errors import MissingExtra

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError:
    raise MissingExtra("ElasticTrainer", "torch", "agent") from None

from slurm_elastic.agent.batching import BatchRule
from slurm_elastic.agent.boundary import RESTART_EXIT, StepBoundary, init_process_group
from slurm_elastic.agent.modes import stop_free
from slurm_elastic.agent.sampler import (
    ElasticSampler,
    SamplerState,
    micro_batches,
    rank_share,
)

if TYPE_CHECKING:
    from slurm_elastic.agent.replicas import ReplicaGroup

__all__ = ["RESTART_EXIT", "ElasticTrainer", "Step"]

log = structlog.get_logger("slurm_elastic.agent")

# Appended to the gradient buffer, at these places from its end: hold, terminate,
# checkpoint, leave (the torchft mode), and the loss.
_HOLD, _TERM, _CKPT, _LEAVE, _LOSS = -5, -4, -3, -2, -1


@dataclass(frozen=True, slots=True)
class Step:
    index: int  # optimizer steps completed before this one (0-based step number)
    epoch: int
    offset: int  # samples of this epoch consumed job-wide before this step
    indices: np.ndarray  # every sample of this step, job-wide
    micro_batches: list[np.ndarray]  # this rank's share, split into forward passes
    loss_scale: float  # multiply a per-sample *sum* loss by this (1 / global batch)
    world_size: int
    rank: int  # this rank's place among the step's ranks
    # The group of processes that ran this step: a torchrun group's start, or in the torchft
    # mode the quorum (and how often it redid a step), which grows as membership changes.
    generation: int


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
        backend: str | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rule = rule
        self.epochs = epochs
        self.sampler = ElasticSampler(num_samples, seed)
        self._own_group = init_process_group(backend, timeout_s)
        self.boundary = StepBoundary(
            model,
            optimizer,
            checkpoint_dir=checkpoint_dir,
            keep_checkpoints=keep_checkpoints,
            checkpoint_every=checkpoint_every,
            hold_timeout_s=hold_timeout_s,
            report_every_s=report_every_s,
            extra_state=extra_state,
        )
        self.rank = self.boundary.rank
        self.world_size = self.boundary.world_size
        self.local_rank = self.boundary.local_rank
        self.nodes = self.boundary.nodes
        self.generation = self.boundary.generation
        self._base_lrs = [group["lr"] for group in optimizer.param_groups]
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._current: Step | None = None
        self.loss: float | None = None
        self.restored_extra = dict(self.boundary.restore().extra)
        self.replicas: ReplicaGroup | None = None
        if stop_free():
            from slurm_elastic.agent.replicas import ReplicaGroup  # the torchft extra

            self.replicas = ReplicaGroup(
                self._replica_state, self._load_replica_state, step=self.completed
            )
        self.boundary.announce()

    @property
    def completed(self) -> int:
        """Optimizer steps completed (restored ones included)."""
        return self.boundary.progress.step

    @property
    def state(self) -> SamplerState:
        """The position in the data after the last completed step."""
        return self.boundary.progress.data

    @property
    def checkpoint_dir(self) -> Path:
        return self.boundary.checkpoint_dir

    # ------------------------------------------------------------------ the loop

    def __iter__(self) -> Iterator[Step]:
        while True:
            self._join_step()  # torchft: the quorum, where a newcomer catches up
            if self.state.epoch >= self.epochs:
                break
            self._current = self._next_step()
            yield self._current
            if self._current is not None:
                raise RuntimeError("call trainer.optimizer_step() once per step")
        self._finish()

    def _join_step(self) -> None:
        """Who takes part in the next step: fixed under torchrun, the quorum under torchft."""
        if self.replicas is None:
            return
        membership = self.replicas.begin()
        self.world_size = membership.world_size
        self.rank = membership.rank
        self.nodes = membership.participants
        self.generation = membership.generation
        self.boundary.rank = self.rank
        self.boundary.world_size = self.world_size
        self.boundary.nodes = self.nodes

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
            rank=self.rank,
            generation=self.generation,
        )

    @property
    def total_steps(self) -> int:
        """Steps of the whole run at the current world size (exact for ``accumulate``)."""
        per_epoch = self.sampler.steps_per_epoch(self.rule.global_batch_for(self.world_size))
        return per_epoch * self.epochs

    def optimizer_step(self, loss: float | torch.Tensor | None = None) -> bool:
        """Sum gradients job-wide, apply them, then act on hold/terminate/checkpoint flags.

        Returns whether the step counted: always under torchrun; under torchft False when a
        group failed during it, and the same samples come again as the next step.
        """
        step = self._current
        if step is None:
            raise RuntimeError("optimizer_step() called outside an iteration of the trainer")
        local_loss = float(loss) if loss is not None else 0.0
        buffer = self._flatten(local_loss)
        if self.replicas is not None:
            return self._replica_step(step, buffer, loss is not None)
        try:
            dist.all_reduce(buffer)
        except RuntimeError as exc:
            self.boundary.abort("collective_failed", exc)
        self._apply(step, buffer, loss is not None)
        hold, term, ckpt = (float(buffer[i]) > 0 for i in (_HOLD, _TERM, _CKPT))
        self.boundary.act(hold=hold, term=term, ckpt=ckpt)
        return True

    def _replica_step(self, step: Step, buffer: torch.Tensor, has_loss: bool) -> bool:
        """The torchft mode's reduction (``agent.replicas``): leave and terminate are the
        group's own (agreed inside it), checkpoint and loss the quorum's."""
        assert self.replicas is not None
        self.replicas.reduce_in_group(buffer)
        leave, term = float(buffer[_LEAVE]) > 0, float(buffer[_TERM]) > 0
        committed = self.replicas.reduce_across(buffer)
        if committed:
            self._apply(step, buffer, has_loss)
        else:
            self.optimizer.zero_grad(set_to_none=False)
            self._current = None
        if term or leave:
            self.replicas.leave()
            if term:
                self.boundary.exit("terminate")
            self.boundary.leave()
        if committed:
            self.boundary.act(hold=False, term=False, ckpt=float(buffer[_CKPT]) > 0)
        return committed

    def _apply(self, step: Step, buffer: torch.Tensor, has_loss: bool) -> None:
        total_loss = float(buffer[_LOSS])
        self._unflatten(buffer)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        progress = self.boundary.progress
        progress.step += 1
        progress.data = self.sampler.advance(progress.data, len(step.indices))
        self.loss = total_loss if has_loss else None
        self._current = None
        self.boundary.report(
            len(step.indices),
            samples_per_epoch=self.sampler.num_samples,
            global_batch=self.rule.global_batch_for(self.world_size),
            total_steps=self.total_steps,
            loss=self.loss,
        )

    def _flatten(self, local_loss: float) -> torch.Tensor:
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in self._params
        ]
        dtype = grads[0].dtype if grads else torch.float32
        device = grads[0].device if grads else self.boundary.device
        values = [*self.boundary.take_flags(), float(self.boundary.leave_requested()), local_loss]
        return torch.cat([*grads, torch.tensor(values, dtype=dtype, device=device)])

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

    # ------------------------------------------------------------------ checkpoints

    def save(self, *, every_node: bool = False) -> None:
        """Checkpoint the last completed step (:meth:`StepBoundary.save`)."""
        self.boundary.save(every_node=every_node)

    # ------------------------------------------------------------------ the torchft mode

    def _replica_state(self) -> dict[str, Any]:
        """What a new replica group is healed with (``agent.replicas``): read by torchft
        while this group waits in the quorum, so nothing in it changes meanwhile."""
        progress = self.boundary.progress
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": progress.data.to_json(),
            "step": progress.step,
            "extra": dict(progress.extra),
        }

    def _load_replica_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        progress = self.boundary.progress
        progress.data = SamplerState.from_json(state["sampler"])
        progress.step = int(state["step"])
        progress.extra = dict(state["extra"])
        log.info("trainer.healed", step=progress.step, epoch=progress.data.epoch)

    def _finish(self) -> None:
        self.boundary.finish()
        if self.replicas is not None:
            self.replicas.leave()
        if self._own_group:
            dist.barrier()
            dist.destroy_process_group()
