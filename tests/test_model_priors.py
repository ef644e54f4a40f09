"""Cold-start priors from similar finished jobs in the accounting history."""

from __future__ import annotations

import pytest

from slurm_elastic.model.priors import SiteDefaults, build_prior, similar_jobs, site_prior
from slurm_elastic.types import Allocation, JobHistory, JobState


def _hist(
    job_id: int,
    *,
    user: str = "alice",
    name: str = "train",
    work_dir: str = "/home/alice/exp",
    state: JobState = JobState.COMPLETED,
    runtime: float = 3600.0,
    sizes: tuple[tuple[int, float], ...] = ((4, 1.0),),
    end: float = 10_000.0,
) -> JobHistory:
    start = end - runtime
    allocs = []
    t = start
    for nodes, share in sizes:
        allocs.append(Allocation(start=t, end=t + runtime * share, node_count=nodes, nodes=()))
        t += runtime * share
    return JobHistory(
        job_id=job_id,
        name=name,
        user=user,
        account="acct",
        partition="batch",
        state=state,
        submit_time=start - 10,
        start_time=start,
        end_time=end,
        comment="elastic",
        allocations=tuple(allocs),
        work_dir=work_dir,
    )


def test_similarity_levels_prefer_name_and_dir() -> None:
    hist = [
        _hist(1, name="train", work_dir="/a"),
        _hist(2, name="train", work_dir="/b"),
        _hist(3, name="other", work_dir="/a"),
        _hist(4, user="bob", name="train", work_dir="/a"),
    ]
    assert [h.job_id for h in similar_jobs("alice", "train", "/a", hist)] == [1]
    assert {h.job_id for h in similar_jobs("alice", "train", "/c", hist)} == {1, 2}
    assert {h.job_id for h in similar_jobs("alice", "new", "/a", hist)} == {1, 3}
    assert similar_jobs("carol", "train", "/a", hist) == []


def test_running_jobs_are_not_history() -> None:
    hist = [_hist(1, state=JobState.RUNNING)]
    assert similar_jobs("alice", "train", "/home/alice/exp", hist) == []


def test_prior_from_history_uses_median_runtime_and_main_size() -> None:
    hist = [
        _hist(1, runtime=1000.0, end=1e4),
        _hist(2, runtime=3000.0, end=2e4, sizes=((2, 0.2), (8, 0.8))),
        _hist(3, runtime=2000.0, end=3e4),
        _hist(4, runtime=50.0, end=4e4, state=JobState.CANCELLED),  # completed ones win
    ]
    prior = build_prior(
        user="alice", name="train", work_dir="/home/alice/exp", requested_nodes=2, history=hist
    )
    assert prior.source == "history"
    assert prior.n_similar == 3
    assert prior.runtime_s == pytest.approx(2000.0)
    assert prior.sizes_used == (4, 8)
    assert prior.reference_nodes == 4
    assert not prior.scaling_measured


def test_prior_uses_past_reported_throughput_and_steps() -> None:
    hist = [_hist(1), _hist(2, end=2e4)]
    past = {1: [(2, 5.0), (4, 9.0)], 2: [(8, 15.0)]}
    prior = build_prior(
        user="alice",
        name="train",
        work_dir="/home/alice/exp",
        requested_nodes=4,
        history=hist,
        past_throughput=past,
        past_steps={1: 30_000, 2: 34_000},
    )
    assert prior.scaling_measured
    assert prior.scaling.throughput(4) == pytest.approx(9.0, rel=0.15)
    assert prior.total_steps == pytest.approx(32_000)
    assert prior.work_steps() == pytest.approx(32_000)


def test_site_default_when_nothing_is_similar() -> None:
    site = SiteDefaults(runtime_s=7200.0, step_time_s=2.0)
    prior = build_prior(
        user="alice", name="x", work_dir="", requested_nodes=3, history=[], site=site
    )
    assert prior == site_prior(3, site)
    assert prior.source == "site" and prior.runtime_s == 7200.0
    assert prior.scaling.step_time(3) == pytest.approx(2.0)
    assert prior.work_steps() == pytest.approx(3600.0)


def test_history_without_times_falls_back_to_site() -> None:
    h = _hist(1)
    broken = JobHistory(
        job_id=h.job_id,
        name=h.name,
        user=h.user,
        account=h.account,
        partition=h.partition,
        state=h.state,
        submit_time=None,
        start_time=None,
        end_time=None,
        comment="",
        allocations=(),
        work_dir=h.work_dir,
    )
    prior = build_prior(
        user="alice", name="train", work_dir=h.work_dir, requested_nodes=2, history=[broken]
    )
    assert prior.source == "site"
