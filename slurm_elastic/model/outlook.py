"""Per-job progress state fed by reports, and the pure ``estimate_outlook`` over it.

Usage by the daemon (one ``ModelBank`` for the whole cluster)::

    bank = ModelBank()
    bank.update(report)                       # every accepted ProgressReport
    bank.record_resize(job_id, now, to_nodes)  # when a resize was applied
    bank.fit_all(priors)                       # once per cycle: batched refit of stale jobs
    fit = bank.fit(job_id, priors[job_id])     # cached; the same prior object -> no refit
    outlook = estimate_outlook(job_id=..., spec=..., current_nodes=..., fit=fit,
                               prior=prior, now=now, default_resize_cost_s=60.0)

``fit`` job by job works too: a stale job's refit takes every other stale job (fitted
before) along in one batch, so both ways cost one batched solve per cycle.  The
convergence criterion measures improvement from a job's *first* report, so after a
daemon restart feed a job's stored reports again (oldest first), not only new ones.

Guarantees of ``estimate_outlook`` (tested):

* one ``SizeEstimate`` per allowed size, ascending; every number finite and > 0, so a
  policy never has to special-case ``inf`` or NaN;
* ``remaining_s == remaining_work / throughput`` at every size, hence "more nodes" is
  faster exactly where the throughput model says so (with ``t2 > 0`` the largest sizes
  can be slower: policies must compare, not assume monotonicity);
* with no report at all the numbers come from the prior (``source="prior"``,
  ``confidence`` at most 0.3): remaining time at the reference size is the typical run
  time of similar jobs (or the site default) minus the time already run, never less than
  ``MIN_REMAINING_FRACTION`` of the work done so far and never less than one minute.
  This is a deliberately conservative finite estimate: treat low confidence as "do not
  take large risks for this job", not as "unknown";
* a job with no report and no declared ``resize_cost`` pays for a resize all it has run
  (``OutlookBasis.outlook``): its script, not the library, decides what a restart redoes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import structlog

from slurm_elastic.model.convergence import (
    AUTO,
    DEFAULT_FAMILY,
    FAMILIES,
    MIN_POINTS,
    PATIENCE_EPOCHS,
    THRESHOLD,
    ConvergenceFit,
    ConvergencePrediction,
    fit_convergence_many,
    observed_convergence,
    predict_convergence,
    select_families,
)
from slurm_elastic.model.priors import Prior
from slurm_elastic.model.throughput import (
    Observations,
    ScalingParams,
    ThroughputFit,
    fit_throughput_many,
)
from slurm_elastic.types import ElasticSpec, Outlook, ProgressReport, SizeEstimate

log = structlog.get_logger("slurm_elastic.model")

FIT_POINTS = 96  # metric points kept per job (older ones compacted, see _add_point)
COMPACT = 48  # when full, the oldest COMPACT points become COMPACT/3 medians of three
RATE_WINDOW = 32  # throughput observations kept per size
MAX_SIZES = 64  # distinct sizes with rates kept per job (more is a broken reporter)
RESIZE_COSTS_KEPT = 5
MIN_REMAINING_FRACTION = 0.1  # a job still running has at least 10% of its done work left
MIN_REMAINING_S = 60.0
CONV_FULL_POINTS = 20  # convergence confidence saturates at this many metric points
MAX_EXTRAPOLATION_S = 600.0  # progress assumed after the last report, at most
# The curve family is re-selected (rolling-origin holdout, ~6 fits) only when a job's
# observed progress has grown by this factor since the last selection; refits in between
# use the chosen family (one fit).  Progress, not reports: the holdout compares how the
# families extrapolate, which changes as the observed span grows, not with one more point.
RESELECT_GROWTH = 1.25


# A grow promised less speed-up than this is not judged: measurement noise would decide.
MIN_PROMISED_GAIN = 0.05


@dataclass(frozen=True, slots=True)
class GrowCheck:
    """When a grow has delivered too little of the speed-up it was decided on.

    After the job grows from ``a`` to ``b`` nodes, the speed-up the fit promised,
    ``f(b)/f(a)``, is kept; once ``reports`` rates are measured at ``b``, the measured
    speed-up must give at least ``min_gain_share`` of the promised gain (``f(b)/f(a) - 1``).
    A job that falls short has its fit capped at its best measured speed beyond the
    largest size it has run at, for the rest of its life: the model's extrapolation (its
    prior, its claims) no longer buys it nodes, and what it did not gain goes back to other
    jobs through the normal shrink path.  Config: ``model.grow_check_reports`` and
    ``model.grow_min_gain_share`` (0 turns the check off).
    """

    reports: int = 3
    min_gain_share: float = 0.5


@dataclass(frozen=True, slots=True)
class JobFit:
    """Everything known about one job's progress at one moment (immutable)."""

    job_id: int
    step: int
    time: float
    nodes: int
    n_reports: int
    convergence: ConvergenceFit | None
    throughput: ThroughputFit | None
    total_steps: int | None
    target_metric: float | None
    resize_cost_s: float | None  # median measured restart overhead
    # Progress in reference steps (see JobModel) and reference steps per optimizer step at
    # the job's current batch; both equal ``step`` and 1.0 for a fixed global batch.
    progress: float | None = None
    step_factor: float = 1.0
    # The convergence criterion's window in progress units (PATIENCE_EPOCHS epochs), when
    # the job reports epochs; None: the criterion's default (5 metric reports).
    window: float | None = None
    # Progress at which the criterion already held on the reported metric (see
    # ``convergence.observed_convergence``); None while it has not.
    converged_at: float | None = None
    stop_free: bool = False  # its newest report says it resizes stop-free (torchft)


