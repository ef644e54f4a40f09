"""Pending jobs Slurm will not start now (held, dependency, begin time, reservation): pure.

The jobs come from ``squeue --json`` captured on Slurm 22.05.8
(tests/fixtures/slurm/22.05/squeue-held-dependency.json; see CAPTURED.md there): elastic
jobs 783 (``--hold``), 784 (``scontrol hold``), 785 (``scontrol uhold``), 786
(``afterok`` on a running job), 787 (``afterok`` on a failed job), 788 (``--begin`` in an
hour), 789 (a reservation starting in an hour); rigid job 790 (``-N4``, Resources) and
running job 781 on n1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.cluster_state import classify, not_eligible, not_eligible_reason
from slurm_elastic.config import Config
from slurm_elastic.daemon.controller import Allocate, Controller
from slurm_elastic.daemon.problem import build_problem
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.marker import resolve_spec
from slurm_elastic.slurm import parse_json
from slurm_elastic.types import (
    ClusterSnapshot,
    ElasticSpec,
    JobState,
    JobView,
    Outlook,
    SizeEstimate,
)
from tests.fakes import RecordingBackend, targets
from tests.test_daemon_controller_data import job, pending, snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "22.05"

EXPECTED = {
    783: ("JobHeldUser", "held"),
    784: ("JobHeldAdmin", "held"),
    785: ("JobHeldUser", "held"),
    786: ("Dependency", "dependency"),
    787: ("DependencyNeverSatisfied", "dependency never satisfied"),
    788: ("BeginTime", "begin time"),
    789: ("Reservation", "reservation not started"),
    790: ("Resources", None),
    781: ("None", None),
}


def captured() -> dict[int, JobView]:
    views = parse_json.squeue((FIXTURES / "squeue-held-dependency.json").read_text())
    return {j.job_id: j for j in views if j.state.is_active}


def spec_of(j: JobView) -> ElasticSpec | None:
    return resolve_spec(j.comment, j.min_nodes, j.max_nodes)


def outlooks(ids: list[int]) -> dict[int, Outlook]:
    sizes = tuple(SizeEstimate(n, float(n), 100.0 / n) for n in range(1, 5))
    return {i: Outlook(i, 0, sizes, 100.0, 30.0) for i in ids}


def enforcing(
    snap: ClusterSnapshot, allocate: Allocate | None = None
) -> tuple[Controller, RecordingBackend]:
    """An enforce-mode controller over ``snap`` (the real policy unless ``allocate``)."""
    backend = RecordingBackend(snap)
    ctl = Controller(
        backend,  # type: ignore[arg-type]
        Config.model_validate({"mode": "enforce"}),
        reports=ReportStore(),
        journal=Journal(),
        agents=InstructionBoard(),
        allocate=allocate,
    )
    return ctl, backend


def test_slurm_22_05_reasons_as_captured() -> None:
    # The text path's reasons (squeue -O) are held to the JSON's on every version, held,
    # dependency and begin-time waits included, in test_slurm_parse_versions.py.
    jobs = captured()
    for job_id, (reason, why) in EXPECTED.items():
        assert jobs[job_id].state_reason == reason
        assert not_eligible_reason(jobs[job_id]) == why
    assert jobs[786].dependency == "afterok:781(unfulfilled)"


def test_ineligible_jobs_get_no_capacity_and_reserve_nothing() -> None:
    jobs = captured()
    rigid_held = replace(jobs[790], job_id=791, state_reason="JobHeldAdmin")
    snap = snapshot([*jobs.values(), rigid_held])
    cls = classify(snap, spec_of)
    assert set(cls.elastic) == set(range(783, 790))
    problem = build_problem(
        snap, cls, outlooks(list(cls.elastic)), {}, now=0.0, horizon_s=600.0, time_limit_s=1.0
    )
    assert problem.elastic == ()  # every elastic job waits on something else
    assert {(r.job_id, r.running) for r in problem.rigid} == {(781, True), (790, False)}
    # The controller hands over the not_eligible it computed: the same problem.
    kw = {"now": 0.0, "horizon_s": 600.0, "time_limit_s": 1.0}
    given = build_problem(
        snap, cls, outlooks(list(cls.elastic)), {}, waiting=not_eligible(cls), **kw
    )
    assert given == problem


def test_controller_plans_around_them_and_says_why() -> None:
    """With the real policy: the eligible elastic job gets the three free nodes, although
    a held rigid 4-node job and held elastic jobs were submitted before it."""
    jobs = captured()
    eligible = replace(pending(900, lo=1, hi=4), submit_time=2e9)  # submitted last
    held_rigid = replace(jobs[790], state_reason="JobHeldUser")
    snap = snapshot([*(j for i, j in jobs.items() if i != 790), held_rigid, eligible])
    ctl, backend = enforcing(snap)
    result = ctl.run_once(1000.0)
    assert result.ok and result.plan is not None
    assert backend.actions() == [("pin", (900, 3))]
    assert {d.job_id for d in result.plan.decisions} == {900}
    reasons = {r.job_id: r.reason for r in result.jobs}
    for job_id, (_, why) in EXPECTED.items():
        if why is not None:
            assert reasons[job_id] == why
    assert reasons[790] == "not elastic"


def test_a_released_job_is_planned_again() -> None:
    held = replace(pending(7), state_reason="JobHeldUser")
    ctl, backend = enforcing(snapshot([held]), targets({7: 2}))
    first = ctl.run_once(1000.0)
    assert backend.actions() == [] and {r.job_id: r.reason for r in first.jobs}[7] == "held"
    backend.snap = snapshot([replace(held, state_reason="Priority")])  # scontrol release
    ctl.run_once(1010.0)
    assert backend.actions() == [("pin", (7, 2))]


def test_running_and_requeued_states() -> None:
    assert not_eligible_reason(job(1, nodes=("n1",))) is None  # running: never
    requeued = replace(pending(2), state=JobState.REQUEUED, state_reason="BeginTime")
    assert not_eligible_reason(requeued) == "begin time"
    assert not_eligible_reason(replace(pending(3), state_reason="QOSMaxNodePerJobLimit")) is None


def test_a_requeued_job_is_planned_before_its_begin_time_to_return_at_the_policys_size() -> None:
    """Issue 20: a preempted (requeued) job waits out a begin time, then Slurm starts it at
    once at the size pinned for its last run, before any cycle could pin another.  So a
    requeued job whose begin time is near is planned like any pending one and pinned now;
    a job that merely asked for a later --begin still waits, and so does one far off."""
    soon = replace(pending(7), state_reason="BeginTime", restart_count=1, eligible_time=1030.0)
    ctl, backend = enforcing(snapshot([soon]), targets({7: 3}))
    ctl.run_once(1000.0)
    assert backend.actions() == [("pin", (7, 3))]
    later_begin = replace(soon, restart_count=0)  # sbatch --begin: not a requeue
    far = replace(soon, eligible_time=1000.0 + 86_400)
    for waiting in (later_begin, far):
        ctl, backend = enforcing(snapshot([waiting]), targets({7: 3}))
        result = ctl.run_once(1000.0)
        assert backend.actions() == [] and {r.job_id: r.reason for r in result.jobs}[7] == (
            "begin time"
        )
