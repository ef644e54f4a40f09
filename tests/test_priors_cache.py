"""Priors built many times from one history: the index, and what a new prior refits."""

from __future__ import annotations

import random

from slurm_elastic.model.outlook import ModelBank
from slurm_elastic.model.priors import MAX_SIMILAR, HistoryIndex, build_prior, similar_jobs
from slurm_elastic.model.throughput import ScalingParams
from slurm_elastic.types import JobHistory, JobState, ProgressReport
from tests.test_model_priors import _hist


def _scan(user: str, name: str, work_dir: str, history: list[JobHistory]) -> list[JobHistory]:
    """The similarity rule written as a plain scan per look-up (the module doc's order)."""
    finished = [h for h in history if h.state.is_finished and h.user == user]
    levels = (
        lambda h: bool(name) and h.name == name and bool(work_dir) and h.work_dir == work_dir,
        lambda h: bool(name) and h.name == name,
        lambda h: bool(work_dir) and h.work_dir == work_dir,
    )
    for match in levels:
        found = [h for h in finished if match(h)]
        if found:
            found.sort(key=lambda h: h.end_time or h.start_time or 0.0, reverse=True)
            return found[:MAX_SIMILAR]
    return []


def test_index_answers_as_a_scan_of_the_history_would() -> None:
    rng = random.Random(5)
    states = (JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.RUNNING)
    history = [
        _hist(
            i,
            user=rng.choice(("alice", "bob")),
            name=rng.choice(("train", "eval", "")),
            work_dir=rng.choice(("/a", "/b", "")),
            state=rng.choice(states),
            end=float(rng.randrange(10)) * 1000.0 + 5000.0,  # many equal end times
        )
        for i in range(1200)
    ]
    index = HistoryIndex(history)
    for user in ("alice", "bob", "carol"):
        for name in ("train", "eval", "", "new"):
            for work_dir in ("/a", "/b", "", "/c"):
                want = [h.job_id for h in _scan(user, name, work_dir, history)]
                assert [h.job_id for h in index.similar(user, name, work_dir)] == want
                got = similar_jobs(user, name, work_dir, history)
                assert [h.job_id for h in got] == want
    assert len(index.similar("alice", "train", "/a")) == MAX_SIMILAR


def test_index_kept_up_to_date_answers_as_a_scan_would() -> None:
    """The daemon's use: each sacct read upserts records and ages others out."""
    rng = random.Random(11)
    mirror: dict[int, JobHistory] = {}  # the controller's history (dict order matters)
    index = HistoryIndex()
    for read in range(60):
        records = [
            _hist(
                rng.randrange(300),
                name=rng.choice(("train", "eval")),
                work_dir=rng.choice(("/a", "/b")),
                state=rng.choice((JobState.COMPLETED, JobState.RUNNING, JobState.FAILED)),
                end=float(rng.randrange(read, read + 5)) * 100.0 + 5000.0,
            )
            for _ in range(rng.randrange(12))
        ]
        for h in records:
            mirror[h.job_id] = h
        aged = [j for j in mirror if rng.random() < 0.05]
        for j in aged:
            del mirror[j]
        index.update(records, aged)
        for name in ("train", "eval", "x"):
            for work_dir in ("/a", "/b", ""):
                want = [h.job_id for h in _scan("alice", name, work_dir, list(mirror.values()))]
                assert [h.job_id for h in index.similar("alice", name, work_dir)] == want


def test_prior_from_an_index_equals_prior_from_the_history() -> None:
    history = [_hist(i, runtime=1000.0 + i, end=1e4 + i) for i in range(30)]
    kw = {"user": "alice", "name": "train", "work_dir": "/home/alice/exp", "requested_nodes": 2}
    assert build_prior(history=HistoryIndex(history), **kw) == build_prior(history=history, **kw)


def _report(job_id: int, t: float, step: int) -> ProgressReport:
    return ProgressReport(job_id=job_id, time=t, step=step, nodes=2, loss=1.0 / (1 + step))


def test_a_new_prior_refits_only_when_its_measured_shape_changes() -> None:
    bank = ModelBank()
    for i in range(6):
        bank.update(_report(1, 100.0 * (i + 1), 10 * (i + 1)))
    old = build_prior(
        user="alice", name="train", work_dir="/w", requested_nodes=2, history=[_hist(1)]
    )
    fit = bank.fit(1, old)
    # A newer history (another run time) gives another prior with an unmeasured shape:
    # the fit reads nothing of it, so the cached fit stands.
    newer = build_prior(
        user="alice",
        name="train",
        work_dir="/w",
        requested_nodes=2,
        history=[_hist(2, runtime=7200.0)],
    )
    assert newer != old and not newer.scaling_measured
    assert not bank.model(1).stale(newer)
    assert bank.fit(1, newer) is fit
    assert bank.model(1).last_prior is old
    # A measured shape does enter the throughput fit: that one refits.
    measured = build_prior(
        user="alice",
        name="train",
        work_dir="/home/alice/exp",
        requested_nodes=2,
        history=[_hist(3)],
        past_throughput={3: [(1, 1.0), (2, 1.8), (4, 3.0)]},
    )
    assert measured.scaling_measured and isinstance(measured.scaling, ScalingParams)
    assert bank.model(1).stale(measured)
    assert bank.fit(1, measured) is not fit
    assert bank.model(1).last_prior is measured
    # New reports make it stale again whatever the prior.
    bank.update(_report(1, 700.0, 70))
    assert bank.model(1).stale(measured)
