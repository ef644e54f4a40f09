"""``scontrol reconfigure`` after a shrunk job ends (the Slurm 22.05 node leak), pure.

Controller cycles over hand-written snapshots; Slurm calls are recorded.  The live
reproduction of the leak, and of the fix through the daemon, is in
tests/test_daemon_live.py (``test_reconfigure_after_a_shrunk_job_ends_keeps_nodes_usable``).
"""

from __future__ import annotations

import pytest

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import ActionStatus, Journal
from slurm_elastic.config import Config
from slurm_elastic.daemon.controller import Controller
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.slurm.cli import leaks_nodes_after_shrink
from slurm_elastic.types import Action, ActionKind, JobView
from tests.fakes import RecordingBackend, targets
from tests.test_daemon_controller_data import job, snapshot

COMPANION = "slurm-elastic:companion-of="


def make(
    jobs: list[JobView],
    plan: dict[int, int],
    *,
    setting: str = "auto",
    mode: str = "enforce",
    journal: Journal | None = None,
) -> tuple[Controller, RecordingBackend]:
    """Hard shrinks after a 5 s ack timeout, so two cycles apply a planned shrink."""
    backend = RecordingBackend(snapshot(jobs))
    config = Config.model_validate(
        {
            "mode": mode,
            "slurm": {"reconfigure_after_shrink": setting},
            "guards": {"min_dwell_s": 0, "cooldown_s": 0, "hard_shrink": True, "ack_timeout_s": 5},
        }
    )
    ctl = Controller(
        backend,  # type: ignore[arg-type]
        config,
        reports=ReportStore(),
        journal=journal or Journal(),
        agents=InstructionBoard(),
        allocate=targets(plan),
    )
    return ctl, backend


def shrink_all(ctl: Controller, backend: RecordingBackend, now: float) -> None:
    """Two cycles: instruct, then hard-shrink at the deadline."""
    ctl.run_once(now)
    ctl.run_once(now + 6)
    shrinks = [e for e in ctl.journal.all_actions() if e.kind is ActionKind.SHRINK]
    assert shrinks and all(e.status is ActionStatus.APPLIED for e in shrinks), shrinks


def reconfigures(backend: RecordingBackend) -> int:
    return sum(1 for verb, _ in backend.calls if verb == "reconfigure")


def rows(ctl: Controller) -> list[tuple[int, ActionStatus]]:
    return [
        (e.job_id, e.status) for e in ctl.journal.all_actions() if e.kind is ActionKind.RECONFIGURE
    ]


def test_exactly_one_reconfigure_when_a_shrunk_job_ends() -> None:
    big = job(8, nodes=("n1", "n2", "n3", "n4"))
    ctl, backend = make([big], {8: 2})
    shrink_all(ctl, backend, 1000.0)
    backend.snap = snapshot([job(8, nodes=("n1", "n2"))])
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 0  # still running: nothing to do yet
    backend.snap = snapshot([])  # the shrunk job has ended
    result = ctl.run_once(1020.0)
    assert reconfigures(backend) == 1
    (rec,) = [r for r in result.actions if r.action.kind is ActionKind.RECONFIGURE]
    assert (rec.action.job_id, rec.outcome) == (8, "applied")
    for t in (1030.0, 1040.0, 1050.0):
        assert not ctl.run_once(t).actions
    assert reconfigures(backend) == 1
    assert rows(ctl) == [(8, ActionStatus.APPLIED)]
    assert [c[0] for c in backend.calls].count("probe") == 1  # probed once, when needed


def test_one_reconfigure_per_ending() -> None:
    """Endings in different cycles get one call each; endings seen in one cycle share it."""
    a = job(1, nodes=("n1", "n2"), hi=2)
    b = job(2, nodes=("n3", "n4"), hi=2)
    ctl, backend = make([a, b], {1: 1, 2: 1})
    shrink_all(ctl, backend, 1000.0)
    backend.snap = snapshot([job(2, nodes=("n3",), hi=2)])  # job 1 ended
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 1
    backend.snap = snapshot([])  # job 2 ended
    ctl.run_once(1020.0)
    ctl.run_once(1030.0)
    assert reconfigures(backend) == 2
    assert rows(ctl) == [(1, ActionStatus.APPLIED), (2, ActionStatus.APPLIED)]

    ctl, backend = make([a, b], {1: 1, 2: 1})
    shrink_all(ctl, backend, 1000.0)
    backend.snap = snapshot([])  # both ended before the next cycle
    ctl.run_once(1010.0)
    ctl.run_once(1020.0)
    assert reconfigures(backend) == 1
    assert rows(ctl) == [(1, ActionStatus.APPLIED), (2, ActionStatus.APPLIED)]


