"""The estimator's priors are those ``build_prior`` gives on the history it holds, also when
an accounting read brings nothing new and earlier results are reused."""

from __future__ import annotations

import random
from dataclasses import replace

from slurm_elastic.actuate.state import ElasticJob
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.priors import build_prior
from slurm_elastic.types import ElasticSpec, JobHistory
from tests.test_daemon_controller_data import job
from tests.test_model_priors import _hist


def test_priors_follow_the_history_and_the_job_size() -> None:
    rng = random.Random(2)
    estimator = Estimator(ReportStore(), 30.0)
    held: dict[int, JobHistory] = {}
    names = ["a", "b"]
    for step in range(40):
        records = [
            _hist(
                rng.randrange(30),
                user="root",
                name=rng.choice(names),
                work_dir="/tmp",
                runtime=rng.uniform(600, 7200),
                sizes=((rng.randint(1, 8), 1.0),),
            )
            for _ in range(rng.choice([0, 0, 1, 3]))
        ]
        removed = [j for j in held if rng.random() < 0.1] if rng.random() < 0.3 else []
        for h in records:
            held[h.job_id] = h
        for j in removed:
            held.pop(j, None)
        estimator.history_changed(records, removed)
        views = {
            100 + i: replace(job(100 + i, nodes=("n",) * rng.randint(1, 4)), name=names[i % 2])
            for i in range(4)
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
            assert estimator._priors[j] == want, step
