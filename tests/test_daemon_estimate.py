"""The estimate step: what it refits, and that its outlooks are those of a full fit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.outlook import JobModel, estimate_outlook
from slurm_elastic.model.priors import build_prior
from slurm_elastic.types import ElasticSpec, JobHistory, ProgressReport
from tests.test_daemon_controller_data import job
from tests.test_model_priors import _hist

SPEC = ElasticSpec(1, 4)


def _reports(job_id: int, n: int, total_steps: int | None) -> list[ProgressReport]:
    return [
        ProgressReport(
            job_id=job_id,
            time=100.0 * i,
            step=50 * i,
            nodes=2,
            loss=1.0 / (0.01 * 50 * i + 0.5) + 0.2,
            samples_per_s=32.0,
            global_batch=64,
            total_steps=total_steps,
        )
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("total_steps", [None, 4000])
def test_outlooks_equal_those_of_a_full_single_fit(total_steps: int | None) -> None:
    """A job that declared its budget gets no curve fitted (nothing reads it); its outlook
    is still exactly the one a full fit, curve included, gives."""
    reports = ReportStore()
    estimator = Estimator(reports, 30.0)
    for r in _reports(7, 12, total_steps):
        reports.add(r)
    view = job(7, nodes=("n1", "n2"), lo=1, hi=4, start=0.0)
    history = [_hist(1, user="root", name="j7", work_dir=view.work_dir or "")]
    estimator.history_changed(history, [])
    now = 1500.0
    got = estimator.outlooks({7: ElasticJob(view, SPEC)}, now)[7]

    single = JobModel(7)
    for r in _reports(7, 12, total_steps):
        single.update(r)
    prior = build_prior(
        user="root", name="j7", work_dir=view.work_dir or "", requested_nodes=2, history=history
    )
    assert prior.source == "history"
    full = single.fit(prior)
    assert full.convergence is not None
    want = estimate_outlook(
        job_id=7,
        spec=SPEC,
        current_nodes=2,
        fit=full,
        prior=prior,
        now=now,
        default_resize_cost_s=30.0,
        elapsed_s=now,
    )
    assert got == want
    fitted = estimator.bank.fit(7, prior)
    assert fitted is not None
    assert (fitted.convergence is None) == (total_steps is not None)


def test_history_changes_reach_the_priors() -> None:
    reports = ReportStore()
    estimator = Estimator(reports, 30.0)
    view = job(3, nodes=("n1",), lo=1, hi=4, start=0.0)
    elastic = {3: ElasticJob(view, SPEC)}
    assert estimator.outlooks(elastic, 100.0)[3].source == "prior"
    site = estimator._priors[3]
    assert site.source == "site"
    past = _hist(9, user="root", name="j3", work_dir=view.work_dir or "", runtime=999.0)
    estimator.history_changed([past], [])
    estimator.outlooks(elastic, 200.0)
    assert estimator._priors[3].source == "history"
    assert estimator._priors[3].runtime_s == 999.0
    estimator.history_changed([], [9])  # aged out of the look-back
    estimator.outlooks(elastic, 300.0)
    assert estimator._priors[3] == site


def test_reports_are_fed_once_each_and_late_ones_too() -> None:
    reports = ReportStore()
    estimator = Estimator(reports, 30.0)
    view = job(5, nodes=("n1", "n2"), lo=1, hi=4, start=0.0)
    elastic = {5: ElasticJob(view, SPEC)}
    first = _reports(5, 6, None)
    for r in first:
        reports.add(r)
    estimator.outlooks(elastic, 700.0)
    estimator.outlooks(elastic, 760.0)  # nothing new: nothing fed again
    assert estimator.bank.model(5).fit().n_reports == 6
    later = _reports(5, 8, None)[6:]
    reports.add(later[0])
    reports.add(first[-1])  # a stale duplicate arriving after a new one is not fed
    estimator.outlooks(elastic, 800.0)
    reports.add(later[1])
    estimator.outlooks(elastic, 900.0)
    assert estimator.bank.model(5).fit().n_reports == 8


def test_priors_follow_the_history_and_the_job_size() -> None:
    """Through accounting reads (new records, aged-out ones, none), each job's prior is
    ``build_prior`` on the whole history held, at the job's size."""
    rng = random.Random(6)
    estimator = Estimator(ReportStore(), 30.0)
    held: dict[int, JobHistory] = {}
    users, names = ["root", "ann"], ["a", "b", "c", "d"]
    for step in range(80):
        records = [
            _hist(
                rng.randrange(60),
                user=rng.choice(users),
                name=rng.choice(names),
                work_dir="/tmp",
                runtime=rng.uniform(600, 7200),
                sizes=((rng.randint(1, 8), 1.0),),
            )
            for _ in range(rng.choice([0, 1, 1, 2]))
        ]
        removed = [j for j in held if rng.random() < 0.05]
        for h in records:
            held[h.job_id] = h
        for j in removed:
            held.pop(j, None)
        estimator.history_changed(records, removed)
        views = {
            100 + i: replace(
                job(100 + i, nodes=("n",) * rng.randint(1, 3), user=users[i % 2]),
                name=names[i % 4] if step < 60 else "e",
            )
            for i in range(8)
        }
        estimator.outlooks({j: ElasticJob(v, ElasticSpec(1, 8)) for j, v in views.items()}, 0.0)
        for j, v in views.items():
            want = build_prior(
                user=v.user,
                name=v.name,
                work_dir=v.work_dir,
                requested_nodes=max(1, v.node_count),
                history=list(held.values()),
            )
            got = estimator._priors[j]
            assert got == want, (step, j)