def test_no_reconfigure_for_jobs_not_shrunk_with_numnodes() -> None:
    # 8 shrinks by cancelling its companion only (its own allocation is untouched);
    # 9 is never resized.
    parent = job(8, nodes=("n1", "n2"))
    comp = job(31, nodes=("n3",), comment=f"{COMPANION}8")
    other = job(9, nodes=("n4",), hi=1, lo=1)
    journal = Journal()
    journal.link_companion(8, 31, 1, None, 0.0)  # the daemon's companion (it submitted it)
    ctl, backend = make([parent, comp, other], {8: 2}, journal=journal)
    shrink_all(ctl, backend, 1000.0)
    assert ("cancel", 31) in backend.actions() and ("shrink", (8, 2)) not in backend.actions()
    backend.snap = snapshot([])
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 0 and rows(ctl) == []


@pytest.mark.parametrize(
    ("setting", "leaks", "expected"),
    [("auto", True, 1), ("auto", False, 0), ("always", False, 1), ("never", True, 0)],
)
def test_setting_and_probed_version(setting: str, leaks: bool, expected: int) -> None:
    ctl, backend = make([job(8, nodes=("n1", "n2", "n3"))], {8: 1}, setting=setting)
    backend.leaks = leaks
    shrink_all(ctl, backend, 1000.0)
    backend.snap = snapshot([])
    ctl.run_once(1010.0)
    ctl.run_once(1020.0)
    assert reconfigures(backend) == expected


def test_shadow_mode_does_not_reconfigure_and_enforce_catches_up_once() -> None:
    ctl, backend = make([job(8, nodes=("n1", "n2", "n3"))], {8: 1})
    shrink_all(ctl, backend, 1000.0)
    enforce = ctl.config
    ctl.reconfigure(enforce.model_copy(update={"mode": "shadow"}))
    backend.snap = snapshot([])
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 0
    ctl.reconfigure(enforce)
    ctl.run_once(1020.0)
    ctl.run_once(1030.0)
    assert reconfigures(backend) == 1


def test_probe_failure_is_retried_and_a_refusal_is_recorded_once() -> None:
    ctl, backend = make([job(8, nodes=("n1", "n2", "n3"))], {8: 1})
    shrink_all(ctl, backend, 1000.0)
    backend.snap = snapshot([])
    backend.fail_probe = True
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 0 and rows(ctl) == []
    backend.fail_probe = False
    backend.refuse_reconfigure = True
    result = ctl.run_once(1020.0)
    (rec,) = result.actions
    assert rec.outcome == "failed" and "permission denied" in rec.detail.lower()
    ctl.run_once(1030.0)
    assert reconfigures(backend) == 1  # a refusal is not repeated every cycle
    assert rows(ctl) == [(8, ActionStatus.FAILED)]


def test_crash_before_the_call_reissues_it_after_restart() -> None:
    journal = Journal()
    shrink = Action(ActionKind.SHRINK, 8, 3, 1, extra=(("parent_nodes", "1"), ("parent_from", "3")))
    journal.mark(journal.record_intent(shrink, 900.0), ActionStatus.APPLIED, 905.0)
    journal.record_intent(Action(ActionKind.RECONFIGURE, 8, 0, 0), 950.0)  # then SIGKILL
    ctl, backend = make([], {}, journal=journal)
    ctl.run_once(1000.0)  # reconcile rolls the intent back; the cycle reconfigures
    ctl.run_once(1010.0)
    assert reconfigures(backend) == 1
    assert rows(ctl) == [(8, ActionStatus.ROLLED_BACK), (8, ActionStatus.APPLIED)]


def test_journal_knows_which_jobs_were_shrunk() -> None:
    journal = Journal()
    cases = {
        1: (("parent_nodes", "1"), ("parent_from", "3")),  # NumNodes=1
        2: (("parent_nodes", "2"), ("parent_from", "2"), ("cancel_companions", "7")),
        3: (("parent_nodes", "1"),),  # an older row without parent_from: counted
    }
    for job_id, extra in cases.items():
        action_id = journal.record_intent(Action(ActionKind.SHRINK, job_id, 3, 1, extra=extra), 1.0)
        journal.mark(action_id, ActionStatus.APPLIED, 2.0)
    rolled = journal.record_intent(Action(ActionKind.SHRINK, 4, 3, 1), 1.0)
    journal.mark(rolled, ActionStatus.ROLLED_BACK, 2.0)
    assert journal.shrunk_jobs() == {1, 3}


@pytest.mark.parametrize(
    ("version", "leaks"),
    [("22.05.8", True), ("22.05.11", True), ("23.02.7", False), ("21.08.8", False)],
)
def test_versions_with_the_leak(version: str, leaks: bool) -> None:
    assert leaks_nodes_after_shrink(version) is leaks
