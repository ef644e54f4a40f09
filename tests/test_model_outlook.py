"""Per-job model state and the pure outlook: invariants, sources, resize cost, batching."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.model.convergence import (
    AUTO,
    DEFAULT_FAMILY,
    PATIENCE_EPOCHS,
    fit_convergence,
    predict_convergence,
)
from slurm_elastic.model.outlook import (
    MIN_REMAINING_FRACTION,
    RESELECT_GROWTH,
    JobModel,
    ModelBank,
    estimate_outlook,
    marginal_progress,
    progress_over,
)
from slurm_elastic.model.priors import SiteDefaults, site_prior
from slurm_elastic.model.throughput import ScalingParams
from slurm_elastic.types import ElasticSpec, Outlook, ProgressReport

SPEC = ElasticSpec(min_nodes=1, max_nodes=8)
SPEED = ScalingParams(t0=1.6, t1=0.05, t2=0.002, t3=0.02)  # seconds per step


def _check(o: Outlook, spec: ElasticSpec = SPEC) -> None:
    assert [s.nodes for s in o.sizes] == list(spec.allowed_sizes)
    assert math.isfinite(o.remaining_work) and o.remaining_work > 0
    assert math.isfinite(o.resize_cost_s) and o.resize_cost_s >= 0
    assert 0.0 <= o.confidence <= 1.0
    for s in o.sizes:
        assert math.isfinite(s.throughput) and s.throughput > 0
        assert math.isfinite(s.remaining_s) and s.remaining_s > 0
        assert s.remaining_s == pytest.approx(o.remaining_work / s.throughput)


def _outlook(fit, prior=None, current=4, spec=SPEC, elapsed=None, now=None) -> Outlook:
    return estimate_outlook(
        job_id=7,
        spec=spec,
        current_nodes=current,
        fit=fit,
        prior=prior or site_prior(4),
        now=now if now is not None else (fit.time if fit is not None else 0.0),
        default_resize_cost_s=45.0,
        elapsed_s=elapsed,
    )


def _feed(model: JobModel, n: int, nodes: int = 4, t0: float = 0.0, step0: int = 0, **kw) -> None:
    rate = SPEED.throughput(nodes)
    for i in range(1, n + 1):
        step = step0 + 100 * i
        model.update(
            ProgressReport(
                job_id=model.job_id,
                time=t0 + 100 * i / rate,
                step=step,
                nodes=nodes,
                loss=1.0 / (0.0005 * step + 0.5) + 0.2,
                **kw,
            )
        )


def test_prior_only_outlook() -> None:
    o = _outlook(None, current=0)
    _check(o)
    assert o.source == "prior" and o.confidence == 0.0
    assert o.current_nodes == 0 and o.resize_cost_s == 45.0
    # Site default: 4 h at the reference size (the requested 4 nodes).
    assert o.at(4).remaining_s == pytest.approx(SiteDefaults().runtime_s)


def test_prior_outlook_counts_elapsed_time_and_stays_positive() -> None:
    fresh = _outlook(None, elapsed=0.0)
    later = _outlook(None, elapsed=3600.0)
    assert later.at(4).remaining_s == pytest.approx(fresh.at(4).remaining_s - 3600.0)
    overdue = _outlook(None, elapsed=10 * 3600.0)
    _check(overdue)
    # Past the prior's run time: at least MIN_REMAINING_FRACTION of the work done is left.
    assert overdue.at(4).remaining_s == pytest.approx(MIN_REMAINING_FRACTION * 36000.0)


def test_fitted_outlook_from_reports() -> None:
    m = JobModel(7)
    _feed(m, 40)
    fit = m.fit()
    assert fit.throughput is not None and fit.convergence is not None
    o = _outlook(fit)
    _check(o)
    assert o.source == "fitted" and o.confidence > 0.3
    assert o.at(4).throughput == pytest.approx(SPEED.throughput(4), rel=0.02)


def test_user_total_steps_wins() -> None:
    m = JobModel(7)
    _feed(m, 10, total_steps=5000)
    o = _outlook(m.fit())
    _check(o)
    assert o.source == "user"
    assert o.remaining_work == pytest.approx(4000.0)


def test_progress_since_the_last_report_is_extrapolated_briefly() -> None:
    m = JobModel(7)
    _feed(m, 10, total_steps=50_000)
    fit = m.fit()
    rate = fit.throughput.throughput(4)
    at_report = _outlook(fit).remaining_work
    assert _outlook(fit, now=fit.time + 60).remaining_work == pytest.approx(at_report - 60 * rate)
    # A job silent for an hour is assumed to have progressed for 10 minutes only.
    assert _outlook(fit, now=fit.time + 3600).remaining_work == pytest.approx(
        at_report - 600 * rate
    )
    # At another size than the one reported (a resize in flight): no extrapolation.
    assert _outlook(fit, now=fit.time + 60, current=2).remaining_work == at_report


def test_user_target_metric_is_used() -> None:
    m = JobModel(7, family="optimus")  # the family that generated the loss below
    _feed(m, 30, target_metric=0.5)
    fit = m.fit()
    assert fit.target_metric == 0.5
    # Loss 1/(0.0005 k + 0.5) + 0.2 reaches 0.5 at k = (1/0.3 - 0.5)/0.0005 = 5667.
    o = _outlook(fit)
    _check(o)
    assert o.remaining_work == pytest.approx(5667 - 3000, rel=0.25)


def test_a_job_whose_metric_already_plateaued_is_near_its_end() -> None:
    """The criterion held on the reported metric (a plateau, then a learning-rate drop
    made it fall again): the outlook counts the job as converged there instead of
    trusting a curve fitted through the drop, which puts the plateau far ahead."""
    plateaued, falling = JobModel(7), JobModel(8)
    rate = SPEED.throughput(4)
    for i in range(1, 61):
        step = 100 * i
        e = step / 100.0  # one "epoch" per report
        drop = 0.3 * (e > 40) * (1.0 - math.exp(-(e - 40) / 2.0))
        for m, loss in (
            (plateaued, math.exp(-e / 3.0) + 0.5 - drop),
            (falling, 1.0 / (0.0005 * step + 0.5) + 0.2),
        ):
            m.update(
                ProgressReport(job_id=m.job_id, time=step / rate, step=step, nodes=4, loss=loss)
            )
    fit = plateaued.fit()
    assert fit.converged_at is not None and fit.converged_at < 4000
    assert falling.fit().converged_at is None
    done = _outlook(fit)
    _check(done)
    assert done.source == "fitted"
    # At the floor (a running job keeps MIN_REMAINING_FRACTION of its done work), with
    # full confidence: 60 points, and the observation has no band.
    assert done.remaining_work == pytest.approx(MIN_REMAINING_FRACTION * 6000)
    assert done.remaining_work < _outlook(falling.fit()).remaining_work


def test_resize_cost_is_measured_and_used() -> None:
    m = JobModel(7)
    _feed(m, 5, nodes=4)
    last_t = 500 / SPEED.throughput(4)
    m.record_resize(last_t + 1.0, 8)
    # 1 s more at 4 nodes, then the restart takes 30 s, then 100 steps at the new speed
    # before the first report.
    rate4, rate8 = SPEED.throughput(4), SPEED.throughput(8)
    first = last_t + 1.0 + 30.0 + 100 / rate8
    m.update(
        ProgressReport(
            job_id=7,
            time=first,
            step=round(500 + rate4 + 100),
            nodes=8,
            samples_per_s=rate8 * 64,
            global_batch=64,
            loss=0.9,
        )
    )
    fit = m.fit()
    assert fit.resize_cost_s == pytest.approx(30.0, abs=0.5)
    assert _outlook(fit).resize_cost_s == pytest.approx(30.0, abs=0.5)
    # Without a measurement: the user's spec value, then the configured default.
    assert _outlook(None, spec=ElasticSpec(1, 8, resize_cost_s=12.0)).resize_cost_s == 12.0
    assert _outlook(None).resize_cost_s == 45.0


def test_a_job_that_never_reported_pays_for_a_resize_all_it_has_run() -> None:
    """Issue 23: a script without the library restarts from its own last checkpoint, which
    the daemon cannot see: a resize may redo all it has run, and is priced so.  A declared
    resize cost is the user's word for the whole cost; a job that reported holds at a step
    boundary (the library) and pays its restart only."""
    assert _outlook(None, elapsed=None).resize_cost_s == 45.0  # pending: nothing to redo
    assert _outlook(None, elapsed=3600.0).resize_cost_s == 45.0 + 3600.0
    declared = ElasticSpec(1, 8, resize_cost_s=12.0)
    assert _outlook(None, spec=declared, elapsed=3600.0).resize_cost_s == 12.0
    m = JobModel(7)
    _feed(m, 5, nodes=4)
    fit = m.fit()
    assert _outlook(fit, elapsed=3600.0, now=fit.time).resize_cost_s == 45.0
    # At the horizon's length, no other size makes progress for it: the policy leaves it.
    unreported = _outlook(None, elapsed=3600.0)
    assert progress_over(unreported, 8, 3600.0) == 0.0
    assert progress_over(unreported, 4, 3600.0) > 0.0


def test_the_steps_before_the_resize_are_not_taken_for_speed_after_it() -> None:
    """The resize comes a report interval after the last report (30 min in the simulator):
    what the job trained in between, at its old size, is not progress at the new one.
    Measured from the last report's progress, this 60 s restart read as 0 s."""
    m = JobModel(7)
    _feed(m, 5, nodes=4)
    rate4, rate8 = SPEED.throughput(4), SPEED.throughput(8)
    last_t = 500 / rate4
    m.record_resize(last_t + 1800.0, 8)
    first = last_t + 1800.0 + 60.0 + 1000 / rate8
    m.update(
        ProgressReport(
            job_id=7,
            time=first,
            step=round(500 + 1800.0 * rate4 + 1000),
            nodes=8,
            samples_per_s=rate8 * 64,
            global_batch=64,
        )
    )
    assert m.fit().resize_cost_s == pytest.approx(60.0, abs=1.0)


