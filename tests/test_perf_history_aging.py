"""The controller ages sacct records out of its lookback exactly as the plain scan did."""

from __future__ import annotations

import math
import random

from slurm_elastic.types import JobHistory, JobState
from tests.test_daemon_controller import make
from tests.test_daemon_controller_data import snapshot


def _record(job_id: int, end: float | None) -> JobHistory:
    return JobHistory(
        job_id=job_id,
        name="train",
        user="alice",
        account="a",
        partition="batch",
        state=JobState.COMPLETED if end else JobState.RUNNING,
        submit_time=0.0,
        start_time=0.0,
        end_time=end,
        comment="",
        allocations=(),
    )


def test_aged_records_match_the_plain_rule() -> None:
    rng = random.Random(9)
    ctl, backend, _, _ = make(snapshot([]), {})
    lookback = ctl.config.slurm.sacct_lookback_s
    cadence = ctl.config.slurm.sacct_interval_s
    kept: dict[int, JobHistory] = {}  # the plain model: every record, then the scan
    now = 10_000.0
    batch: list[JobHistory] = []
    aged = 0
    backend.read_history = lambda since, until=None: tuple(batch)  # type: ignore[method-assign]
    for _ in range(60):
        now += cadence + rng.uniform(0.0, 3.0 * lookback / 10)
        ends = [None, 0.0, math.nan, now - lookback * 2, now + 5.0]
        batch = [
            _record(
                rng.randrange(80),
                rng.choice(ends) if rng.random() < 0.3 else now - rng.uniform(0, 1.5 * lookback),
            )
            for _ in range(rng.randrange(12))
        ]
        backend.snap = snapshot([], taken_at=now)
        for rec in batch:
            kept[rec.job_id] = rec
        horizon = now - lookback
        for j in [j for j, h in kept.items() if (h.end_time or now) < horizon]:
            del kept[j]
            aged += 1
        assert ctl.run_once(now).history_calls == 3  # sacct, then the QOS and assoc limits
        assert ctl.history.keys() == kept.keys()
        assert all(ctl.history[j] is kept[j] for j in kept)
    assert aged > 50  # the sequence does age records out
