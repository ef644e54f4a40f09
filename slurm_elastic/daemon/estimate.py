"""Estimate step of the cycle: reports + sacct history -> one ``Outlook`` per elastic job.

Glue between the controller and ``slurm_elastic.model``: it feeds each new progress
report to the job's model once, builds the job's prior from similar finished jobs in
the sacct history (cached until the history is read again), and calls the pure
``estimate_outlook``.  A model failure on one job costs that job its outlook (the
problem then holds it rigid), never the cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.daemon.placement import REFERENCE_SPEED, at_speed, own_partition, speed_of
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.model.outlook import GrowCheck, JobFit, ModelBank, OutlookBasis, outlook_basis
from slurm_elastic.model.priors import HistoryIndex, Prior, prior_from_similar
from slurm_elastic.types import ElasticSpec, JobHistory, Outlook, ProgressReport

log = structlog.get_logger("slurm_elastic.estimate")


@dataclass(slots=True)
class _Estimated:
    """A job's last estimate: the inputs of its basis (its fit and current size are the
    basis's own), the basis, and the outlook at the last ``done``.  ``estimate_outlook`` is
    pure, so the same inputs give the same basis and the same basis at the same ``done`` the
    same outlook."""

    prior: Prior
    spec: ElasticSpec
    default_cost: float
    basis: OutlookBasis
    done: float | None = None
    outlook: Outlook | None = None

    def holds(
        self, fit: JobFit | None, prior: Prior, spec: ElasticSpec, nodes: int, cost: float
    ) -> bool:
        # The fit is the bank's cached object until the job reports (a refit always makes a
        # new one); a prior rebuilt from a changed history is often equal to the old one.
        basis = self.basis
        return (
            fit is basis.fit
            and nodes == basis.current_nodes
            and cost == self.default_cost
            and (prior is self.prior or prior == self.prior)
            and (spec is self.spec or spec == self.spec)
        )


class Estimator:
    """Reports and accounting history in, one ``Outlook`` per elastic job out (per cycle).

    State it keeps, per job (``forget`` drops a job's):

    * what was fed to the job's model (``_fed_until``, ``_seen``): each report reaches
      ``ModelBank`` once, and a job whose newest report is unchanged is not looked at;
    * the fit, inside ``ModelBank`` (``JobModel``): kept until the job reports again, a
      resize cost is measured, or the prior's measured scaling shape changes;
    * the prior (``_priors``): built from the history, at the job's size then, in its first
      cycle after an accounting read, and kept until the next read (``history_changed``);
    * the last estimate (``_estimated``): the job's ``OutlookBasis``, kept while its fit
      object, size, prior, spec and default resize cost are the same, and the outlook of
      that basis at the last ``done`` (the same ``done`` gives the same outlook).

    Each is one cache of one thing, and each rule follows from the purity of what it
    caches (``prior_from_similar``, ``outlook_basis``, ``OutlookBasis.outlook``).

    GPU speeds (``daemon.placement``): each outlook is priced in the job's own partition
    (``own_partition``).  A job's reports were measured where it ran, at that partition's
    speed (``_reported_in``, noted when they are fed); a prior is brought to the reference
    speed (each similar job's run time times the speed of the partition it ran in); the
    outlook is moved from that basis to its own partition's speed.  Priors are rebuilt when
    the speeds change.  A job requeued into a partition of another speed mixes two speeds in
    one fit until its new reports outnumber the old (requeues across types are rare, and the
    daemon never plans one).
    """

    def __init__(
        self,
        reports: ReportStore,
        default_resize_cost_s: float,
        curve_family: str = "exp",
        grow_check: GrowCheck | None = None,
        stop_free_resize_cost_s: float | None = None,
    ) -> None:
        self.reports = reports
        self.default_resize_cost_s = default_resize_cost_s
        # A job that says it resizes stop-free (its reports' mode) before one is measured.
        self.stop_free_resize_cost_s = (
            default_resize_cost_s if stop_free_resize_cost_s is None else stop_free_resize_cost_s
        )
        self.bank = ModelBank(curve_family, grow_check or GrowCheck())
        self._fed_until: dict[int, float] = {}  # per job: time of the last report fed
        # Per job, the newest report at the last look: while it is still the newest,
        # nothing arrived and the job's stored reports need no new pass.
        self._seen: dict[int, ProgressReport] = {}
        # Per job, its prior: built on first use after an accounting read and kept until
        # the next one (``history_changed`` clears it).
        self._priors: dict[int, Prior] = {}
        self._index = HistoryIndex()  # the controller's sacct history, kept in step
        # Per job, its last estimate: most jobs neither report nor change size or prior
        # between two cycles, so their basis is reused, and a job whose progress is not
        # extrapolated (pending, or silent for MAX_EXTRAPOLATION_S) gets the same outlook.
        self._estimated: dict[int, _Estimated] = {}
        # Partition -> relative GPU speed, as of the last cycle (priors are normalised by it).
        self._speeds: Mapping[str, float] = {}
        # Per job, the partition it ran in when its reports were fed: its speed there (as
        # configured now) is the speed its measurements were made at.
        self._reported_in: dict[int, str] = {}

    def history_changed(self, records: Iterable[JobHistory], removed: Iterable[int]) -> None:
        """An accounting read: ``records`` read, ``removed`` aged out.  Priors are rebuilt
        on next use."""
        self._index.update(records, removed)
        self._priors.clear()

    def resized(self, job_id: int, now: float, to_nodes: int) -> None:
        self.bank.record_resize(job_id, now, to_nodes)

    def forget(self, job_ids: Iterable[int]) -> None:
        ids = list(job_ids)
        self.bank.forget(ids)
        for job_id in ids:
            self._fed_until.pop(job_id, None)
            self._seen.pop(job_id, None)
            self._priors.pop(job_id, None)
            self._estimated.pop(job_id, None)
            self._reported_in.pop(job_id, None)

    def known_jobs(self) -> tuple[int, ...]:
        return tuple(self._fed_until)

    def measured_rates(self, job_id: int) -> tuple[tuple[int, float], ...]:
        """``(nodes, steps/s)`` per size the job reported at: the rates its model measured
        (median per size; steps at the job's first global batch).  Empty when none."""
        return self.bank.model(job_id).throughput_points() if job_id in self.bank else ()

    def outlooks(
        self,
        elastic: Mapping[int, ElasticJob],
        now: float,
        speeds: Mapping[str, float] | None = None,
    ) -> dict[int, Outlook]:
        """One pass per cycle: feed each job's new reports and find its prior, refit every
        stale job in one batched solve (``ModelBank.fit_all``; ~2x less estimate time than
        job-by-job fits when dozens of jobs report between cycles), then estimate each job
        from the fit cache.  A model bug on one job drops that job only, never the cycle.

        ``speeds``: partition -> relative GPU speed (``placement.partition_speeds``); each
        outlook is priced in the job's own partition (class docstring).  None: all alike."""
        speeds = speeds or {}
        if speeds != self._speeds:
            self._speeds = dict(speeds)
            self._priors.clear()
        priors: dict[int, Prior] = {}
        for job_id, ej in elastic.items():
            try:
                priors[job_id] = self._feed(ej)
            except Exception as exc:
                log.exception("estimate.failed", job_id=job_id, error=str(exc))
        fits: Mapping[int, JobFit] | None = None
        try:
            fits = self.bank.fit_all(self._priors)
        except Exception as exc:  # the per-job fits below still isolate each job
            log.exception("estimate.batch_failed", error=str(exc))
        result: dict[int, Outlook] = {}
        for job_id, prior in priors.items():
            try:
                result[job_id] = self._estimate(elastic[job_id], prior, now, fits)
            except Exception as exc:
                log.exception("estimate.failed", job_id=job_id, error=str(exc))
        return result

    def _feed(self, ej: ElasticJob) -> Prior:
        job = ej.job
        fed = self._fed_until.get(job.job_id, float("-inf"))
        latest = self.reports.latest(job.job_id)
        if latest is not None and latest is not self._seen.get(job.job_id):
            for report in self.reports.history(job.job_id):
                if report.time > fed:
                    self.bank.update(report)
                    fed = report.time
            self._seen[job.job_id] = latest
            if job.is_running:
                self._reported_in[job.job_id] = job.partition
        self._fed_until[job.job_id] = fed
        prior = self._priors.get(job.job_id)
        if prior is None:
            nodes = max(ej.spec.min_nodes, job.node_count)
            similar = self._index.similar(job.user, job.name, job.work_dir)
            prior = self._priors[job.job_id] = prior_from_similar(
                similar, nodes, speed=self._history_speed if self._speeds else None
            )
        return prior

    def _estimate(
        self, ej: ElasticJob, prior: Prior, now: float, fits: Mapping[int, JobFit] | None
    ) -> Outlook:
        """``estimate_outlook`` of the job, from its last basis while that still holds.

        ``fits``: this cycle's ``fit_all`` (every job's current fit under the prior it was
        given, which is ``prior``), or None when it failed: the job is then fitted alone."""
        job = ej.job
        spec = ej.spec
        elapsed = now - job.start_time if job.is_running and job.start_time is not None else None
        fit = fits.get(job.job_id) if fits is not None else self.bank.fit(job.job_id, prior)
        nodes = ej.effective_nodes
        stop_free = fit is not None and fit.stop_free
        default = self.stop_free_resize_cost_s if stop_free else self.default_resize_cost_s
        cost = spec.resize_cost_s or default
        last = self._estimated.get(job.job_id)
        if last is None or not last.holds(fit, prior, spec, nodes, cost):
            basis = outlook_basis(
                job_id=job.job_id,
                spec=spec,
                current_nodes=nodes,
                fit=fit,
                prior=prior,
                default_resize_cost_s=cost,
            )
            last = self._estimated[job.job_id] = _Estimated(prior, spec, cost, basis)
        done = last.basis.done(now, elapsed)
        if last.outlook is None or done != last.done:
            last.done, last.outlook = done, last.basis.outlook(done, elapsed)
        if not self._speeds:
            return last.outlook
        reported = fit is not None and fit.n_reports > 0
        where = self._reported_in.get(job.job_id)
        source = speed_of(self._speeds, where) if reported and where else REFERENCE_SPEED
        return at_speed(last.outlook, speed_of(self._speeds, own_partition(job)) / source)

    def _history_speed(self, record: JobHistory) -> float:
        return speed_of(self._speeds, record.partition)