def test_a_free_restart_is_a_measurement_too() -> None:
    m = JobModel(7)
    _feed(m, 5, nodes=4)
    m.record_resize(0.0, 8)  # long before the next report, which then shows no loss
    rate8 = SPEED.throughput(8)
    made = 18_000
    m.update(
        ProgressReport(
            job_id=7,
            time=made / rate8,
            step=500 + made,
            nodes=8,
            samples_per_s=rate8 * 64,
            global_batch=64,
        )
    )
    fit = m.fit()
    assert fit.resize_cost_s == 0.0
    assert _outlook(fit, spec=ElasticSpec(1, 8, resize_cost_s=12.0)).resize_cost_s == 0.0


def test_bad_reports_are_ignored_with_reasons() -> None:
    m = JobModel(7)
    assert m.update(ProgressReport(job_id=8, time=1.0, step=1, nodes=1))
    assert m.update(ProgressReport(job_id=7, time=math.nan, step=1, nodes=1))
    assert m.update(ProgressReport(job_id=7, time=1.0, step=-5, nodes=1))
    assert "loss not finite" in m.update(
        ProgressReport(job_id=7, time=2.0, step=10, nodes=2, loss=math.nan)
    )
    assert "nodes <= 0" in m.update(ProgressReport(job_id=7, time=3.0, step=20, nodes=0))
    _check(_outlook(m.fit()))