class JobModel:
    """Incremental state of one job: metric history, per-size rates, resize costs.

    Progress unit: *reference steps*, optimizer steps at the first global batch the job
    reported.  With a fixed global batch (the agent's default ``accumulate`` rule) that is
    simply the step count.  When the batch grows with the world (``linear``/``sqrt``
    rules), a step at batch ``B`` counts ``(B/B0) * (phi + B0)/(phi + B)`` reference steps:
    its samples, discounted by Pollux's statistical efficiency when the job reports a
    gradient noise scale ``phi`` (without one, samples count fully, which is exact for a
    job that stops after a number of epochs).  Rates, the convergence axis and remaining
    work all use this unit, so sizes with different batches stay comparable.
    """

    def __init__(
        self, job_id: int, family: str = DEFAULT_FAMILY, check: GrowCheck = GrowCheck()
    ) -> None:
        self.job_id = job_id
        self.check = check
        self._k: list[float] = []
        self._y: list[float] = []
        self._higher_is_better = False
        self._rates: dict[int, deque[float]] = {}
        self._last: ProgressReport | None = None
        self._n_reports = 0
        self._total_steps: int | None = None
        self._target: float | None = None
        # (time, to_nodes, progress at the resize)
        self._pending_resize: tuple[float, int, float] | None = None
        self._costs: deque[float] = deque(maxlen=RESIZE_COSTS_KEPT)
        # (from size, to size, promised speed-up) of the last grow, until judged (GrowCheck)
        self._promise: tuple[int, int, float] | None = None
        self.overpromised = False  # a grow fell short: no gain is extrapolated any more
        self._from_jobs = False  # rates measured from a job's reports (see observations)
        self._cache: JobFit | None = None
        self._cache_key: tuple[int, int, ScalingParams | None] | None = None
        self._last_prior: Prior | None = None  # the prior the cached fit was given
        self._n_costs = 0
        self._stop_free = False
        self._ref_batch: int | None = None
        self._phi: float | None = None
        self._progress = 0.0  # reference steps at the newest report
        self._per_epoch: float | None = None  # reference steps per epoch, when reported
        # The configured curve family (a name or AUTO), the family in use, and the metric
        # span / point count when AUTO last chose it.
        self._family_choice = DEFAULT_FAMILY
        self._family = DEFAULT_FAMILY
        self._family_at: tuple[float, int] | None = None
        self.use_family(family)

    # ----------------------------------------------------------------- input

    def update(self, report: ProgressReport) -> tuple[str, ...]:
        """Take one report; returns the reasons for any part of it that was ignored."""
        ignored: list[str] = []
        if report.job_id != self.job_id:
            return (f"report for job {report.job_id} sent to model of job {self.job_id}",)
        if not math.isfinite(report.time) or report.step < 0:
            return ("time not finite or step negative",)
        self._n_reports += 1
        self._from_jobs = self._from_jobs or report.claimed_nodes is not None
        if report.total_steps is not None and report.total_steps > 0:
            self._total_steps = int(report.total_steps)
        if report.target_metric is not None and math.isfinite(report.target_metric):
            self._target = float(report.target_metric)
        if report.global_batch is not None and report.global_batch > 0:
            self._ref_batch = self._ref_batch or int(report.global_batch)
        phi = report.grad_noise_scale
        if phi is not None and math.isfinite(phi) and phi >= 0.0:
            self._phi = float(phi)
        factor = self._factor(report)
        last = self._last
        k = (
            report.step * factor
            if last is None
            else (self._progress + (report.step - last.step) * factor)
        )
        if report.loss is not None:
            if math.isfinite(report.loss):
                self._higher_is_better = report.metric_higher_is_better
                self._add_point(k, float(report.loss))
            else:
                ignored.append("loss not finite")
        rate = self._rate_from(report)
        rate = rate * factor if rate is not None and math.isfinite(rate * factor) else None
        if rate is not None and report.nodes not in self._rates and len(self._rates) >= MAX_SIZES:
            ignored.append(f"more than {MAX_SIZES} distinct sizes")
        elif rate is not None:
            self._rates.setdefault(report.nodes, deque(maxlen=RATE_WINDOW)).append(rate)
            self._judge_grow(report.nodes)
        elif report.nodes <= 0:
            ignored.append("nodes <= 0")
        elif not _agrees(report):
            ignored.append(f"claimed {report.claimed_nodes} nodes, Slurm says {report.nodes}")
        self._measure_resize(report, rate, k)
        if report.epoch is not None and math.isfinite(report.epoch) and report.epoch > 0.0:
            self._per_epoch = k / report.epoch if k > 0.0 else self._per_epoch
        if last is None or report.time >= last.time:
            self._last = report
            self._progress = k
            self._stop_free = report.mode == "torchft"
        if ignored:
            log.info("model.report_ignored", job_id=self.job_id, reasons=ignored)
        return tuple(ignored)

    def record_resize(self, now: float, to_nodes: int) -> None:
        """A resize to ``to_nodes`` was applied at ``now``; the next report there measures it.

        A grow also records the speed-up the current fit promised for it (``GrowCheck``).
        """
        to_nodes = int(to_nodes)
        self._pending_resize = (now, to_nodes, self._progress_at(now))
        self._promise = None
        last = self._last
        fit = self._cache.throughput if self._cache is not None else None
        if last is None or fit is None or self.check.min_gain_share <= 0:
            return
        before = last.nodes
        if 0 < before < to_nodes and before in self._rates:
            promised = fit.throughput(to_nodes) / fit.throughput(before)
            if promised > 1.0 + MIN_PROMISED_GAIN:
                self._promise = (before, to_nodes, promised)

    def _progress_at(self, t: float) -> float:
        """Progress at ``t`` (reference steps): the newest report's, carried on to ``t`` at
        the measured rate of its size (the job trained on until the resize stopped it; up to
        a report interval later).  Counting that as progress made after the resize would
        take it for speed at the new size and measure the restart as cheaper than it was."""
        last = self._last
        rates = self._rates.get(last.nodes) if last is not None else None
        if last is None or t <= last.time or not rates:
            return self._progress
        return self._progress + (t - last.time) * statistics.median(rates)

    def _judge_grow(self, size: int) -> None:
        """Once enough rates are measured at the size of the last grow, compare them with
        what it promised (``GrowCheck``)."""
        promise = self._promise
        if promise is None or size != promise[1] or len(self._rates[size]) < self.check.reports:
            return
        self._promise = None
        before, after, promised = promise
        base = self._rates.get(before)
        if not base:
            return
        measured = statistics.median(self._rates[after]) / statistics.median(base)
        share = (measured - 1.0) / (promised - 1.0)
        if share < self.check.min_gain_share:
            self.overpromised = True
            log.warning(
                "model.grow_shortfall",
                job_id=self.job_id,
                from_nodes=before,
                to_nodes=after,
                promised_speedup=round(promised, 3),
                measured_speedup=round(measured, 3),
            )

    def _factor(self, r: ProgressReport) -> float:
        """Reference steps per optimizer step at this report's batch (1.0 at the first)."""
        b, b0 = r.global_batch, self._ref_batch
        if b is None or b <= 0 or b0 is None or b == b0:
            return 1.0
        eff = 1.0 if self._phi is None else (self._phi + b0) / (self._phi + b)
        return (b / b0) * eff

    def _add_point(self, k: float, y: float) -> None:
        if self._k and k < self._k[-1]:
            # A restart from a checkpoint re-reports old steps: the newest view wins.
            while self._k and self._k[-1] >= k:
                self._k.pop()
                self._y.pop()
        self._k.append(k)
        self._y.append(y)
        if len(self._k) > FIT_POINTS:
            # Amortised compaction: history stays bounded, old data is kept at ever coarser
            # resolution, and a median of three means one loss spike cannot move a point.
            ks, ys = self._k[:COMPACT], self._y[:COMPACT]
            self._k[:COMPACT] = [ks[i + 1] for i in range(0, COMPACT, 3)]
            self._y[:COMPACT] = [sorted(ys[i : i + 3])[1] for i in range(0, COMPACT, 3)]

    def _rate_from(self, r: ProgressReport) -> float | None:
        """Steps per second at ``r.nodes``: the report's own rate from a trusted source (the
        simulator), else measured from the step delta since the previous report at the same
        size.  A report from a job (``claimed_nodes`` set) gives a rate only when the size it
        claims is Slurm's, and so did the previous one: a claim about a size the job is not
        running at is never a measurement."""
        if r.nodes <= 0 or not _agrees(r):
            return None
        if (
            r.claimed_nodes is None
            and r.samples_per_s is not None
            and r.global_batch
            and math.isfinite(r.samples_per_s)
            and r.samples_per_s > 0
            and r.global_batch > 0
        ):
            return r.samples_per_s / r.global_batch
        last = self._last
        if last is None or last.nodes != r.nodes or not _agrees(last):
            return None
        if self._pending_resize is not None and last.time <= self._pending_resize[0]:
            return None  # a resize happened between the two reports
        dt, ds = r.time - last.time, r.step - last.step
        if dt <= 0 or ds <= 0:
            return None
        return ds / dt

    def _measure_resize(self, r: ProgressReport, rate: float | None, k: float) -> None:
        pend = self._pending_resize
        if pend is None or r.time < pend[0] or r.nodes != pend[1] or not _agrees(r):
            return
        t0, _, k0 = pend
        rates = self._rates.get(r.nodes)
        speed = rate or (statistics.median(rates) if rates else None)
        progressed = (k - k0) / speed if speed else 0.0
        # Wall time since the resize minus the time the new size needed for the steps it
        # has made since: what the restart cost (a checkpoint roll-back adds to it).
        cost = max(0.0, (r.time - t0) - progressed)
        self._costs.append(cost)
        self._n_costs += 1
        self._pending_resize = None
        log.info("model.resize_cost_measured", job_id=self.job_id, cost_s=round(cost, 3))

    # ----------------------------------------------------------------- fit

    def fit(self, prior: Prior | None = None) -> JobFit:
        """Refit (only when reports arrived since the last call) and return the state."""
        if self._cache is not None and not self.stale(prior):
            return self._cache
        series = self.series()
        if series is not None and self.needs_selection():
            self.set_family(select_families([series])[0])
        conv = (
            fit_convergence_many([series], families=[self._family])[0]
            if series is not None
            else None
        )
        obs = self.observations(prior)
        tput = fit_throughput_many([obs])[0] if obs is not None else None
        return self.assemble(conv, tput, prior)

    def _key(self, prior: Prior | None) -> tuple[int, int, ScalingParams | None]:
        """What the fit depends on.

        Of the prior, the fit reads only a measured scaling shape (``observations``); a
        prior rebuilt from a newer history with the same shape (new run times, say) does
        not make the fit stale.
        """
        shape = prior.scaling if prior is not None and prior.scaling_measured else None
        return (self._n_reports, self._n_costs, shape)

    @property
    def fitted(self) -> bool:
        return self._cache is not None

    @property
    def last_prior(self) -> Prior | None:
        """The prior of the latest fit (None before the first)."""
        return self._last_prior

    def stale(self, prior: Prior | None = None) -> bool:
        """True when reports (or the prior's measured shape) changed since the last fit."""
        return self._cache is None or self._cache_key != self._key(prior)

    @property
    def family(self) -> str:
        """The curve family chosen for this job (the default until it has enough points)."""
        return self._family

    def use_family(self, choice: str) -> None:
        """Fit ``choice`` (a name from ``FAMILIES``) or select per job (``AUTO``) from now
        on; a change refits at the next ``fit``."""
        if choice == self._family_choice:
            return
        self._family_choice = choice
        self._family = choice if choice in FAMILIES else DEFAULT_FAMILY
        self._family_at = None
        self._cache = None

    def needs_selection(self) -> bool:
        """True when the family should be re-selected (``AUTO`` only; see
        ``RESELECT_GROWTH``)."""
        if self._family_choice != AUTO or not self._k:
            return False
        at = self._family_at
        if at is None:
            return True
        span, n = at
        if n <= MIN_POINTS:  # nothing could be held out then: retry once more points exist
            return len(self._k) > n
        return self._k[-1] >= RESELECT_GROWTH * span

    def needs_curve(self) -> bool:
        """Whether a refit fits the convergence curve: not once the job has declared its
        step budget, since ``estimate_outlook`` then counts the remaining work from the
        budget and never reads the curve (which, with family selection, is most of a
        refit's cost)."""
        return self._total_steps is None

    def set_family(self, name: str) -> None:
        self._family = name
        self._family_at = (self._k[-1] if self._k else 0.0, len(self._k))

    def series(self) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """The metric history as handed to the curve fit, or None when empty."""
        if not self._k:
            return None
        return np.array(self._k), np.array(self._y), self._higher_is_better

    def assemble(
        self,
        conv: ConvergenceFit | None,
        tput: ThroughputFit | None,
        prior: Prior | None = None,
    ) -> JobFit:
        """Combine fits (made here or in a batch) with the rest of the state; caches it."""
        last = self._last
        window = PATIENCE_EPOCHS * self._per_epoch if self._per_epoch else None
        if self.overpromised and tput is not None:
            tput = dataclasses.replace(tput, flat_beyond=True)
        self._cache = JobFit(
            job_id=self.job_id,
            step=last.step if last else 0,
            time=last.time if last else 0.0,
            nodes=last.nodes if last else 0,
            n_reports=self._n_reports,
            convergence=conv,
            throughput=tput,
            total_steps=self._total_steps,
            target_metric=self._target,
            resize_cost_s=statistics.median(self._costs) if self._costs else None,
            progress=self._progress if last else None,
            step_factor=self._factor(last) if last else 1.0,
            window=window,
            converged_at=observed_convergence(
                self._k,
                self._y,
                higher_is_better=self._higher_is_better,
                window=window,
                target=self._target,
            )
            if conv is not None
            else None,
            stop_free=self._stop_free,
        )
        self._cache_key = self._key(prior)
        self._last_prior = prior
        return self._cache

    def throughput_points(self) -> tuple[tuple[int, float], ...]:
        """``(nodes, median reference steps/s)`` per size seen: for ``build_prior``."""
        return tuple((n, statistics.median(r)) for n, r in sorted(self._rates.items()))

    @property
    def last_step(self) -> int | None:
        return self._last.step if self._last is not None else None

    def observations(self, prior: Prior | None = None) -> Observations | None:
        """Per size: median recent rate, weight sqrt(count); plus the prior shape to use."""
        if not self._rates:
            return None
        sizes = sorted(self._rates)
        rates = [statistics.median(self._rates[s]) for s in sizes]
        weights = [math.sqrt(len(self._rates[s])) for s in sizes]
        if self._from_jobs:
            # A job's steps are its own word: it may claim any speed at a size it runs at,
            # but no speed-up beyond linear between two of them (data-parallel training
            # does not scale better than its node count), so no job looks better than one
            # that scales perfectly (docs/security.md).
            for i in range(1, len(sizes)):
                rates[i] = min(rates[i], rates[i - 1] * sizes[i] / sizes[i - 1])
        shape: ScalingParams | None = None
        if prior is not None and prior.scaling_measured:
            # History's shape, this job's level: scale to match the best-observed size.
            i = max(range(len(sizes)), key=weights.__getitem__)
            shape = prior.scaling.scaled(prior.scaling.throughput(sizes[i]) / max(rates[i], 1e-300))
        return sizes, rates, weights, shape


