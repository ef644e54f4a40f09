"""Prometheus metrics of the daemon (prefix ``slurm_elastic_``), in a registry of its own.

A private ``CollectorRegistry`` keeps tests and several daemons in one process independent
and keeps the default process collectors' names out of our namespace.  The loop records one
completed (or failed) cycle at a time; the API counts reports, acks and auth failures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "slurm_elastic"

# Cycles normally take tens of milliseconds; a slow solver or Slurm pushes them to seconds.
_CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A reclaim waits one cycle plus the borrowers' checkpoint (at most guards.ack_timeout_s).
_RECLAIM_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class DaemonMetrics:
    """The daemon's Prometheus metrics, in a registry of its own (``/metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cycles = Counter(
            f"{PREFIX}_cycles", "Control cycles run, by outcome", ["outcome"], registry=r
        )
        self.cycle_seconds = Histogram(
            f"{PREFIX}_cycle_seconds", "Wall time of one cycle", buckets=_CYCLE_BUCKETS, registry=r
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Errors met by the loop, by kind (exception class)",
            ["kind"],
            registry=r,
        )
        self.last_cycle_timestamp = Gauge(
            f"{PREFIX}_last_cycle_timestamp_seconds",
            "When the last cycle that completed without error finished",
            registry=r,
        )
        self.jobs = Gauge(
            f"{PREFIX}_jobs", "Jobs in the latest snapshot, by state", ["state"], registry=r
        )
        self.elastic_jobs = Gauge(
            f"{PREFIX}_elastic_jobs", "Jobs marked elastic in the latest snapshot", registry=r
        )
        self.resizes = Counter(
            f"{PREFIX}_resizes", "Resize actions applied, by kind", ["kind"], registry=r
        )
        self.slurm_calls = Counter(f"{PREFIX}_slurm_calls", "Slurm client calls made", registry=r)
        self.slurm_calls_last_cycle = Gauge(
            f"{PREFIX}_slurm_calls_last_cycle", "Slurm client calls in the last cycle", registry=r
        )
        self.plan_objective = Gauge(
            f"{PREFIX}_plan_objective", "Objective value of the latest plan", registry=r
        )
        self.plan_solve_seconds = Gauge(
            f"{PREFIX}_plan_solve_seconds", "Solver time of the latest plan", registry=r
        )
        self.reports = Counter(
            f"{PREFIX}_reports", "Progress reports accepted from jobs", registry=r
        )
        self.acks = Counter(
            f"{PREFIX}_acks",
            "Instruction acknowledgements accepted, by status",
            ["status"],
            registry=r,
        )
        self.auth_failures = Counter(
            f"{PREFIX}_auth_failures",
            "Reports/acks refused (401/403), by reason",
            ["reason"],
            registry=r,
        )
        self.nodes_on_loan = Gauge(
            f"{PREFIX}_nodes_on_loan",
            "Nodes elastic jobs hold above their entitlement (policy.reclaim)",
            registry=r,
        )
        self.reclaims = Counter(
            f"{PREFIX}_reclaims", "Loans given back to a pending job (shrinks applied)", registry=r
        )
        self.reclaim_seconds = Histogram(
            f"{PREFIX}_reclaim_seconds",
            "From the cycle that planned a reclaim to the one that freed the nodes",
            buckets=_RECLAIM_BUCKETS,
            registry=r,
        )
        self._known_states: set[str] = set()

    def record_cycle(
        self,
        *,
        ok: bool,
        duration_s: float,
        finished_at: float,
        slurm_calls: int = 0,
        jobs_by_state: Mapping[str, int] | None = None,
        elastic_jobs: int | None = None,
        applied_kinds: Iterable[str] = (),
        plan_objective: float | None = None,
        plan_solve_s: float | None = None,
        error_kind: str | None = None,
        nodes_on_loan: int | None = None,
        reclaim_seconds: Iterable[float] = (),
    ) -> None:
        self.cycles.labels(outcome="ok" if ok else "error").inc()
        self.cycle_seconds.observe(duration_s)
        self.slurm_calls.inc(slurm_calls)
        self.slurm_calls_last_cycle.set(slurm_calls)
        if not ok:
            self.errors.labels(kind=error_kind or "unknown").inc()
            return
        self.last_cycle_timestamp.set(finished_at)
        if jobs_by_state is not None:
            # A state that emptied must read 0, not keep its last value.
            for state in self._known_states - set(jobs_by_state):
                self.jobs.labels(state=state).set(0)
            for state, count in jobs_by_state.items():
                self.jobs.labels(state=state).set(count)
            self._known_states |= set(jobs_by_state)
        if elastic_jobs is not None:
            self.elastic_jobs.set(elastic_jobs)
        for kind in applied_kinds:
            self.resizes.labels(kind=kind).inc()
        if plan_objective is not None:
            self.plan_objective.set(plan_objective)
        if plan_solve_s is not None:
            self.plan_solve_seconds.set(plan_solve_s)
        if nodes_on_loan is not None:
            self.nodes_on_loan.set(nodes_on_loan)
        for seconds in reclaim_seconds:
            self.reclaims.inc()
            self.reclaim_seconds.observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
