"""The daemon cycle's speed-ups compute exactly what the plain code computed.

Each test holds the plain computation (as the code read before it was made faster) and
checks the fast path against it on many varied inputs: a speed-up may not move a decision.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.executor import ActionRecord
from slurm_elastic.cluster_state import ElasticJob, classify, offered_sizes, shrink_layout
from slurm_elastic.daemon.result import CycleResult, RowInputs, status_rows
from slurm_elastic.sim.backend import SimBackend
from slurm_elastic.sim.engine import Cluster, SimJob
from slurm_elastic.sim.runner import ControllerDriver, SimSettings, simulate
from slurm_elastic.sim.scheduler import Holding, Waiting, fifo_easy_backfill
from slurm_elastic.types import (
    Action,
    ActionKind,
    ActionOutcome,
    Decision,
    ElasticSpec,
    Explanation,
    JobState,
    JobView,
    NodeView,
    Plan,
    SolverStatus,
)
from tests.test_daemon_controller_data import job, pending, snapshot
from tests.test_sim_engine import _contended, _spec


def _plain_sizes(ej: ElasticJob) -> tuple[int, ...]:
    """``elastic_demand``'s sizes as written before they were memoised."""
    current = ej.effective_nodes
    sizes = set(ej.spec.allowed_sizes)
    if current > 0:
        sizes.add(current)
        if ej.running_companions:
            sizes = {
                s
                for s in sizes
                if s >= ej.effective_nodes or shrink_layout(ej, s).parent_nodes >= 1
            }
    return tuple(sorted(sizes))


def _random_elastic_job(rng: random.Random) -> ElasticJob:
    names = iter(f"n{i}" for i in range(1, 64))
    spec = ElasticSpec(lo := rng.randint(1, 4), rng.randint(lo, 12), rng.choice([1, 1, 2, 3]))
    if rng.random() < 0.2:
        parent = pending(1, lo=rng.randint(1, 4), hi=8)
        comps = []
    else:
        parent = job(1, nodes=tuple(next(names) for _ in range(rng.randint(1, 6))))
        comps = [
            job(
                10 + k,
                nodes=tuple(next(names) for _ in range(rng.randint(1, 4))),
                comment=companion_comment(1),
                state=rng.choice([JobState.RUNNING, JobState.RUNNING, JobState.PENDING]),
            )
            for k in range(rng.choice([0, 0, 1, 2, 3]))
        ]
    return classify(snapshot([parent, *comps]), lambda j: spec).elastic[1]


def test_offered_sizes_match_the_plain_set_and_shrink_layouts() -> None:
    rng = random.Random(3)
    seen = set()
    for _ in range(2000):
        ej = _random_elastic_job(rng)
        # The sizes derived at construction, as the plain formulas give them.
        running = tuple(c for c in ej.companions if c.state is JobState.RUNNING)
        assert ej.running_companions == running
        assert ej.pending_companions == tuple(
            c for c in ej.companions if c.state is JobState.PENDING
        )
        assert ej.effective_nodes == (
            ej.job.node_count + sum(c.node_count for c in running) if ej.job.is_running else 0
        )
        got = offered_sizes(ej)
        assert got == _plain_sizes(ej)
        # Asked again (served from the memo) it is still the job's own answer.
        assert offered_sizes(ej) == got
        seen.add(bool(ej.running_companions))
    assert seen == {True, False}


def test_cycle_result_rows_are_built_on_read_from_its_inputs() -> None:
    running = job(1, nodes=("n1", "n2"))
    cls = classify(
        snapshot([running, pending(2), job(3, nodes=("n3",), comment="")]),
        lambda j: None if j.job_id == 3 else ElasticSpec(1, 4),
    )
    plan = Plan(
        decisions=(
            Decision(1, 2, 1, Explanation(1.0, 0.0, "r")),
            Decision(2, 0, 2, Explanation(1.0, 0.0, "r")),
        ),
        solver="x",
        status=SolverStatus.OPTIMAL,
        objective=0.0,
    )
    records = (ActionRecord(Action(ActionKind.SHRINK, 1, 2, 1), ActionOutcome.BLOCKED, "cooldown"),)
    frozen = {2: "held"}
    result = CycleResult(
        now=0.0,
        ok=True,
        error=None,
        duration_s=0.0,
        slurm_calls=3,
        history_calls=0,
        snapshot_age_s=0.0,
        mode="enforce",
        plan=plan,
        actions=records,
        rows_from=RowInputs(cls, frozen),
    )
    assert result.job_count == 3
    rows = result.jobs
    assert rows == status_rows(cls, plan, frozen, list(records))
    assert [r.reason for r in rows] == ["blocked: cooldown", "held", "not elastic"]
    assert result.jobs is rows  # built once
    assert result.to_json()["jobs"] == [r.to_json() for r in rows]
    failed = replace(result, ok=False, rows_from=None)
    assert failed.jobs == () and failed.job_count == 0


def _plain_schedule(cluster: Cluster) -> list[int]:
    """The jobs ``Cluster.schedule`` started before it skipped partitions where nothing fits."""
    by_part: dict[str, list[SimJob]] = {}
    for j in cluster.active.values():
        if j.state is JobState.PENDING:
            by_part.setdefault(j.partition, []).append(j)
    started: list[int] = []
    for part, queue in by_part.items():
        queue.sort(key=lambda j: (j.submit, j.job_id))
        waiting = [Waiting(j.job_id, j.request, cluster._runtime(j)) for j in queue]
        holding = [
            Holding(len(j.nodes), cluster.expected_end(j))
            for j in cluster.active.values()
            if j.partition == part and j.state is JobState.RUNNING
        ]
        started += fifo_easy_backfill(cluster.now, len(cluster.free[part]), waiting, holding)
    return started


def test_schedule_starts_what_the_plain_backfill_pass_starts(
    shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """And, on the way, the busy-node count and the backend's views are the plain ones."""
    fast, start = Cluster.schedule, Cluster.start
    read_nodes, read_jobs = SimBackend.read_nodes, SimBackend.read_jobs
    started: list[int] = []
    passes = {"started": 0, "none": 0}

    def record_start(self: Cluster, j: SimJob) -> None:
        started.append(j.job_id)
        start(self, j)

    def checked(self: Cluster) -> None:
        assert self.busy_nodes() == sum(1 for o in self.owner if o)
        expected = _plain_schedule(self)
        started.clear()
        fast(self)
        assert started == expected
        passes["started" if expected else "none"] += 1

    def checked_nodes(self: SimBackend) -> tuple[NodeView, ...]:
        nodes = read_nodes(self)
        assert self._node_views is not None
        views = self._node_views
        assert nodes == tuple(views[i][o != 0] for i, o in enumerate(self.cluster.owner))
        return nodes

    def checked_jobs(self: SimBackend) -> tuple[JobView, ...]:
        jobs = read_jobs(self)
        assert jobs == tuple(self._job_view(j) for j in self.cluster.active.values())
        return jobs

    monkeypatch.setattr(SimBackend, "read_nodes", checked_nodes)
    monkeypatch.setattr(SimBackend, "read_jobs", checked_jobs)
    monkeypatch.setattr(Cluster, "start", record_start)
    monkeypatch.setattr(Cluster, "schedule", checked)
    wl = _contended(shared_dir / "traces")
    simulate(wl, _spec(16), SimSettings(policy="mip"), driver_factory=ControllerDriver)
    assert passes["started"] > 10 and passes["none"] > 10