def test_checkpoint_rollback_replaces_newer_points() -> None:
    m = JobModel(7)
    _feed(m, 10)
    m.update(ProgressReport(job_id=7, time=1e4, step=500, nodes=4, loss=0.8))
    k, _, _ = m.series()
    assert k[-1] == 500 and len(k) == 5


def test_fit_is_cached_until_new_reports() -> None:
    m = JobModel(7)
    _feed(m, 5)
    a = m.fit()
    assert m.fit() is a
    _feed(m, 1, t0=1e4, step0=10_000)
    assert m.fit() is not a


def test_fit_all_matches_single_fits() -> None:
    bank = ModelBank()
    for j in range(5):
        _feed(bank.model(j), 10 + 5 * j)
    batch = bank.fit_all()
    for j in range(5):
        single = JobModel(j)
        _feed(single, 10 + 5 * j)
        a, b = batch[j].convergence, single.fit().convergence
        assert a is not None and b is not None
        assert (a.a, a.c, a.b2) == pytest.approx((b.a, b.c, b.b2), rel=1e-9)
    bank.forget([0, 1])
    assert len(bank) == 3 and 0 not in bank


def test_marginal_progress_per_node() -> None:
    m = JobModel(7)
    _feed(m, 20)
    o = _outlook(m.fit())
    assert progress_over(o, 4, 60.0) == pytest.approx(60.0 * o.at(4).throughput)
    # Another size pays the resize cost first.
    assert progress_over(o, 8, 60.0) == pytest.approx(15.0 * o.at(8).throughput)
    assert progress_over(o, 99, 60.0) == 0.0
    gains = marginal_progress(o, 600.0)
    assert list(gains) == list(SPEC.allowed_sizes)
    assert gains[1] > 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e5),
            st.integers(-3, 10**6),
            st.integers(-1, 16),
            st.one_of(st.none(), st.floats(-1e3, 1e3), st.just(math.nan)),
            st.one_of(st.none(), st.floats(-10, 1e4), st.just(math.inf)),
        ),
        max_size=30,
    ),
    st.integers(0, 8),
    st.one_of(st.none(), st.floats(0, 1e6)),
)
def test_outlook_invariants_for_any_report_stream(reports, current, elapsed) -> None:
    m = JobModel(7)
    for t, step, nodes, loss, sps in reports:
        m.update(
            ProgressReport(
                job_id=7,
                time=t,
                step=step,
                nodes=nodes,
                loss=loss,
                samples_per_s=sps,
                global_batch=32,
            )
        )
    _check(_outlook(m.fit(site_prior(2)), prior=site_prior(2), current=current, elapsed=elapsed))


