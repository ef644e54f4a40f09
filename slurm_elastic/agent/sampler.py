"""Elastic data sampling: every sample exactly once per epoch, whatever the world size does.

The state is global, not per rank: ``(epoch, offset)`` where ``offset`` is how many
samples of this epoch's permutation the whole job has consumed.  Each optimizer step takes
the next ``global_batch`` entries of the permutation and splits them among the ranks that
exist *now*.  A resize therefore changes only how the next slice is split, never which
samples come next, so a job that restarts at another size from a checkpoint of this state
neither skips nor repeats a sample (the checkpoint is taken at a step boundary).

The permutation of epoch ``e`` depends only on ``(seed, e)``: every rank, every restart and
a run that never resized compute the same order.  Pure numpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SamplerState:
    """Where the job is in the data: ``offset`` samples of epoch ``epoch`` are consumed."""

    epoch: int = 0
    offset: int = 0

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> SamplerState:
        return cls(epoch=int(data["epoch"]), offset=int(data["offset"]))


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of epoch ``epoch``: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


class ElasticSampler:
    """Deterministic global order; slices handed out per step, split per rank per step."""

    def __init__(self, num_samples: int, seed: int = 0) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples}")
        self.num_samples = num_samples
        self.seed = seed
        self._cached: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        # One epoch's permutation is reused for every step of that epoch: cache only it.
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_permutation(self.num_samples, self.seed, epoch))
        return self._cached[1]

    def step_indices(self, state: SamplerState, global_batch: int) -> np.ndarray:
        """The samples the next step consumes, job-wide (short at the end of an epoch)."""
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        self._check(state)
        stop = min(state.offset + global_batch, self.num_samples)
        return self.permutation(state.epoch)[state.offset : stop]

    def advance(self, state: SamplerState, consumed: int) -> SamplerState:
        """State after a step that consumed ``consumed`` samples; rolls over to a new epoch."""
        self._check(state)
        offset = state.offset + consumed
        if offset > self.num_samples:
            raise ValueError(f"step consumed past the end of epoch {state.epoch}")
        if offset == self.num_samples:
            return SamplerState(epoch=state.epoch + 1, offset=0)
        return SamplerState(epoch=state.epoch, offset=offset)

    def steps_per_epoch(self, global_batch: int) -> int:
        return -(-self.num_samples // global_batch)

    def _check(self, state: SamplerState) -> None:
        if state.epoch < 0 or not 0 <= state.offset < self.num_samples:
            raise ValueError(f"sampler state {state} is outside a dataset of {self.num_samples}")


def rank_share(indices: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """This rank's contiguous part of a step's samples (sizes differ by at most one)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    return np.array_split(indices, world_size)[rank]


def micro_batches(indices: np.ndarray, micro_batch: int) -> list[np.ndarray]:
    """Split a rank's share into forward passes of at most ``micro_batch`` samples."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
    return [indices[i : i + micro_batch] for i in range(0, len(indices), micro_batch)]