def _agrees(r: ProgressReport) -> bool:
    """The report's size is not disputed: no claim (simulator), or the job claims Slurm's."""
    return r.claimed_nodes is None or r.claimed_nodes == r.nodes


def _refit(batch: list[tuple[JobModel, Prior | None]]) -> None:
    """Refit the given jobs: curves in one vectorised solve per family (jobs that declared
    their step budget have none, see ``JobModel.needs_curve``), throughputs in another;
    jobs due for it get their family re-selected first (in one batch too)."""
    series = [(m, p, m.series() if m.needs_curve() else None) for m, p in batch]
    curves = [(m, s) for m, _, s in series if s is not None]
    due = [(m, s) for m, s in curves if m.needs_selection()]
    for (m, _), name in zip(due, select_families([s for _, s in due]), strict=True):
        m.set_family(name)
    convs = dict(
        zip(
            (m.job_id for m, _ in curves),
            fit_convergence_many([s for _, s in curves], families=[m.family for m, _ in curves]),
            strict=True,
        )
    )
    obs = [(m.job_id, m.observations(p)) for m, p in batch]
    rated = [(j, o) for j, o in obs if o is not None]
    tputs = dict(
        zip((j for j, _ in rated), fit_throughput_many([o for _, o in rated]), strict=True)
    )
    for m, p in batch:
        m.assemble(convs.get(m.job_id), tputs.get(m.job_id), p)


