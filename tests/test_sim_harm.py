"""sim/harm.py: extra waits per job against static, on real simulations of the hand trace."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.sim.harm import elastic_work_scaled, harm
from slurm_elastic.sim.runner import ControllerDriver, Outcome, SimSettings, simulate
from tests.test_sim_engine import HAND, _quiet, _spec, _workload  # noqa: F401  (_quiet: autouse)


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> tuple[Path, Path]:
    path = tmp_path_factory.mktemp("harm") / "hand.csv"
    path.write_text(HAND)
    return path, shared_dir / "traces"


def run(hand: tuple[Path, Path], policy: str, elastic_fraction: float) -> Outcome:
    wl = _workload(hand[0], hand[1], 4, elastic_fraction=elastic_fraction)
    settings = SimSettings(policy=policy, interval_s=10.0)
    return simulate(wl, _spec(4), settings, driver_factory=ControllerDriver)


def delayed(outcome: Outcome, trace_id: str, seconds: float) -> Outcome:
    """The same outcome with one job started (and ended) ``seconds`` later."""
    late = copy.deepcopy(outcome)
    for job in late.jobs:
        if job.spec is not None and job.spec.trace_id == trace_id:
            job.start += seconds  # type: ignore[operator]
            job.end += seconds  # type: ignore[operator]
    return late


def test_static_against_itself_harms_no_one(hand: tuple[Path, Path]) -> None:
    static = run(hand, "static", 1.0)
    same = harm(static, static, elastic=True)
    assert same is not None and same.jobs == 5
    assert (same.avg_queue_over_static, same.avg_jct_over_static) == (1.0, 1.0)
    assert (same.late_10min_share, same.late_1h_share, same.worst_extra_wait_h) == (0, 0, 0)
    assert harm(static, static, elastic=False) is None  # no rigid job in this workload


def test_extra_waits_are_counted_per_job(hand: tuple[Path, Path]) -> None:
    static = run(hand, "static", 1.0)
    worse = harm(delayed(delayed(static, "j4", 700.0), "j5", 4000.0), static, elastic=True)
    assert worse is not None
    assert worse.late_10min_share == pytest.approx(2 / 5)  # j4 (700 s) and j5 (4,000 s)
    assert worse.late_1h_share == pytest.approx(1 / 5)
    assert worse.worst_extra_wait_h == pytest.approx(4000 / 3600)
    # Static's queue times (EXPECTED in test_sim_engine): 0, 90, 0, 120, 110 s.
    assert worse.avg_queue_over_static == pytest.approx((320 + 4700) / 320)


def test_mip_starts_the_blocked_job_sooner_than_static(hand: tuple[Path, Path]) -> None:
    better = harm(run(hand, "mip", 1.0), run(hand, "static", 1.0), elastic=True)
    assert better is not None and better.avg_queue_over_static < 1.0
    assert better.avg_jct_over_static < 1.0


def test_the_yardstick_shortens_the_elastic_jobs_and_nothing_else(
    hand: tuple[Path, Path],
) -> None:
    workload = _workload(hand[0], hand[1], 4, elastic_fraction=0.5)
    assert {job.elastic for job in workload.jobs} == {True, False}
    shorter = elastic_work_scaled(workload, 0.5)
    assert shorter.rejected == workload.rejected
    for before, after in zip(workload.jobs, shorter.jobs, strict=True):
        assert after.work == (before.work * 0.5 if before.elastic else before.work)
        assert replace(after, work=before.work) == before
    with pytest.raises(ValueError, match="positive"):
        elastic_work_scaled(workload, 0.0)

    settings = SimSettings(policy="static", interval_s=10.0)
    static, quicker = (
        simulate(wl, _spec(4), settings, driver_factory=ControllerDriver)
        for wl in (workload, shorter)
    )
    elastic = harm(quicker, static, elastic=True)
    assert elastic is not None and elastic.avg_jct_over_static < 1.0
    assert harm(quicker, static, elastic=False) is not None
