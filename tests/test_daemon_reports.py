"""daemon/reports.py: the bounded report store and each job's Tally (time saved so far)."""

from __future__ import annotations

import pytest

from slurm_elastic.daemon.commands import _duration
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.types import ProgressReport


def report(time: float, step: int, nodes: int, job_id: int = 7) -> ProgressReport:
    # samples_per_s is the job's own word: the tally must not use it (a lie changes nothing).
    return ProgressReport(job_id=job_id, time=time, step=step, nodes=nodes, samples_per_s=1e9)


def saved(*reports: ProgressReport, keep: int = 512) -> float | None:
    store = ReportStore(max_per_job=keep)
    for r in reports:
        store.add(r)
    return store.saved_s(reports[0].job_id)


def test_unknown_until_the_first_size_is_measured() -> None:
    assert saved(report(0, 0, 2)) is None
    assert saved(report(0, 0, 2), report(10, 0, 2)) is None  # no step: no rate
    assert saved(report(0, 0, 2), report(10, 100, 4)) is None  # grown before a measure
    assert ReportStore().saved_s(7) is None


def test_a_job_that_keeps_its_size_saved_nothing() -> None:
    assert saved(report(0, 0, 2), report(10, 100, 2), report(30, 300, 2)) == pytest.approx(0)


def test_growing_saves_and_shrinking_costs() -> None:
    # 10 steps/s at 2 nodes for 100 s, then 20 steps/s at 4 nodes for 100 s: 3000 steps,
    # 300 s at the first size, done in 200 s.
    grown = (report(0, 0, 2), report(100, 1000, 2), report(150, 2000, 4), report(200, 3000, 4))
    assert saved(*grown) == pytest.approx(100)
    # Then shrunk to 1 node (5 steps/s) for 200 s: 1000 more steps, 100 s worth at 2 nodes.
    shrunk = (*grown, report(300, 3500, 1), report(400, 4000, 1))
    assert saved(*shrunk) == pytest.approx(400 - 400)


def test_a_restart_costs_its_pause_and_its_lost_steps() -> None:
    # 10 steps/s; a resize at t=100 restarts from the step-800 checkpoint and reports again
    # at t=130 (30 s restarting, 200 steps redone): 80 s behind the first size's pace by t=150.
    reports = (report(0, 0, 2), report(100, 1000, 2), report(130, 800, 4), report(150, 1200, 4))
    assert saved(*reports) == pytest.approx(1200 / 10 - 150)


def test_the_whole_job_counts_when_old_reports_are_dropped() -> None:
    reports = [report(0, 0, 2), report(100, 1000, 2)]
    reports += [report(100 + 10 * k, 1000 + 200 * k, 4) for k in range(1, 50)]
    # Kept: the last 3 reports only; the tally still starts at the first.
    assert (
        saved(*reports, keep=3)
        == pytest.approx(saved(*reports))
        == pytest.approx((1000 + 200 * 49) / 10 - 590)
    )


def test_forget_drops_the_tally_and_other_jobs_are_apart() -> None:
    store = ReportStore()
    for r in (report(0, 0, 2), report(10, 100, 2), report(0, 0, 1, job_id=8)):
        store.add(r)
    assert store.saved_s(7) == pytest.approx(0) and store.saved_s(8) is None
    store.forget(7)
    assert store.saved_s(7) is None


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, None), ("12", None), (True, None), (0.4, "+0s"), (42, "+42s"), (-42.4, "-42s"),
     (61, "+1m01s"), (3725.4, "+1h02m"), (-7200, "-2h00m")],
)  # fmt: skip
def test_durations_are_signed_and_short(seconds: object, shown: str | None) -> None:
    assert _duration(seconds) == shown


def test_a_lying_job_moves_only_its_own_figure() -> None:
    """Steps are the job's word: huge jumps, steps going backwards and reports out of order
    change that job's SAVED alone, and never raise."""
    store = ReportStore()
    for r in (report(0, 0, 2, job_id=8), report(10, 100, 2, job_id=8)):
        store.add(r)
    honest = store.saved_s(8)
    lies = [report(0, 0, 2), report(10, 10, 2), report(20, 10**15, 4), report(15, 0, 4),
            report(30, 5, 4), report(30, 5, 0)]  # fmt: skip
    for r in lies:
        store.add(r)
        value = store.saved_s(7)
        assert value is None or value == value  # a number, never NaN
    assert store.saved_s(8) == honest