class ModelBank:
    """All jobs' models, keyed by job id (the daemon and the simulator hold one)."""

    def __init__(self, family: str = DEFAULT_FAMILY, check: GrowCheck = GrowCheck()) -> None:
        self._models: dict[int, JobModel] = {}
        self._family = family
        self.check = check  # for jobs seen from now on (``model.grow_*`` on SIGHUP)

    def model(self, job_id: int) -> JobModel:
        m = self._models.get(job_id)
        if m is None:
            m = self._models[job_id] = JobModel(job_id, self._family, self.check)
        return m

    def use_family(self, choice: str) -> None:
        """The curve family for every job, known and new (``model.curve_family``)."""
        self._family = choice
        for m in self._models.values():
            m.use_family(choice)

    def update(self, report: ProgressReport) -> tuple[str, ...]:
        return self.model(report.job_id).update(report)

    def record_resize(self, job_id: int, now: float, to_nodes: int) -> None:
        self.model(job_id).record_resize(now, to_nodes)

    def fit(self, job_id: int, prior: Prior | None = None) -> JobFit | None:
        """One job's fit.  When it is stale, every other stale job that was fitted before
        is refitted in the same batch (with the prior it was last given), so a caller that
        asks job by job still pays for one batched solve per cycle, not one per job.
        """
        m = self._models.get(job_id)
        if m is None:
            return None
        if m.stale(prior):
            batch = [(m, prior)] + [
                (o, o.last_prior)
                for o in self._models.values()
                if o is not m and o.fitted and o.stale(o.last_prior)
            ]
            _refit(batch)  # ``assemble`` leaves every fit in the batch current
        return m.fit(prior)

    def fit_all(self, priors: Mapping[int, Prior] | None = None) -> dict[int, JobFit]:
        """Fit every known job, refitting only stale ones, all in one batched solve.

        This is the daemon's per-cycle call (see ``scripts/bench_models.py``,
        ``fit_1000_jobs_s``).
        """
        priors = priors or {}
        _refit([(m, priors.get(j)) for j, m in self._models.items() if m.stale(priors.get(j))])
        return {j: m.fit(priors.get(j)) for j, m in self._models.items()}

    def forget(self, job_ids: Iterable[int]) -> None:
        for j in job_ids:
            self._models.pop(j, None)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._models

    def __len__(self) -> int:
        return len(self._models)


