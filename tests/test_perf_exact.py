"""The per-cycle speed-ups compute exactly what the plain code computed.

Each test holds the plain formula (as the code read before it was made faster) and checks
the fast path against it bit for bit on many inputs: a speed-up may not move a decision.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.model.outlook import JobFit, estimate_outlook
from slurm_elastic.model.priors import Prior
from slurm_elastic.model.throughput import (
    _SUBSET_EYE,
    _SUBSET_PAIRS,
    _SUBSETS,
    ScalingParams,
    fit_throughput_many,
)
from slurm_elastic.policy import lagrange
from slurm_elastic.policy.lagrange import (
    FlatModel,
    _line_search,
    _segment_argmax,
    reduced,
)
from slurm_elastic.types import ElasticSpec, JobState
from tests.test_daemon_controller_data import job

lagrange_guess = lagrange._guessed_bisection


def _plain_line_search(model: FlatModel, lam: np.ndarray, row: int, iters: int) -> float:
    """The one-point-at-a-time bisection ``_line_search`` must reproduce."""
    a_row = model.a[row]
    base = reduced(model, lam) + lam[row] * a_row

    def slope(mu: float) -> float:
        pick = _segment_argmax(model, base - mu * a_row)
        return float(model.b[row] - a_row[pick].sum())

    if slope(0.0) >= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while slope(hi) < 0:
        lo, hi = hi, hi * 4.0
        if hi > 1e15:
            return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if slope(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def _random_model(rng: np.random.Generator, max_jobs: int = 400) -> FlatModel:
    """Jobs with ascending node counts as candidates, rows that count nodes (as compiled)."""
    jobs = int(rng.integers(1, max_jobs))
    counts = rng.integers(1, 7, size=jobs)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sizes = np.concatenate([np.cumsum(rng.integers(0, 5, size=c)) for c in counts]).astype(float)
    value = np.concatenate([np.sort(rng.normal(0, 1e4, size=c)) for c in counts])
    rows = int(rng.integers(1, 4))
    member = rng.random((rows, jobs)) < 0.7
    job_of = np.repeat(np.arange(jobs), counts)
    dense = np.where(member[:, job_of], sizes, 0.0)
    b = np.maximum(dense.sum(axis=1) * rng.uniform(0.05, 1.2), 1.0)
    return FlatModel.make(value, start, dense, b)


def test_line_search_matches_plain_bisection() -> None:
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        model = _random_model(rng)
        lam = rng.uniform(0.0, 50.0, size=model.b.size) * rng.integers(0, 2)
        for row in range(model.b.size):
            for iters in (60, 10, 1):
                got = _line_search(model, lam, row, iters)
                assert got == _plain_line_search(model, lam, row, iters)
                checked += 1
    assert checked > 500


def test_guessed_bisection_paths_are_the_bisections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small models take the guessed path (checked in one evaluation); where the guess is
    wrong the plain bisection runs: both give the bisection's result, bit for bit."""
    outcomes: list[bool] = []

    def counted(*args: object) -> float | None:
        got = lagrange_guess(*args)
        outcomes.append(got is not None)
        return got

    monkeypatch.setattr(lagrange, "_guessed_bisection", counted)
    rng = np.random.default_rng(11)
    for _ in range(400):
        model = _random_model(rng, max_jobs=40)
        lam = rng.uniform(0.0, 50.0, size=model.b.size) * rng.integers(0, 2)
        for row in range(model.b.size):
            for iters in (60, 3):
                assert _line_search(model, lam, row, iters) == _plain_line_search(
                    model, lam, row, iters
                )
    # A tie exactly at the first midpoint of the bracket [1, 4]: the guess (made between
    # breakpoints) is wrong there, and the search falls back to plain bisection.
    tie = FlatModel.make(
        np.array([0.0, 2.5]), np.array([0, 2]), np.array([[0.0, 1.0]]), np.array([0.5])
    )
    before = len(outcomes)
    assert _line_search(tie, np.zeros(1), 0) == _plain_line_search(tie, np.zeros(1), 0, 60)
    assert outcomes[before:] == [False]
    assert outcomes.count(True) > 300


def test_elastic_job_derived_sizes() -> None:
    rng = random.Random(3)
    states = [JobState.RUNNING, JobState.PENDING, JobState.COMPLETING]
    for i in range(200):
        parent = job(i, state=rng.choice(states[:2]), nodes=("a",) * rng.randint(1, 4))
        comps = tuple(
            job(1000 + k, state=rng.choice(states), nodes=("b",) * rng.randint(1, 3))
            for k in range(rng.randint(0, 3))
        )
        ej = ElasticJob(job=parent, spec=ElasticSpec(min_nodes=1, max_nodes=8), companions=comps)
        running = tuple(c for c in comps if c.state is JobState.RUNNING)
        assert ej.running_companions == running
        plain = parent.node_count + sum(c.node_count for c in running) if parent.is_running else 0
        assert ej.effective_nodes == plain
        # Derived fields are not part of equality, and ``replace`` derives them again.
        assert ej == ElasticJob(job=parent, spec=ej.spec, companions=comps)
        alone = parent.node_count if parent.is_running else 0
        assert replace(ej, companions=()).effective_nodes == alone


def test_outlook_speeds_are_the_models() -> None:
    rng = np.random.default_rng(11)
    items = []
    for _ in range(50):
        k = int(rng.integers(1, 5))
        sizes = sorted(set(rng.integers(1, 33, size=k).tolist()))
        items.append((sizes, rng.uniform(0.1, 5.0, size=len(sizes)).tolist(), None, None))
    fits = fit_throughput_many([(n, f, [1.0] * len(n), p) for n, f, _, p in items])
    prior = Prior(
        runtime_s=3600.0,
        reference_nodes=4,
        scaling=ScalingParams(1.0, 0.1, 0.01, 0.05),
        scaling_measured=False,
        total_steps=None,
        sizes_used=(),
        n_similar=0,
        source="site",
    )
    spec = ElasticSpec(min_nodes=1, max_nodes=64, step=3)
    for fit in fits:
        assert fit is not None
        jf = JobFit(
            job_id=1,
            step=10,
            time=0.0,
            nodes=4,
            n_reports=3,
            convergence=None,
            throughput=fit,
            total_steps=1000,
            target_metric=None,
            resize_cost_s=None,
            progress=10.0,
        )
        out = estimate_outlook(
            job_id=1,
            spec=spec,
            current_nodes=4,
            fit=jf,
            prior=prior,
            now=5.0,
            default_resize_cost_s=60.0,
        )
        assert [e.nodes for e in out.sizes] == sorted(set(spec.allowed_sizes))
        for e in out.sizes:
            assert e.throughput == fit.throughput(e.nodes)
            assert e.remaining_s == out.remaining_work / fit.throughput(e.nodes)


def test_subset_constants() -> None:
    m = _SUBSETS[None, :, :]
    assert np.array_equal(_SUBSET_PAIRS, m[..., :, None] * m[..., None, :])
    assert np.array_equal(_SUBSET_EYE, np.eye(4) * (1.0 - m)[..., None])
