"""The elastic sampler and the batch-size rule: pure, no torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.agent.batching import BatchMode, BatchRule
from slurm_elastic.agent.sampler import (
    ElasticSampler,
    SamplerState,
    epoch_permutation,
    micro_batches,
    rank_share,
)


def run_schedule(
    num_samples: int, seed: int, batch: int, worlds: list[int], epochs: int
) -> dict[int, list[int]]:
    """Consume ``epochs`` epochs, changing the world size every step as ``worlds`` says.

    Every step goes through a JSON round trip of the state, as across a checkpoint.
    """
    sampler = ElasticSampler(num_samples, seed)
    state = SamplerState()
    seen: dict[int, list[int]] = {}
    step = 0
    while state.epoch < epochs:
        world = worlds[step % len(worlds)]
        indices = sampler.step_indices(state, batch)
        shares = [rank_share(indices, world, r) for r in range(world)]
        assert sum(len(s) for s in shares) == len(indices)
        for share in shares:
            for micro in micro_batches(share, 3):
                seen.setdefault(state.epoch, []).extend(int(i) for i in micro)
        state = SamplerState.from_json(sampler.advance(state, len(indices)).to_json())
        step += 1
    return seen


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(1, 300),
    seed=st.integers(0, 2**31),
    batch=st.integers(1, 64),
    worlds=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    epochs=st.integers(1, 3),
)
def test_every_sample_exactly_once_per_epoch_across_world_changes(
    num_samples: int, seed: int, batch: int, worlds: list[int], epochs: int
) -> None:
    seen = run_schedule(num_samples, seed, batch, worlds, epochs)
    assert sorted(seen) == list(range(epochs))
    for idx in seen.values():
        assert sorted(idx) == list(range(num_samples))


@settings(max_examples=30, deadline=None)
@given(
    num_samples=st.integers(1, 200),
    batch=st.integers(1, 40),
    worlds=st.lists(st.integers(1, 6), min_size=1, max_size=6),
)
def test_order_is_independent_of_the_world_size(
    num_samples: int, batch: int, worlds: list[int]
) -> None:
    """The global order of samples never depends on how steps were split among ranks."""
    resized = run_schedule(num_samples, 7, batch, worlds, 2)
    single = run_schedule(num_samples, 7, batch, [1], 2)
    for epoch in (0, 1):
        # Within a step the concatenation of rank shares is the step's slice, in order.
        assert resized[epoch] == single[epoch]


def test_permutation_depends_on_seed_and_epoch_only() -> None:
    a = epoch_permutation(50, seed=1, epoch=0)
    assert np.array_equal(a, epoch_permutation(50, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_permutation(50, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_permutation(50, seed=2, epoch=0))


def test_last_step_of_an_epoch_is_short_and_rolls_over() -> None:
    sampler = ElasticSampler(10, 0)
    state = SamplerState(epoch=0, offset=8)
    assert len(sampler.step_indices(state, 4)) == 2
    assert sampler.advance(state, 2) == SamplerState(epoch=1, offset=0)
    assert sampler.steps_per_epoch(4) == 3


def test_rank_share_sizes_differ_by_at_most_one() -> None:
    shares = [rank_share(np.arange(10), 4, r) for r in range(4)]
    assert [len(s) for s in shares] == [3, 3, 2, 2]
    assert len(rank_share(np.arange(2), 3, 2)) == 0  # more ranks than samples: empty share


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ElasticSampler(0), "num_samples"),
        (lambda: ElasticSampler(5).step_indices(SamplerState(0, 5), 2), "outside"),
        (lambda: ElasticSampler(5).advance(SamplerState(0, 4), 2), "past the end"),
        (lambda: rank_share(np.arange(3), 2, 2), "rank 2"),
        (lambda: micro_batches(np.arange(3), 0), "micro_batch"),
    ],
)
def test_bad_input_is_a_clear_error(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------- batch rule


@given(world=st.integers(1, 64))
def test_accumulate_keeps_global_batch_and_lr(world: int) -> None:
    rule = BatchRule(global_batch=48, micro_batch=16)
    assert rule.mode is BatchMode.ACCUMULATE
    assert rule.global_batch_for(world) == 48
    assert rule.lr_factor(world) == 1.0
    share = math.ceil(48 / world)
    assert rule.accumulation_steps(world) == math.ceil(share / 16)


def test_scaled_rules_grow_the_batch_and_the_learning_rate() -> None:
    linear = BatchRule(global_batch=32, micro_batch=16, mode="linear")
    sqrt = BatchRule(global_batch=32, micro_batch=16, mode=BatchMode.SQRT, per_rank_batch=8)
    assert linear.global_batch_for(4) == 64 and linear.lr_factor(4) == 2.0
    assert sqrt.global_batch_for(16) == 128 and sqrt.lr_factor(16) == 2.0
    assert sqrt.accumulation_steps(16) == 1


def test_batch_rule_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        BatchRule(global_batch=0, micro_batch=1)
    with pytest.raises(ValueError):
        BatchRule(global_batch=8, micro_batch=1, mode="cubic")
    with pytest.raises(ValueError):
        BatchRule(global_batch=8, micro_batch=1).global_batch_for(0)