# --------------------------------------------------------------------------- pure estimate


def _finite_pos(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) and x >= 0.0 else None


def _prediction(fit: JobFit) -> ConvergencePrediction | None:
    """Where the job converges: where its reported metric already met the criterion, else
    where the fitted curve will (see ``convergence.observed_convergence`` for why the
    observation wins)."""
    assert fit.convergence is not None
    if fit.converged_at is not None:
        k = fit.converged_at
        mode = "target" if fit.target_metric is not None else "plateau"
        return ConvergencePrediction(k=k, lo=k, hi=k, mode=mode, reachable=True)
    return predict_convergence(
        fit.convergence, target=fit.target_metric, window=fit.window, threshold=THRESHOLD
    )


def _conv_confidence(fit: ConvergenceFit, pred: ConvergencePrediction, step: float) -> float:
    width = (pred.hi - pred.lo) / max(pred.k - min(step, pred.k) + 1.0, 1.0)
    conf = min(1.0, fit.n_points / CONV_FULL_POINTS) / (1.0 + width)
    return conf if pred.reachable else conf * 0.5


@dataclass(frozen=True, slots=True)
class OutlookBasis:
    """What a job's ``Outlook`` takes from its fit, prior and spec: everything but the
    progress made since the last report, the one input that moves with the clock.

    The daemon re-estimates every job every cycle, while a job's fit changes only when it
    reports and its prior only when the history does: ``Estimator`` keeps a job's basis
    until one of those changes and per cycle pays only for ``done`` and ``outlook``.
    """

    job_id: int
    current_nodes: int
    fit: JobFit | None
    nodes: tuple[int, ...]  # the allowed sizes, ascending
    speeds: tuple[float, ...]  # the speed at each
    run_rate: float  # speed at the current size (the reference size while pending)
    reported: bool
    base: float  # progress at the last report (0.0 unreported)
    extrapolates: bool  # still at the size of the last report: progress goes on at run_rate
    prior_total: float
    prior_conf: float
    tp_conf: float
    fitted: bool  # a throughput fit exists
    prediction: ConvergencePrediction | None  # read only without a step budget
    resize_cost_s: float
    # A resize restarts the script from its own last checkpoint, which the daemon cannot
    # see: a job that never reported (no library to hold at a step boundary) and declared
    # no cost of its own may redo all it has run (see ``outlook``).
    redoes_unseen_work: bool = False

    def done(self, now: float, elapsed_s: float | None) -> float:
        """Progress at ``now``: at the last report plus the steps made since at the current
        speed, for at most MAX_EXTRAPOLATION_S (a job that stopped reporting is not assumed
        to progress); unreported, ``elapsed_s`` at the current speed."""
        if self.reported:
            fit = self.fit
            assert fit is not None
            since = (
                min(max(now - fit.time, 0.0), MAX_EXTRAPOLATION_S) if math.isfinite(now) else 0.0
            )
            return self.base + (since * self.run_rate if self.extrapolates else 0.0)
        return (_finite_pos(elapsed_s) or 0.0) * self.run_rate

    def outlook(self, done: float, elapsed_s: float | None = None) -> Outlook:
        """The ``Outlook`` with ``done`` progress made (see ``done``).

        A job that ``redoes_unseen_work`` pays for a resize its restart plus ``elapsed_s``,
        all it has run: under the signal contract (``agent.stopping``) or a torchrun
        restart its script goes back to its own last checkpoint, at worst its start.  The
        policy then resizes it only where that is worth it; a declared ``resize_cost``
        (the user's word on what a restart costs them) replaces the bound.
        """
        fit, reported = self.fit, self.reported
        # Prior: the typical whole run, converted into this job's unit, minus what is done.
        floor = max(MIN_REMAINING_S * self.run_rate, MIN_REMAINING_FRACTION * done)
        prior_remaining = max(self.prior_total - done, floor)
        work, work_conf, source = prior_remaining, self.prior_conf, "prior"
        if fit is not None and fit.total_steps is not None:
            if reported:
                # The budget is in optimizer steps at the current batch: convert what is left.
                since_steps = (done - self.base) / fit.step_factor
                left = fit.total_steps - fit.step - since_steps
                work = max(left * fit.step_factor, 1.0)
            else:
                frac = max(1.0 - fit.step / fit.total_steps, MIN_REMAINING_FRACTION)
                work = max(frac * self.prior_total, floor)
            work_conf, source = (0.9 if reported else 0.4), "user"
        elif self.prediction is not None and fit is not None and fit.convergence is not None:
            pred = self.prediction
            conv_remaining = max(pred.k - done, floor)
            c = _conv_confidence(fit.convergence, pred, done)
            work = math.exp(c * math.log(conv_remaining) + (1 - c) * math.log(prior_remaining))
            work_conf, source = max(c, work_conf), "fitted"
        if self.fitted and source == "prior":
            source = "fitted"

        work = work if math.isfinite(work) and work > 0 else max(floor, 1.0)
        return Outlook(
            job_id=self.job_id,
            current_nodes=max(self.current_nodes, 0),
            # map with positional fields: ~30% less than a generator of keyword calls
            sizes=tuple(
                map(SizeEstimate, self.nodes, self.speeds, [work / f for f in self.speeds])
            ),
            remaining_work=work,
            resize_cost_s=self.resize_cost_s
            + ((_finite_pos(elapsed_s) or 0.0) if self.redoes_unseen_work else 0.0),
            confidence=round(0.5 * work_conf + 0.5 * self.tp_conf, 3),
            source=source,
        )


