"""The estimator's priors are those ``build_prior`` gives on the history it holds, also when
an accounting read brings nothing new, or nothing about a job's similar jobs, and earlier
results are reused."""

from __future__ import annotations

import random
from dataclasses import replace

from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.priors import build_prior
from slurm_elastic.types import ElasticSpec, JobHistory
from tests.test_daemon_controller_data import job
from tests.test_model_priors import _hist


def test_priors_follow_the_history_and_the_job_size() -> None:
    """Priors are reused across accounting reads that leave their similar jobs alone; each
    equals ``build_prior`` on the whole history held, and keys unused for two reads go."""
    rng = random.Random(6)
    estimator = Estimator(ReportStore(), 30.0)
    held: dict[int, JobHistory] = {}
    users, names = ["root", "ann"], ["a", "b", "c", "d"]
    kept = 0
    last: dict[int, object] = {}
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
            kept += bool(records or removed) and got is last.get(j)
        last = dict(estimator._priors)
    assert kept > 20
    # After 20 reads asking for name "e" only, the other names' entries are gone.
    assert {key[1] for key in estimator._built} == {"e"}
