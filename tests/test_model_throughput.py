"""Throughput model: recovery, prior behaviour, falling speed-up, degenerate input, goodput."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.model.throughput import (
    ScalingParams,
    fit_throughput,
    goodput,
    prior_params,
    statistical_efficiency,
)

TRUE = ScalingParams(t0=2.0, t1=0.05, t2=0.004, t3=0.03)


def _observe(sizes: list[int], noise: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [TRUE.throughput(n) * (1.0 + rng.normal(0.0, noise)) for n in sizes]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_throughput_from_noisy_sizes(seed: int) -> None:
    sizes = [1, 2, 3, 4, 6, 8, 12, 16]
    fit = fit_throughput(sizes, _observe(sizes, 0.02, seed))
    assert fit is not None
    for n in (1, 5, 10, 16):
        assert fit.throughput(n) == pytest.approx(TRUE.throughput(n), rel=0.06)


def test_extrapolates_to_unseen_sizes_within_reason() -> None:
    sizes = [1, 2, 4, 8]
    fit = fit_throughput(sizes, _observe(sizes, 0.0, 0))
    assert fit is not None
    assert fit.throughput(16) == pytest.approx(TRUE.throughput(16), rel=0.15)


def test_throughput_falling_with_size_is_modelled() -> None:
    falling = ScalingParams(t0=0.2, t1=0.05, t2=0.02)
    sizes = [1, 2, 4, 8, 16]
    fit = fit_throughput(sizes, [falling.throughput(n) for n in sizes])
    assert fit is not None
    assert fit.throughput(16) < fit.throughput(4)
    assert fit.throughput(32) < fit.throughput(16)  # keeps falling, stays positive
    assert fit.throughput(32) > 0.0


def test_single_size_uses_prior_shape_and_matches_the_observation() -> None:
    fit = fit_throughput([4], [10.0])
    assert fit is not None
    assert fit.throughput(4) == pytest.approx(10.0, rel=0.02)
    # The default prior scales sub-linearly: more nodes help, but less than linearly.
    assert 10.0 < fit.throughput(8) < 20.0
    assert fit.confidence < 0.5


def test_prior_yields_to_data() -> None:
    wrong = prior_params(4, 0.1, (0.05, 0.9, 0.05, 0.0))  # says: nearly no speed-up
    sizes = [1, 2, 4, 8, 16]
    obs = _observe(sizes, 0.0, 0)
    fit = fit_throughput(sizes, obs, prior=wrong)
    assert fit is not None
    assert fit.throughput(16) == pytest.approx(obs[-1], rel=0.05)


def test_prior_params_hit_the_reference_step_time() -> None:
    for n in (1, 2, 8):
        p = prior_params(n, 0.5)
        assert p.step_time(n) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("nodes", "rates"),
    [
        ([], []),
        ([0, -1], [1.0, 2.0]),
        ([1, 2], [0.0, -3.0]),
        ([1, 2], [math.nan, math.inf]),
        ([math.inf, 2], [1.0, math.nan]),
    ],
)
def test_unusable_points_give_none(nodes: list[float], rates: list[float]) -> None:
    assert fit_throughput(nodes, rates) is None


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-2, 64),
            st.one_of(st.floats(-1e3, 1e6), st.sampled_from([math.nan, math.inf])),
        ),
        max_size=20,
    )
)
def test_parameters_never_negative_and_predictions_finite(pts: list[tuple[int, float]]) -> None:
    fit = fit_throughput([p[0] for p in pts], [p[1] for p in pts])
    if fit is None:
        return
    prm = fit.params
    assert min(prm.t0, prm.t1, prm.t2, prm.t3) >= 0.0
    for n in (1, 2, 7, 64, 1000):
        f = fit.throughput(n)
        assert math.isfinite(f) and f > 0.0


def test_statistical_efficiency_and_goodput() -> None:
    assert statistical_efficiency(1000.0, 200.0, 200.0) == pytest.approx(1.0)
    e = statistical_efficiency(1000.0, 3200.0, 200.0)
    assert e == pytest.approx(1200.0 / 4200.0)
    assert statistical_efficiency(math.nan, 3200.0, 200.0) == 1.0
    assert goodput(100.0, e) == pytest.approx(100.0 * e)
    assert goodput(math.inf, 0.5) == 0.0


def test_observed_sizes_are_reproduced_and_edges_are_continuous() -> None:
    sizes = [2, 3, 4, 6]
    rates = [5.0, 7.5, 8.0, 11.0]  # a plateau at 3-4 the smooth curve cannot follow
    fit = fit_throughput(sizes, rates)
    assert fit is not None
    for n, f in zip(sizes, rates, strict=True):
        assert fit.throughput(n) == pytest.approx(f, rel=1e-9)
    # Interpolated in log-log between observed sizes, and no jump just past the edges.
    assert 7.5 < fit.throughput(3.5) < 8.0
    assert fit.throughput(6.001) == pytest.approx(fit.throughput(6), rel=1e-3)
    assert fit.throughput(1.999) == pytest.approx(fit.throughput(2), rel=1e-3)
    # Far away the correction fades: the smooth model (and its prior) decide.
    assert fit.correction(6 * 2**10) == pytest.approx(0.0, abs=abs(fit.correction(6)) / 500)


def test_extrapolation_near_the_edge_follows_the_clipped_local_trend() -> None:
    # Throughput jumps 3x from 4 to 8 nodes (super-linear, e.g. a placement effect): just
    # beyond, the local trend is trusted but its slope is clipped to linear scaling.
    fit = fit_throughput([1, 2, 4, 8], [1.0, 1.9, 3.0, 9.0])
    assert fit is not None
    assert fit.throughput(8) == pytest.approx(9.0, rel=1e-9)
    assert fit.throughput(16) <= 2.0 * 9.0 + 1e-9
    assert fit.throughput(9) == pytest.approx(fit.throughput(8), rel=0.15)