def outlook_basis(
    *,
    job_id: int,
    spec: ElasticSpec,
    current_nodes: int,
    fit: JobFit | None,
    prior: Prior,
    default_resize_cost_s: float,
) -> OutlookBasis:
    """The time-independent part of ``estimate_outlook`` (pure, see ``OutlookBasis``)."""
    sizes = spec.allowed_sizes or (max(spec.min_nodes, 1),)
    tput = fit.throughput if fit is not None else None
    model: ThroughputFit | ScalingParams = tput if tput is not None else prior.scaling
    if tput is not None:
        unit_real, tp_conf = True, tput.confidence
    elif prior.scaling_measured:
        unit_real, tp_conf = True, 0.3
    else:
        unit_real, tp_conf = False, 0.0
    run_nodes = current_nodes if current_nodes > 0 else prior.reference_nodes
    reported = fit is not None and fit.n_reports > 0 and unit_real
    if unit_real and prior.total_steps is not None and prior.scaling_measured:
        prior_total = prior.total_steps
    else:
        prior_total = prior.runtime_s * model.throughput(prior.reference_nodes)
    # Measured beats the user's estimate beats the configured default; 0.0 is a valid
    # measurement (a restart that cost nothing), so test for None, not truth.
    candidates = (fit.resize_cost_s if fit is not None else None, spec.resize_cost_s)
    cost = next(
        (c for c in map(_finite_pos, (*candidates, default_resize_cost_s)) if c is not None),
        0.0,
    )
    prediction = None
    if reported and fit is not None and fit.total_steps is None and fit.convergence is not None:
        prediction = _prediction(fit)
    nodes = tuple(sorted(set(sizes)))
    return OutlookBasis(
        job_id=job_id,
        current_nodes=current_nodes,
        fit=fit,
        nodes=nodes,
        speeds=tuple(model.throughput(n) for n in nodes),
        run_rate=model.throughput(run_nodes),
        reported=reported,
        base=(
            (fit.progress if fit.progress is not None else float(fit.step))
            if reported and fit is not None
            else 0.0
        ),
        extrapolates=fit is not None and current_nodes == fit.nodes,
        prior_total=prior_total,
        prior_conf=0.3 if prior.source == "history" else 0.0,
        tp_conf=tp_conf,
        fitted=tput is not None,
        prediction=prediction,
        resize_cost_s=cost,
        redoes_unseen_work=(fit is None or fit.n_reports == 0)
        and spec.resize_cost_s is None
        and (fit is None or fit.resize_cost_s is None),
    )


