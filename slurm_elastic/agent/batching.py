"""What happens to the batch size and the learning rate when the world size changes.

Two families of rules (Saxena et al. and Goyal et al. for the scaling rules):

* ``accumulate`` (default): the *global* batch stays fixed.  Each rank gets an equal part of
  it and runs as many forward/backward passes of at most ``micro_batch`` samples as that part
  needs (gradient accumulation).  The optimizer sees exactly the same gradient at every world
  size, so training is mathematically independent of resizes; only speed changes.
* ``linear`` / ``sqrt``: every rank keeps its own batch (``per_rank_batch``), so the global
  batch grows with the world, and the learning rate follows it: ``lr = base_lr * k`` with
  ``k = global/reference`` (linear) or ``sqrt(global/reference)`` where ``reference`` is the
  global batch at which ``base_lr`` was tuned.  Faster per sample at large sizes, but the
  trajectory depends on the resize history.

Pure: no torch, no clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class BatchMode(enum.StrEnum):
    ACCUMULATE = "accumulate"
    LINEAR = "linear"
    SQRT = "sqrt"


@dataclass(frozen=True, slots=True)
class BatchRule:
    """``global_batch``: the fixed batch (accumulate) or the reference batch (linear/sqrt)."""

    global_batch: int
    micro_batch: int
    mode: BatchMode = BatchMode.ACCUMULATE
    per_rank_batch: int | None = None  # linear/sqrt only; default: micro_batch

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.micro_batch < 1:
            raise ValueError("global_batch and micro_batch must be at least 1")
        if self.per_rank_batch is not None and self.per_rank_batch < 1:
            raise ValueError("per_rank_batch must be at least 1")
        object.__setattr__(self, "mode", BatchMode(self.mode))

    def global_batch_for(self, world_size: int) -> int:
        """Samples one optimizer step consumes job-wide at ``world_size`` ranks."""
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        if self.mode is BatchMode.ACCUMULATE:
            return self.global_batch
        return (self.per_rank_batch or self.micro_batch) * world_size

    def lr_factor(self, world_size: int) -> float:
        """Multiply the tuned learning rate by this at ``world_size`` ranks."""
        if self.mode is BatchMode.ACCUMULATE:
            return 1.0
        ratio = self.global_batch_for(world_size) / self.global_batch
        return ratio if self.mode is BatchMode.LINEAR else math.sqrt(ratio)

    def accumulation_steps(self, world_size: int) -> int:
        """Forward/backward passes per optimizer step on the busiest rank."""
        share = -(-self.global_batch_for(world_size) // world_size)
        return -(-share // self.micro_batch)