def test_throughput_points_and_last_step_feed_future_priors() -> None:
    m = JobModel(7)
    assert m.throughput_points() == () and m.last_step is None
    _feed(m, 5, nodes=2)
    _feed(m, 5, nodes=4, t0=1e4, step0=1000)
    pts = dict(m.throughput_points())
    assert set(pts) == {2, 4}
    assert pts[4] == pytest.approx(SPEED.throughput(4), rel=1e-6)
    assert m.last_step == 1500


def test_too_many_sizes_is_a_broken_reporter() -> None:
    m = JobModel(7)
    for n in range(1, 80):
        reasons = m.update(
            ProgressReport(
                job_id=7, time=float(n), step=n, nodes=n, samples_per_s=10.0, global_batch=10
            )
        )
    assert reasons and "distinct sizes" in reasons[0]
    assert len(m.throughput_points()) == 64


def test_real_pollux_curve_fed_as_reports(shared_dir) -> None:
    """The simulator's path: a real validation curve arrives as reports, step = iteration."""
    import csv

    path = shared_dir / "traces/pollux/profiles/cifar10/validation-512.csv"
    if not path.is_file():
        pytest.skip("pollux traces not present")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    bank = ModelBank()
    half = rows[: len(rows) // 2]
    for i, r in enumerate(half):
        bank.update(
            ProgressReport(
                job_id=1,
                time=10.0 * (i + 1),
                step=int(r["iteration"]),
                nodes=2,
                loss=float(r["metric"]),
                metric_higher_is_better=True,
            )
        )
    fit = bank.fit_all()[1]
    assert fit.convergence is not None and fit.convergence.kind == "curve"
    assert 0.85 < fit.convergence.asymptote <= 1.0
    o = _outlook(fit, current=2)
    _check(o)
    assert o.source == "fitted"


def test_noisy_training_loss_stream_stays_sane() -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    m = JobModel(3)
    for i in range(1, 2001):
        step = 10 * i
        loss = 2.0 / (0.002 * step + 1.0) + 0.4 + rng.normal(0.0, 0.1)
        if i % 97 == 0:
            loss = 50.0  # a loss spike
        m.update(ProgressReport(job_id=3, time=float(i), step=step, nodes=4, loss=loss))
    fit = m.fit()
    assert fit.convergence is not None
    assert fit.convergence.b2 == pytest.approx(0.4, abs=0.1)
    k, _, _ = m.series()
    assert len(k) <= 96


def _linear_job(phi: float | None) -> JobModel:
    """A ``linear`` batch rule: 64 samples per step on 2 nodes, 128 on 4; 1 step/s both."""
    m = JobModel(9)
    for i in range(1, 21):
        nodes, batch = (2, 64) if i <= 10 else (4, 128)
        m.update(
            ProgressReport(
                job_id=9,
                time=float(i),
                step=i,
                nodes=nodes,
                samples_per_s=float(batch),
                global_batch=batch,
                grad_noise_scale=phi,
                total_steps=40,
            )
        )
    return m


def test_growing_batch_counts_samples_as_progress() -> None:
    fit = _linear_job(None).fit()
    # A step at 128 is two reference steps (batch 64): rates and progress say so.
    assert fit.throughput.throughput(2) == pytest.approx(1.0, rel=1e-6)
    assert fit.throughput.throughput(4) == pytest.approx(2.0, rel=1e-6)
    assert fit.progress == pytest.approx(10 + 2 * 10)
    assert fit.step_factor == pytest.approx(2.0)
    # 20 optimizer steps of the budget are left, at batch 128: 40 reference steps.
    o = _outlook(fit, current=4, spec=ElasticSpec(2, 4))
    assert o.remaining_work == pytest.approx(40.0)
    assert o.at(4).remaining_s == pytest.approx(20.0)


def test_gradient_noise_scale_discounts_large_batches() -> None:
    fit = _linear_job(64.0).fit()
    eff = (64.0 + 64.0) / (64.0 + 128.0)  # Pollux: (phi + B0) / (phi + B)
    assert fit.step_factor == pytest.approx(2.0 * eff)
    assert fit.throughput.throughput(4) == pytest.approx(2.0 * eff, rel=1e-6)


def test_fixed_batch_progress_is_the_step_count() -> None:
    m = JobModel(7)
    _feed(m, 10, global_batch=64, samples_per_s=64.0, grad_noise_scale=100.0)
    fit = m.fit()
    assert fit.progress == fit.step == 1000 and fit.step_factor == 1.0


def test_fit_job_by_job_refits_all_stale_jobs_in_one_batch() -> None:
    bank = ModelBank()
    priors = {j: site_prior(j + 1) for j in range(3)}
    for j in range(3):
        _feed(bank.model(j), 10)
        bank.fit(j, priors[j])
    for j in range(3):
        _feed(bank.model(j), 1, t0=1e4, step0=5000)
    assert all(bank.model(j).stale(priors[j]) for j in range(3))
    first = bank.fit(0, priors[0])
    # Jobs 1 and 2 were refitted along with job 0: their fits are now cached.
    assert not bank.model(1).stale(priors[1]) and not bank.model(2).stale(priors[2])
    cached = bank.model(1).fit(priors[1])
    assert bank.fit(1, priors[1]) is cached
    assert first.step == 5100 and cached.step == 5100
    assert bank.fit(99) is None


def test_family_is_reselected_only_when_progress_grew_a_quarter() -> None:
    bank = ModelBank(AUTO)
    m = bank.model(7)
    _feed(m, 3)  # 3 points: nothing can be held out, the default family
    bank.fit_all()
    assert m.family == DEFAULT_FAMILY and not m.needs_selection()
    _feed(m, 1, t0=1e3, step0=300)  # a 4th point: selection is retried
    assert m.needs_selection()
    bank.fit_all()
    _feed(m, 16, t0=2e3, step0=400)  # progress 400 -> 2000: re-selected
    assert m.needs_selection()
    bank.fit_all()
    at = m.series()[0][-1]
    _feed(m, 4, t0=1e4, step0=2000)  # 2000 -> 2400: < 25%, only the chosen family is refit
    assert not m.needs_selection()
    chosen = m.family
    fit = bank.fit_all()[7]
    assert fit.convergence is not None and fit.convergence.family == chosen
    _feed(m, 1, t0=2e4, step0=int(RESELECT_GROWTH * at))  # 2500 = 1.25 x 2000
    assert m.needs_selection()


def test_selection_cadence_matches_a_fresh_selection() -> None:
    # A job fed an exponential curve ends with the family a one-shot fit would choose.
    bank = ModelBank(AUTO)
    m = bank.model(3)
    for i in range(1, 61):
        m.update(
            ProgressReport(
                job_id=3, time=float(i), step=100 * i, nodes=2, loss=1.5 * math.exp(-i / 8) + 0.3
            )
        )
        bank.fit_all()
    k, y, rising = m.series()
    assert m.family == fit_convergence(k, y, higher_is_better=rising, family=AUTO).family == "exp"


def test_a_configured_family_is_used_without_selection_and_can_change() -> None:
    bank = ModelBank()  # the default: exp, never selected per job
    m = bank.model(7)
    _feed(m, 40)  # an Optimus-shaped loss: AUTO would pick optimus
    assert not m.needs_selection()
    assert bank.fit_all()[7].convergence.family == DEFAULT_FAMILY == "exp"
    bank.use_family("optimus")  # SIGHUP with model.curve_family: optimus
    assert bank.fit_all()[7].convergence.family == "optimus"
    assert bank.model(8).family == "optimus"  # new jobs too
    bank.use_family(AUTO)
    assert m.needs_selection()
    bank.fit_all()
    assert m.family == "optimus"


def test_window_is_patience_epochs_of_reported_progress() -> None:
    m = JobModel(7)
    _feed(m, 10)
    assert m.fit().window is None  # no epochs reported: the criterion's default window
    m = JobModel(7)
    # 100 steps per report, 0.25 epoch per report: 400 steps per epoch -> window 2000.
    for i in range(1, 11):
        m.update(
            ProgressReport(
                job_id=7,
                time=float(i),
                step=100 * i,
                nodes=4,
                epoch=0.25 * i,
                loss=1.0 / (0.0005 * 100 * i + 0.5) + 0.2,
            )
        )
    fit = m.fit()
    assert fit.window == pytest.approx(PATIENCE_EPOCHS * 400.0)
    assert fit.convergence is not None
    pred = predict_convergence(fit.convergence, window=fit.window)
    assert pred is not None and pred.k >= fit.convergence.k_first + fit.window
