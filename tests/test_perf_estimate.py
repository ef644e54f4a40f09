"""The estimate step's reuse of earlier work gives exactly what computing afresh gives.

``Estimator`` keeps each job's ``OutlookBasis`` (and its last outlook) while the job's fit,
prior, spec and size stay the same; random runs check it against the plain computation.
"""

from __future__ import annotations

import math
import random

import pytest

from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.outlook import estimate_outlook
from slurm_elastic.types import ElasticSpec, JobState, Outlook, ProgressReport
from tests.test_daemon_controller_data import job
from tests.test_model_priors import _hist


def _same(a: Outlook, b: Outlook) -> bool:
    """Equal, and equal floats down to the sign of a zero (``==`` alone would not see it)."""

    def bits(o: Outlook) -> list[str]:
        floats = [o.remaining_work, o.resize_cost_s, o.confidence]
        floats += [x for s in o.sizes for x in (s.throughput, s.remaining_s)]
        return [float(x).hex() for x in floats]

    return a == b and bits(a) == bits(b)


def test_reused_estimates_equal_fresh_ones() -> None:
    rng = random.Random(5)
    reports = ReportStore()
    estimator = Estimator(reports, 45.0)
    n_jobs = 10
    specs = {
        j: ElasticSpec(
            1,
            rng.randint(2, 8),
            step=rng.choice((1, 1, 2)),
            resize_cost_s=rng.choice((None, None, 20.0)),
        )
        for j in range(1, n_jobs + 1)
    }
    budgets = {j: rng.choice((None, 3000 + 500 * j)) for j in specs}
    steps = dict.fromkeys(specs, 0)
    size = {j: rng.randint(1, specs[j].max_nodes) for j in specs}
    started = {j: rng.random() < 0.7 for j in specs}
    silent = dict.fromkeys(specs, False)  # a silent job stops reporting for a while
    now = 0.0
    hist_id = 1000
    reused = 0
    previous: dict[int, Outlook] = {}
    for cycle in range(250):
        now += rng.choice((30.0, 60.0, 60.0, 240.0, 700.0))
        for j in specs:
            if not started[j]:
                started[j] = rng.random() < 0.05
                continue
            if rng.random() < 0.05:
                size[j] = rng.randint(1, specs[j].max_nodes)
                estimator.resized(j, now, size[j])
            if rng.random() < 0.1:
                silent[j] = not silent[j]
            if not silent[j] and rng.random() < 0.4:
                steps[j] += rng.randint(10, 200)
                reports.add(
                    ProgressReport(
                        job_id=j,
                        time=now - rng.choice((0.0, 0.0, 5.0)),
                        step=steps[j],
                        nodes=size[j],
                        loss=1.0 / (0.002 * steps[j] + 0.5) + 0.1 * rng.random(),
                        samples_per_s=rng.choice((16.0, 32.0)) * size[j] ** 0.8,
                        global_batch=64,
                        total_steps=budgets[j],
                    )
                )
        if cycle % 40 == 7:  # an accounting read: the priors change (or come back equal)
            hist_id += 1
            j = rng.choice(list(specs))
            runtime = rng.choice((1800.0, 3600.0, 7200.0))
            estimator.history_changed(
                [
                    _hist(
                        hist_id,
                        user="root",
                        name=f"j{j}",
                        work_dir="/tmp",
                        runtime=runtime,
                    )
                ],
                [],
            )
        elif cycle % 40 == 27:
            estimator.history_changed([], [])
        elastic = {}
        for j, spec in specs.items():
            if started[j]:
                view = job(
                    j,
                    nodes=tuple(f"n{i}" for i in range(size[j])),
                    lo=1,
                    hi=spec.max_nodes,
                    start=rng.choice((0.0, 10.0)),
                )
            else:
                view = job(j, state=JobState.PENDING, lo=1, hi=spec.max_nodes, start=None)
            # a fresh but equal spec object about half of the time, as the daemon makes
            elastic[j] = ElasticJob(
                view,
                spec
                if rng.random() < 0.5
                else ElasticSpec(
                    spec.min_nodes,
                    spec.max_nodes,
                    spec.step,
                    spec.gpus_per_node,
                    spec.resize_cost_s,
                ),
            )
        got = estimator.outlooks(elastic, now)
        assert set(got) == set(elastic)
        for j, ej in elastic.items():
            prior = estimator._priors[j]
            view = ej.job
            want = estimate_outlook(
                job_id=j,
                spec=ej.spec,
                current_nodes=ej.effective_nodes,
                fit=estimator.bank.fit(j, prior),
                prior=prior,
                now=now,
                default_resize_cost_s=ej.spec.resize_cost_s or 45.0,
                elapsed_s=now - view.start_time
                if view.is_running and view.start_time is not None
                else None,
            )
            assert _same(got[j], want), (cycle, j)
            reused += got[j] is previous.get(j)
        previous = got
    sources = {o.source for o in previous.values()}
    assert reused > 0 and math.isfinite(now)
    assert sources <= {"prior", "fitted", "user"}


def test_a_failed_batch_fit_leaves_each_job_its_own_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this cycle's ``fit_all`` the jobs are fitted one by one, to the same outlooks."""
    reports = ReportStore()
    estimator = Estimator(reports, 45.0)
    spec = ElasticSpec(1, 4)
    for i in range(1, 6):
        reports.add(
            ProgressReport(
                job_id=3,
                time=60.0 * i,
                step=100 * i,
                nodes=2,
                samples_per_s=40.0,
                global_batch=32,
                total_steps=5000,
            )
        )
    elastic = {3: ElasticJob(job(3, nodes=("n1", "n2"), lo=1, hi=4), spec)}
    want = estimator.outlooks(elastic, 400.0)[3]

    def broken(priors: object = None) -> None:
        raise RuntimeError("injected")

    fresh = Estimator(reports, 45.0)
    monkeypatch.setattr(fresh.bank, "fit_all", broken)
    got = fresh.outlooks(elastic, 400.0)[3]
    assert got.source == "user" and _same(got, want)
