"""Convergence curve fit: parameter recovery, bounds, degenerate input, real curves."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.model.convergence import (
    ConvergenceFit,
    fit_convergence,
    predict_convergence,
)


def _optimus(k: np.ndarray, b0: float, b1: float, b2: float) -> np.ndarray:
    return 1.0 / (b0 * k + b1) + b2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_known_parameters_from_noisy_curve(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = np.arange(1, 121, dtype=float)
    b0, b1, b2 = 0.02, 0.5, 0.3
    y = _optimus(k, b0, b1, b2) + rng.normal(0.0, 0.01, k.size)
    fit = fit_convergence(k, y)
    assert fit.kind == "curve"
    assert fit.b2 == pytest.approx(b2, abs=0.03)
    assert fit.b0 == pytest.approx(b0, rel=0.3)
    # The asymptote criterion: a/(k+c) <= 5% of (l_first - b2) -> k = 20*(k1 + c) - c.
    c = b1 / b0
    true_first = _optimus(np.array([1.0]), b0, b1, b2)[0]
    truth = (1.0 / b0) / (0.05 * (true_first - b2)) - c
    pred = predict_convergence(fit)
    assert pred is not None
    assert pred.k == pytest.approx(truth, rel=0.2)
    assert pred.lo <= pred.k <= pred.hi


def test_outliers_are_down_weighted() -> None:
    rng = np.random.default_rng(3)
    k = np.arange(1, 81, dtype=float)
    y = _optimus(k, 0.05, 0.4, 0.5) + rng.normal(0.0, 0.005, k.size)
    clean = fit_convergence(k, y)
    y_bad = y.copy()
    y_bad[[10, 30, 50, 70]] += 3.0  # loss spikes
    robust = fit_convergence(k, y_bad)
    assert robust.b2 == pytest.approx(clean.b2, abs=0.05)


def test_rising_metric_is_handled_by_transform() -> None:
    k = np.arange(1, 61, dtype=float)
    acc = 0.9 - 1.0 / (0.1 * k + 2.0)  # reaches 0.85 at k = 180, beyond the data
    fit = fit_convergence(k, acc, higher_is_better=True)
    assert fit.kind == "curve"
    assert fit.asymptote == pytest.approx(0.9, abs=0.01)
    assert fit.metric_at(30.0) == pytest.approx(acc[29], abs=1e-3)
    pred = predict_convergence(fit, target=0.85)
    assert pred is not None and pred.reachable and pred.mode == "target"
    assert pred.k == pytest.approx(180.0, rel=0.02)


def test_unreachable_target_falls_back_to_asymptote() -> None:
    k = np.arange(1, 41, dtype=float)
    loss = _optimus(k, 0.1, 1.0, 0.5)
    fit = fit_convergence(k, loss)
    pred = predict_convergence(fit, target=0.1)  # below the asymptote 0.5
    assert pred is not None
    assert not pred.reachable and pred.mode == "asymptote"
    assert math.isfinite(pred.k) and math.isfinite(pred.hi)


@pytest.mark.parametrize(
    ("k", "y"),
    [
        ([], []),
        ([1.0], [2.0]),
        ([1.0, 2.0], [2.0, 1.5]),
        ([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]),  # constant loss
        ([1.0, 2.0, 3.0, 4.0], [float("nan")] * 4),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, float("nan"), float("inf"), 1.2, 1.1]),
        ([3.0, 3.0, 3.0], [1.0, 0.9, 0.8]),  # no spread in k
        ([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]),  # loss rising (diverging)
        ([-1.0, 1.0, 2.0, 3.0], [5.0, 1.0, 0.5, 0.4]),  # negative k dropped
        ([1.0, 2.0, 3.0, 4.0], [-3.0, -4.0, -4.5, -4.7]),  # negative "loss" (log-lik)
    ],
)
def test_degenerate_inputs_give_defined_results(k: list[float], y: list[float]) -> None:
    fit = fit_convergence(k, y)
    assert isinstance(fit, ConvergenceFit)
    for v in (fit.a, fit.c, fit.b2, fit.b0):
        assert math.isfinite(v) and v >= 0.0
    pred = predict_convergence(fit)
    if fit.kind == "insufficient":
        assert pred is None
    else:
        assert pred is not None
        assert all(math.isfinite(v) and v >= 0.0 for v in (pred.k, pred.lo, pred.hi))


def test_constant_loss_counts_as_converged() -> None:
    fit = fit_convergence([1.0, 2.0, 3.0, 4.0, 5.0], [0.7] * 5)
    pred = predict_convergence(fit)
    assert pred is not None and pred.k == pytest.approx(1.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 1e6, allow_nan=False),
            st.one_of(st.floats(-1e6, 1e6), st.sampled_from([math.nan, math.inf, -math.inf])),
        ),
        max_size=40,
    ),
    st.booleans(),
)
def test_parameters_never_negative(points: list[tuple[float, float]], rising: bool) -> None:
    k = [p[0] for p in points]
    y = [p[1] for p in points]
    fit = fit_convergence(k, y, higher_is_better=rising)
    assert fit.a >= 0.0 and fit.c >= 0.0 and fit.b2 >= 0.0 and fit.b0 >= 0.0 and fit.b1 >= 0.0
    assert all(a >= 0 and c >= 0 and b >= 0 for a, c, b in fit.band)
    pred = predict_convergence(fit)
    if pred is not None:
        assert math.isfinite(pred.k) and pred.k >= 0.0


def test_real_pollux_curve_deepspeech2_target(shared_dir) -> None:
    """DeepSpeech2 WER (falling) at batch 20, a real curve: fit the first half only.

    With a user target (the WER 5% of the run's improvement above its final value) the
    predicted epoch must land near the epoch the real run first reached it.
    """
    path = shared_dir / "traces/pollux/profiles/deepspeech2/validation-20.csv"
    if not path.is_file():
        pytest.skip("pollux traces not present")
    with path.open() as f:
        metric = [float(r["metric"]) for r in csv.DictReader(f)]
    k = np.arange(1, len(metric) + 1, dtype=float)
    final = float(np.mean(metric[-3:]))
    target = final + 0.05 * (metric[0] - final)
    truth = int(np.argmax(np.asarray(metric) <= target)) + 1
    half = len(metric) // 2
    fit = fit_convergence(k[:half], metric[:half])
    assert fit.kind == "curve"
    pred = predict_convergence(fit, target=target)
    assert pred is not None and pred.reachable
    assert pred.k == pytest.approx(truth, rel=0.3)
    assert pred.lo <= pred.k <= pred.hi