def test_a_job_that_resizes_stop_free_is_priced_by_its_own_default_until_measured() -> None:
    """Reports saying ``mode: torchft`` (``slurm-elastic run --mode torchft``) price that job's
    resizes at ``model.stop_free_resize_cost_s`` until one is measured; the claim moves only
    its own job: the other job keeps ``model.default_resize_cost_s``."""
    reports = ReportStore()
    estimator = Estimator(reports, 30.0, stop_free_resize_cost_s=2.0)
    for r in _reports(7, 6, 4000):
        reports.add(replace(r, mode="torchft"))
    for r in _reports(8, 6, 4000):
        reports.add(r)
    views = {
        7: job(7, nodes=("n1", "n2"), lo=1, hi=4, start=0.0),
        8: job(8, nodes=("n3", "n4"), lo=1, hi=4, start=0.0),
    }
    got = estimator.outlooks({i: ElasticJob(v, SPEC) for i, v in views.items()}, 700.0)
    assert got[7].resize_cost_s == 2.0 and got[8].resize_cost_s == 30.0
    # The job's word holds only until it says otherwise.
    reports.add(replace(_reports(7, 7, 4000)[-1], mode=None))
    got = estimator.outlooks({7: ElasticJob(views[7], SPEC)}, 800.0)
    assert got[7].resize_cost_s == 30.0


def test_a_claimed_stop_free_mode_yields_to_the_resize_cost_measured() -> None:
    """``mode`` in a report is the user's word: it lowers the price of that job's resizes
    only until the daemon has seen one.  A job that claims torchft but restarts (22 s
    without progress after a shrink) is then priced at what it cost."""
    reports = ReportStore()
    estimator = Estimator(reports, 30.0, stop_free_resize_cost_s=2.0)
    for r in _reports(7, 6, 4000):  # 2 nodes, 0.5 steps/s, up to t=600
        reports.add(replace(r, mode="torchft"))
    view = job(7, nodes=("n1", "n2"), lo=1, hi=4, start=0.0)
    assert estimator.outlooks({7: ElasticJob(view, SPEC)}, 650.0)[7].resize_cost_s == 2.0
    estimator.resized(7, 650.0, 1)
    # It trained on to step 325 at the shrink (t=650); at 1 node it resumed at t=672 and
    # trained 0.25 steps/s from there on.
    for t, step in ((700.0, 332), (800.0, 357), (900.0, 382)):
        reports.add(
            ProgressReport(
                job_id=7,
                time=t,
                step=step,
                nodes=1,
                loss=1.0 / (0.01 * step + 0.5) + 0.2,
                samples_per_s=16.0,
                global_batch=64,
                total_steps=4000,
                mode="torchft",
            )
        )
    shrunk = job(7, nodes=("n1",), lo=1, hi=4, start=0.0)
    cost = estimator.outlooks({7: ElasticJob(shrunk, SPEC)}, 950.0)[7].resize_cost_s
    assert cost == pytest.approx(22.0, abs=1.0)