def estimate_outlook(
    *,
    job_id: int,
    spec: ElasticSpec,
    current_nodes: int,
    fit: JobFit | None,
    prior: Prior,
    now: float,
    default_resize_cost_s: float,
    elapsed_s: float | None = None,
) -> Outlook:
    """Build the ``Outlook`` of one job (pure: everything it needs is passed in).

    ``elapsed_s`` is how long the job has run (used only while it has not reported);
    ``now`` extrapolates progress since the last report (bounded).
    """
    basis = outlook_basis(
        job_id=job_id,
        spec=spec,
        current_nodes=current_nodes,
        fit=fit,
        prior=prior,
        default_resize_cost_s=default_resize_cost_s,
    )
    return basis.outlook(basis.done(now, elapsed_s), elapsed_s)


def progress_over(outlook: Outlook, nodes: int, horizon_s: float) -> float:
    """Steps made within ``horizon_s`` at ``nodes``, counting a resize's lost time.

    Returns 0.0 for a size the outlook does not cover.  Finishing early stops the count.
    """
    est = outlook.at(nodes)
    if est is None or horizon_s <= 0:
        return 0.0
    lost = outlook.resize_cost_s if nodes != outlook.current_nodes else 0.0
    useful = max(0.0, min(horizon_s - lost, est.remaining_s))
    return useful * est.throughput


def marginal_progress(outlook: Outlook, horizon_s: float) -> dict[int, float]:
    """Per allowed size: progress over the horizon gained per node vs the next smaller size.

    The first allowed size is compared with staying pending (no progress).  This is
    Optimus' marginal gain per added node, the quantity a greedy allocator ranks.  When
    both sizes finish within the horizon the gain is 0: compare ``remaining_s`` instead.
    """
    out: dict[int, float] = {}
    prev_n, prev_p = 0, 0.0
    for est in outlook.sizes:
        p = progress_over(outlook, est.nodes, horizon_s)
        out[est.nodes] = (p - prev_p) / max(est.nodes - prev_n, 1)
        prev_n, prev_p = est.nodes, p
    return out
