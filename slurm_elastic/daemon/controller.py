"""The control loop's one cycle: observe -> estimate -> decide -> actuate -> result.

``Controller.run_once(now)`` is the single implementation of a cycle: the daemon's
service loop calls it every ``interval_s`` against the real Slurm (CLI backend) and the
simulator calls it against its simulated backend.  It never reads the clock for
decisions: ``now`` is passed in (``duration_s`` alone is measured, for the operator).

One cycle:

1. observe — ``backend.read_cluster(now)`` (a fixed number of Slurm reads whatever the
   job count), plus ``read_history`` every ``slurm.sacct_interval_s``, incrementally;
   with the QOS and association per-job node limits (``sacctmgr``, two calls) after each
   good history read;
   a failed read or a snapshot older than ``guards.stale_snapshot_s`` ends the cycle
   with ``ok=False`` and no action;
2. on the first good snapshot, the journal is reconciled with Slurm (crash recovery);
3. classify jobs (elastic / companion / rigid), advance graceful shrinks in flight,
   ``scontrol reconfigure`` once a job we shrank has ended (Slurm 22.05's node leak;
   ``slurm.reconfigure_after_shrink``), freeze jobs inside cooldown, dwell or with an
   action in flight, and leave pending jobs Slurm cannot start now (held, dependency,
   begin time, reservation) out of the plan;
4. estimate an ``Outlook`` per elastic job, build the ``AllocationProblem``, allocate;
5. diff plan against reality, apply the guard rails, and (mode ``enforce``) apply the
   surviving actions journal-first; mode ``shadow`` records what it would have done.
   A plan whose grows counted on a shrink that a guard blocked is made again with that
   job held at its size (``Controller._plan``).
"""

from __future__ import annotations

import dataclasses
import functools
import grp
import heapq
import math
import os
import pwd
import time
from collections.abc import Callable, Mapping

import structlog

from slurm_elastic.actuate.diff import (
    companion_cleanup,
    diff,
    last_planned_size,
    narrowed_from,
)
from slurm_elastic.actuate.executor import ActionRecord, Executor
from slurm_elastic.actuate.guards import (
    GuardKnobs,
    block_reason,
    busy_reason,
    dwell_reason,
    grow_retry_reason,
    limit_resizes,
    refusal_bars,
    retry_bars,
    stepmgr_bars,
)
from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import JournalStore
from slurm_elastic.cluster_state import (
    Classification,
    classify,
    not_eligible,
    partition_gpu_types,
    with_partitions,
)
from slurm_elastic.config import Config
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.placement import partition_speeds
from slurm_elastic.daemon.problem import (
    Placing,
    access_rule,
    build_problem,
    job_capacity,
    loans,
    partition_capacity,
)
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.result import CycleResult, JobStatusRow, Reclaim, RowInputs
from slurm_elastic.errors import SlurmElasticError, SlurmError, StateError
from slurm_elastic.marker import cap_spec, resolve_spec
from slurm_elastic.model.outlook import GrowCheck
from slurm_elastic.policy.registry import DEFAULT_FALLBACK
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import (
    Action,
    ActionKind,
    ActionOutcome,
    AllocationProblem,
    Capabilities,
    ClusterSnapshot,
    CycleErrorKind,
    Decision,
    ElasticSpec,
    Explanation,
    JobHistory,
    JobView,
    Outlook,
    Plan,
    SolverStatus,
)

__all__ = ["Controller", "CycleResult", "JobStatusRow", "keep_current_plan"]

log = structlog.get_logger("slurm_elastic.controller")

Allocate = Callable[[AllocationProblem, str], Plan]

# Plans made in one cycle when guards block shrinks that a plan's grows counted on
# (Controller._plan): the first, and at most two more with those jobs held.
MAX_PLANS_PER_CYCLE = 3
# How often the journal drops closed rows older than the accounting look-back: at the first
# cycle (after reconciling) and every hour after, so a daemon that runs for months keeps a
# bounded file, not every action since its last restart.
JOURNAL_PRUNE_EVERY_S = 3600.0
# Actions that take nodes (a plan may have found them in a shrink).
_TAKES_NODES = frozenset({ActionKind.GROW, ActionKind.START_AT_SIZE})


class Controller:
    """One daemon's decisions: ``run_once(now)`` runs a whole cycle (module docstring).

    ``allocate(problem, policy)`` replaces the configured policy chain (tests, drills);
    ``reconfigure(config)`` takes a new config between cycles.  The controller keeps what
    it learns across cycles (accounting history, limits, model state) and is not
    thread-safe: one caller runs cycles; the API thread reads ``size_of`` only.
    """

    def __init__(
        self,
        backend: SlurmBackend,
        config: Config,
        *,
        reports: ReportStore,
        journal: JournalStore,
        agents: InstructionBoard,
        allocate: Allocate | None = None,
    ) -> None:
        self.backend = backend
        self.reports = reports
        self.journal = journal
        self.agents = agents
        # The configured chain is read at each call: SIGHUP may swap ``self.config``.
        self._allocate = allocate or (
            lambda problem, policy: _policy_allocate(
                problem, policy, fallback=self.config.policy.fallback
            )
        )
        self.estimator = Estimator(
            reports,
            config.model.default_resize_cost_s,
            config.model.curve_family,
            _grow_check(config),
            stop_free_resize_cost_s=config.model.stop_free_resize_cost_s,
        )
        self._reconciled = False
        self._pruned_at = -math.inf
        self._sizes: dict[int, int] = {}  # effective size of each running elastic job
        self._history: dict[int, JobHistory] = {}
        # (end_time, job_id) of every record read with an end, oldest first: the records
        # that age out of the lookback are at its top, so a read does not scan them all.
        self._ending: list[tuple[float, int]] = []
        self._history_until: float | None = None
        self._history_retry_at = float("-inf")
        # QOS -> per-job node limit, and (account, user, partition) -> an association's,
        # read with the history (limits change rarely); each kept when its read fails.
        self._qos_nodes: dict[str, int] = {}
        self._assoc_nodes: dict[tuple[str, str, str], int] = {}
        # user -> groups (the host's user database, LDAP at many sites), asked only for a
        # partition with AllowGroups and forgotten every slurm.sacct_interval_s, when the
        # limits are re-read: membership changes as rarely, and a lookup per cycle could
        # stall on a slow directory.  Its own clock: a failing sacct must not freeze it.
        self._groups: dict[str, frozenset[str]] = {}
        self._groups_since = -math.inf
        self.last_result: CycleResult | None = None
        self._capabilities: Capabilities | None = None  # probed on first need, then kept
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Take a new config (SIGHUP) between cycles."""
        self.config = config
        self.knobs = GuardKnobs.from_config(config)
        self.estimator.default_resize_cost_s = config.model.default_resize_cost_s
        self.estimator.stop_free_resize_cost_s = config.model.stop_free_resize_cost_s
        self.estimator.bank.use_family(config.model.curve_family)
        self.estimator.bank.check = _grow_check(config)
        self.executor = Executor(
            self.backend,
            self.journal,
            self.agents,
            self.knobs,
            agent_command=config.grow.agent_command,
        )

    @property
    def history(self) -> Mapping[int, JobHistory]:
        return self._history

    def size_of(self, job_id: int) -> int | None:
        """The job's size (its nodes plus its running companions') as of the last cycle,
        None unless it was a running elastic job then.  Read by the API thread: the mapping
        is replaced whole each cycle, never changed in place."""
        return self._sizes.get(job_id)

    # ------------------------------------------------------------------ one cycle

    def run_once(self, now: float) -> CycleResult:
        """One cycle at time ``now``.

        A cycle that cannot be done safely is a result, not an exception: a failed Slurm
        read, a stale snapshot or any other ``SlurmElasticError`` gives ``ok=False`` with
        ``error`` (``"<kind>: <detail>"``, ``error_kind``) and no action taken; a Slurm
        failure of one action is that action's ``failed`` outcome.

        Raises:
            StateError: the journal cannot be written or trusted: the service stops, since
                it never acts on what it cannot write down first.

        Any other exception is a bug; the service logs it and counts the cycle failed.
        """
        started = time.perf_counter()
        try:
            snapshot = self.backend.read_cluster(now)
        except SlurmError as exc:
            return self._failed(now, started, CycleErrorKind.OBSERVE, str(exc), None, 0)
        age = now - snapshot.taken_at
        if age > self.knobs.stale_snapshot_s:
            why = f"{age:.0f}s old > {self.knobs.stale_snapshot_s:.0f}s"
            stale = CycleErrorKind.STALE_SNAPSHOT
            return self._failed(now, started, stale, why, age, snapshot.slurm_calls)
        done_here: frozenset[int] = frozenset()
        if not self._reconciled:
            report = self.executor.reconcile(snapshot)
            done_here = frozenset(report.cancelled)  # this snapshot predates their cancel
            self._reconciled = True
        if now - self._pruned_at >= JOURNAL_PRUNE_EVERY_S:
            # Bounded: closed rows older than the accounting look-back serve nothing, unless
            # their job is still in Slurm, whose guards read them (cooldown, dwell, refusals,
            # a requeued job's last size) however short the look-back is set.
            alive = {job.job_id for job in snapshot.jobs if job.state.is_active}
            self.journal.prune(now - self.config.slurm.sacct_lookback_s, alive)
            self._pruned_at = now
        history_calls = self._refresh_history(now)
        if now - self._groups_since >= self.config.slurm.sacct_interval_s:
            self._groups.clear()
            self._groups_since = now
        try:
            result = self._cycle(snapshot, now, started, history_calls, done_here)
        except StateError:
            raise  # the journal failed: not one failed cycle, the end of the service
        except SlurmElasticError as exc:
            kind = CycleErrorKind.CYCLE
            return self._failed(now, started, kind, str(exc), age, snapshot.slurm_calls)
        self.last_result = result
        log.info(
            "cycle.done",
            ok=True,
            duration_s=round(result.duration_s, 4),
            slurm_calls=result.slurm_calls,
            jobs=result.job_count,
            actions=len(result.actions),
            applied=len(result.applied),
            mode=result.mode,
        )
        return result

    def _cycle(
        self,
        snapshot: ClusterSnapshot,
        now: float,
        started: float,
        history_calls: int,
        cancelled: frozenset[int],
    ) -> CycleResult:
        known = self.journal.known_specs()
        in_partition = partition_capacity(snapshot, self._qos_nodes, self._assoc_nodes)
        cls = classify(
            snapshot,
            functools.partial(
                _resolve_spec,
                known=known,
                capacity=job_capacity(
                    snapshot, self._qos_nodes, self._assoc_nodes, in_partition=in_partition
                ),
            ),
            self.config.partitions.allows,
            # Which jobs are companions, and whose: the journal's links (it submitted them),
            # never a comment their owner can change after submission.
            {link.companion_id: link.parent_id for link in self.journal.companions()},
        )
        self.journal.remember_specs(
            {j: ej.spec for j, ej in cls.elastic.items() if j not in known}, now
        )
        self._forget_ended(cls, known)
        self._note_size_changes(cls, now)

        records = self.executor.advance_shrinks(cls.elastic, now)
        records += self.executor.note_companion_ends(cls, snapshot, now)
        records += self._reconfigure_after_shrinks(cls, now)
        in_flight = self.executor.in_flight()
        last_resize = self.journal.last_resize_at(cls.elastic)
        frozen: dict[int, str] = {}
        for rec in records:
            if rec.outcome is not ActionOutcome.WAITING:
                # This snapshot predates what was just done to the job: leave it alone.
                frozen[rec.action.job_id] = f"shrink {rec.outcome} this cycle"
        # Held / dependency / begin-time jobs get no capacity (build_problem leaves them
        # out); as "frozen" they are not acted on and their REASON says why.
        waiting = not_eligible(cls, now, self.config.guards.payback_horizon_s)
        for job_id, reason in waiting.items():
            frozen.setdefault(job_id, reason)
        # What Slurm refused stays refused (for a while, while the job stays as it was),
        # what Slurm said "not now" to waits out its backoff, and what Slurm would do wrong
        # is not asked: a pin keeps the job as Slurm has it (frozen), a shrink leaves the
        # job only the sizes at or above its own; a grow or a cancel is only blocked.
        bars = (
            retry_bars(self.journal.retries(), self.knobs, now)
            | stepmgr_bars(cls.elastic)
            | refusal_bars(self.journal.refusals(), cls.elastic, now, self.knobs.refusal_hold_s)
        )
        no_shrink: dict[int, str] = {}
        for (job_id, kind), refused in bars.items():
            if kind is ActionKind.START_AT_SIZE:
                frozen.setdefault(job_id, refused)
            elif kind is ActionKind.SHRINK:
                no_shrink[job_id] = refused
        yielding: set[int] = set()  # frozen by dwell or cooldown only: a loan still yields
        for job_id, ej in cls.elastic.items():
            if job_id in frozen:
                continue
            why = busy_reason(ej, in_flight.get(job_id))
            if not why:
                why = dwell_reason(ej, self.knobs, now, last_resize.get(job_id))
                if why:
                    yielding.add(job_id)
            if why:
                frozen[job_id] = why

        gpu_speeds = self.config.cluster.gpu_speeds
        speeds = (
            partition_speeds(
                partition_gpu_types(snapshot, self.config.cluster.gpu_types), gpu_speeds
            )
            if gpu_speeds
            else {}
        )
        placing = Placing(
            speeds,
            in_partition,
            access_rule(snapshot, self._groups_of),
            choose=self.config.policy.placement == "plan",
        )
        narrowed, overdue = self._narrowed(cls, snapshot, placing, now)
        outlooks = self.estimator.outlooks(with_partitions(cls, narrowed).elastic, now, speeds)
        cleanup = [
            a
            for a in companion_cleanup(
                cls,
                now,
                self.config.grow.companion_pending_timeout_s,
                self.config.grow.orphan_grace_s,
            )
            if a.job_id not in cancelled
        ]
        housekeeping, blocked = self._screen(cleanup, cls, outlooks, now, bars)
        plan, allowed, not_allowed = self._plan(
            snapshot,
            cls,
            outlooks,
            frozen,
            waiting,
            now,
            frozenset(yielding),
            bars,
            placing,
            narrowed,
            overdue,
        )
        records += blocked + not_allowed
        taken, deferred = limit_resizes(housekeeping + allowed, self.knobs.max_resizes_per_cycle)
        records += [
            ActionRecord(a, ActionOutcome.DEFERRED, "max_resizes_per_cycle") for a in deferred
        ]
        for action in taken:
            if self.knobs.enforce:
                records.append(self.executor.apply(action, cls.elastic, now))
            else:
                records.append(
                    ActionRecord(action, ActionOutcome.SHADOW, "shadow mode: not applied")
                )

        on_loan = loans(cls, self.config.policy.reclaim)
        return CycleResult(
            now=now,
            ok=True,
            error=None,
            duration_s=time.perf_counter() - started,
            slurm_calls=snapshot.slurm_calls,
            history_calls=history_calls,
            snapshot_age_s=now - snapshot.taken_at,
            mode=self.config.mode,
            plan=plan,
            actions=tuple(records),
            # A job that may not shrink is not frozen, but its REASON says why when the plan
            # leaves it as it is.
            rows_from=RowInputs(cls, {**no_shrink, **frozen}, on_loan),
            explanations={d.job_id: d.explanation for d in plan.decisions},
            reclaims=tuple(r for rec in records if (r := self._reclaim_done(rec, now))),
            nodes_on_loan=sum(on_loan.values()),
            gpu_types_from=(snapshot, self.config.cluster.gpu_types),
        )

    # ------------------------------------------------------------------ steps

    def _reclaim_done(self, record: ActionRecord, now: float) -> Reclaim | None:
        """The reclaim an applied shrink completed, timed from its journal entry."""
        action = record.action
        waiting = dict(action.extra).get("reclaim_for")
        if action.kind is not ActionKind.SHRINK or record.outcome is not ActionOutcome.APPLIED:
            return None
        if waiting is None:
            return None
        entry = None if record.action_id is None else self.journal.get(record.action_id)
        return Reclaim(
            borrower=action.job_id,
            waiting_job=int(waiting),
            nodes=action.from_nodes - action.to_nodes,
            planned_at=now if entry is None else entry.created_at,
            freed_at=now,
            detail=record.detail,
        )

    def _refresh_history(self, now: float) -> int:
        """Incremental sacct at its own cadence; a failure costs history, not the cycle."""
        cadence = self.config.slurm.sacct_interval_s
        if self._history_until is not None and now - self._history_until < cadence:
            return 0
        if now < self._history_retry_at:
            return 0
        if self._history_until is None:
            since = now - self.config.slurm.sacct_lookback_s
        else:
            # Overlap one cadence: sacct shows a just-ended job late (stale ~2 s).
            since = self._history_until - cadence
        try:
            records = self.backend.read_history(since)
        except SlurmError as exc:
            # slurmdbd down: try again in a minute (or at the cadence, if sooner), not on
            # every cycle, so a hanging sacct cannot slow each cycle by its timeout.
            self._history_retry_at = now + min(cadence, 60.0)
            log.warning("history.failed", error=str(exc))
            return 1
        calls = 1 + self._refresh_node_limits()
        for rec in records:
            self._history[rec.job_id] = rec
            if rec.end_time and not math.isnan(rec.end_time):
                heapq.heappush(self._ending, (rec.end_time, rec.job_id))
        horizon = now - self.config.slurm.sacct_lookback_s
        aged = self._aged(horizon)
        for job_id in aged:
            del self._history[job_id]
        self.estimator.history_changed(records, aged)
        self._history_until = now
        log.info("history.read", records=len(records), kept=len(self._history))
        return calls

    def _groups_of(self, user: str) -> frozenset[str]:
        if user not in self._groups:
            self._groups[user] = user_groups(user)
        return self._groups[user]

    def _refresh_node_limits(self) -> int:
        """Re-read the QOS and association per-job node limits (a Slurm call each); a read
        that fails keeps the last."""
        try:
            self._qos_nodes = dict(self.backend.read_qos_node_limits())
        except SlurmError as exc:
            log.warning("qos.failed", error=str(exc))
        try:
            self._assoc_nodes = dict(self.backend.read_assoc_node_limits())
        except SlurmError as exc:
            log.warning("assoc.failed", error=str(exc))
        return 2

    def _aged(self, horizon: float) -> list[int]:
        """Kept records whose job ended before ``horizon``.  A record with no end (None,
        0 or NaN) never ages out: it counts as ending now, and the lookback is >= 0
        (config), so only records with an end are in the heap."""
        aged: dict[int, None] = {}
        ending = self._ending
        while ending and ending[0][0] < horizon:
            end, job_id = heapq.heappop(ending)
            # An entry whose record was replaced since (another end) or already aged is
            # stale; the record's current end has its own entry.
            h = self._history.get(job_id)
            if h is not None and h.end_time == end:
                aged[job_id] = None
        return list(aged)

    def _forget_ended(self, cls: Classification, known: Mapping[int, ElasticSpec]) -> None:
        """Drop per-job memory of jobs that left the queue (nothing open in the journal)."""
        open_jobs = {e.job_id for e in self.journal.open_actions()}
        for job_id in self.reports.job_ids():
            if job_id not in cls.jobs and job_id not in open_jobs:
                self.reports.forget(job_id)
        self.journal.forget_specs(j for j in known if j not in cls.jobs and j not in open_jobs)
        for job_id in self.agents.open_jobs():
            if job_id not in cls.elastic and job_id not in open_jobs:
                self.agents.clear(job_id)
        self.estimator.forget(j for j in self.estimator.known_jobs() if j not in cls.jobs)

    def _reconfigure_after_shrinks(self, cls: Classification, now: float) -> list[ActionRecord]:
        """``scontrol reconfigure`` once per ending of a job we shrank (enforce mode only),
        when ``slurm.reconfigure_after_shrink`` says the Slurm in use needs it."""
        setting = self.config.slurm.reconfigure_after_shrink
        caps = self._capabilities
        known_clean = setting == "auto" and caps is not None and not caps.leaks_nodes_after_shrink
        if not self.knobs.enforce or setting == "never" or known_clean:
            return []  # (the simulator's cycles stop here once its probe has answered)
        ended = self.journal.shrunk_jobs() - self.journal.reconfigured_jobs() - set(cls.jobs)
        if not ended or (setting == "auto" and not self._leaks_nodes_after_shrink()):
            return []
        return self.executor.reconfigure_after_shrink(ended, now)

    def capabilities(self) -> Capabilities | None:
        """What the running Slurm can do and hides (``Capabilities``): probed on first need
        and kept; None while the probe fails (asked again at the next need)."""
        if self._capabilities is None:
            try:
                self._capabilities = self.backend.probe()
            except SlurmError as exc:
                log.warning("probe.failed", error=str(exc))
                return None
            log.info("probe.done", **dataclasses.asdict(self._capabilities))
        return self._capabilities

    def forget_capabilities(self) -> None:
        """Probe Slurm again at the next need (a reload: Slurm may have changed too)."""
        self._capabilities = None

    def _leaks_nodes_after_shrink(self) -> bool:
        caps = self.capabilities()
        return caps is not None and caps.leaks_nodes_after_shrink

    def _note_size_changes(self, cls: Classification, now: float) -> None:
        """Tell the model when a job's size changed (our shrink, a companion starting,
        or anything else): its next report at the new size measures the restart cost."""
        sizes = {j: ej.effective_nodes for j, ej in cls.elastic.items() if ej.job.is_running}
        for job_id, size in sizes.items():
            before = self._sizes.get(job_id)
            if before is not None and before != size:
                self.estimator.resized(job_id, now, size)
                log.info("resize.observed", job_id=job_id, from_nodes=before, to_nodes=size)
        self._sizes = sizes

    def _plan(
        self,
        snapshot: ClusterSnapshot,
        cls: Classification,
        outlooks: Mapping[int, Outlook],
        frozen: Mapping[int, str],
        waiting: Mapping[int, str],
        now: float,
        yielding: frozenset[int] = frozenset(),
        bars: Mapping[tuple[int, ActionKind], str] | None = None,
        placing: Placing | None = None,
        narrowed: Mapping[int, tuple[str, ...]] | None = None,
        overdue: frozenset[int] = frozenset(),
    ) -> tuple[Plan, list[Action], list[ActionRecord]]:
        """Decide, diff and screen through the guards: (plan, allowed, blocked or deferred).
        ``narrowed``: pending jobs the daemon narrowed -> the partitions they are planned
        among again, and those of them ``overdue`` (``_narrowed``).

        A plan may give one job the nodes that another job's shrink frees.  When a guard
        blocks that shrink, those nodes are not coming: the grow's companion would wait
        pending on the other job's node, and start there the moment that job shrinks for
        any reason.  So the plan is made again with the jobs whose shrink was blocked held
        at their size, up to ``MAX_PLANS_PER_CYCLE`` plans; if the last one still needs a
        blocked shrink, its grows and pins wait for the next cycle (deferred).
        """
        held = dict(frozen)
        returning = self._returning(cls)
        yields = set(yielding)
        bars = bars or {}
        no_shrink = frozenset(job for job, kind in bars if kind is ActionKind.SHRINK)
        narrowed = narrowed or {}
        planned = with_partitions(cls, narrowed)
        blocked_shrinks: list[ActionRecord] = []
        for _ in range(MAX_PLANS_PER_CYCLE):
            problem = build_problem(
                snapshot,
                planned,
                outlooks,
                held,
                now=now,
                horizon_s=self.config.policy.horizon_s,
                time_limit_s=self.config.policy.time_limit_s,
                waiting=waiting,
                reclaim=self.config.policy.reclaim,
                yielding=frozenset(yields),
                promise_window_s=self.config.guards.payback_horizon_s,
                no_shrink=no_shrink,
                placing=placing,
            )
            plan = self._decide(problem)
            actions = diff(plan, cls, held, returning, narrowed, overdue)
            allowed, blocked = self._screen(actions, cls, outlooks, now, bars)
            needs = [r for r in blocked if r.action.kind is ActionKind.SHRINK]
            if not needs or not any(a.kind in _TAKES_NODES for a in allowed):
                return plan, allowed, blocked_shrinks + blocked
            blocked_shrinks += needs
            held.update((r.action.job_id, f"shrink blocked: {r.detail}") for r in needs)
            yields.difference_update(r.action.job_id for r in needs)
        others = [r for r in blocked if r.action.kind is not ActionKind.SHRINK]
        deferred = [
            ActionRecord(a, ActionOutcome.DEFERRED, "needs nodes from a blocked shrink")
            for a in allowed
            if a.kind in _TAKES_NODES
        ]
        kept = [a for a in allowed if a.kind not in _TAKES_NODES]
        return plan, kept, blocked_shrinks + others + deferred

    def _narrowed(
        self, cls: Classification, snapshot: ClusterSnapshot, placing: Placing, now: float
    ) -> tuple[dict[int, tuple[str, ...]], frozenset[int]]:
        """Pending jobs the daemon narrowed to one partition (``policy.placement: plan``)
        and Slurm still shows there -> the partitions they were submitted to that are UP
        and that their user may still use, where that is more than the one: they are
        planned among those again, and given them back (``diff``) when the plan does not
        start them or they are overdue (the second item: placed there longer than
        ``policy.placement_wait_s`` ago).  One journal read per pending job of one
        partition, with ``plan`` only."""
        if not placing.choose:
            return {}, frozenset()
        wait = self.config.policy.placement_wait_s
        up = {p.name for p in snapshot.partitions if p.state.upper() == "UP"}
        out: dict[int, tuple[str, ...]] = {}
        overdue: set[int] = set()
        for job_id, ej in cls.elastic.items():
            job = ej.job
            if not job.is_pending or len(job.partitions) != 1:
                continue
            (here,) = job.partitions
            submitted, since = narrowed_from(self.journal.actions_for(job_id), here)
            usable = tuple(
                p for p in submitted if p == here or (p in up and placing.may_use(job, p))
            )
            if len(usable) > 1:
                out[job_id] = usable
                if now - since >= wait:
                    overdue.add(job_id)
        return out, frozenset(overdue)

    def _returning(self, cls: Classification) -> dict[int, int]:
        """Requeued elastic jobs -> the size the policy last chose for them (``diff``)."""
        requeued = (
            j for j, ej in cls.elastic.items() if ej.job.is_pending and ej.job.restart_count
        )
        return {
            job_id: size
            for job_id in requeued
            if (size := last_planned_size(self.journal.actions_for(job_id))) is not None
        }

    def _decide(self, problem: AllocationProblem) -> Plan:
        try:
            return self._allocate(problem, self.config.policy.name)
        except SlurmElasticError as exc:
            log.warning("plan.failed", error=str(exc))
            return keep_current_plan(problem, f"allocation failed: {exc}")

    def _screen(
        self,
        actions: list[Action],
        cls: Classification,
        outlooks: Mapping[int, Outlook],
        now: float,
        bars: Mapping[tuple[int, ActionKind], str] | None = None,
    ) -> tuple[list[Action], list[ActionRecord]]:
        """The guards' verdict on each action: (allowed, blocked records), order kept.
        ``bars``: what Slurm refused (``refusal_bars``) or said "not now" to (``retry_bars``),
        blocked before any other rule."""
        allowed: list[Action] = []
        blocked: list[ActionRecord] = []
        for action in actions:
            why = (bars or {}).get((action.job_id, action.kind)) or self._block(
                action, cls, outlooks, now
            )
            if why:
                blocked.append(ActionRecord(action, ActionOutcome.BLOCKED, why))
            else:
                allowed.append(action)
        return allowed, blocked

    def _block(
        self, action: Action, cls: Classification, outlooks: Mapping[int, Outlook], now: float
    ) -> str | None:
        if action.kind is ActionKind.CANCEL_COMPANION:
            return None if action.job_id in cls.companions else "not a companion"
        if action.kind is ActionKind.GROW:
            if self.config.grow.method == "off":
                return "grow disabled (grow.method: off)"
            failed = self.journal.grow_failures(action.job_id)
            why = grow_retry_reason(*failed, self.knobs, now)
            if why:
                return why
        ej = cls.elastic.get(action.job_id)
        return block_reason(
            action,
            ej,
            self.knobs,
            now,
            outlooks.get(action.job_id),
            agent_seen=self.reports.latest(action.job_id) is not None,
        )

    def _failed(
        self,
        now: float,
        started: float,
        kind: CycleErrorKind,
        detail: str,
        age: float | None,
        calls: int,
    ) -> CycleResult:
        error = f"{kind}: {detail}"
        log.warning("cycle.failed", error=error)
        result = CycleResult(
            now=now,
            ok=False,
            error=error,
            error_kind=kind,
            duration_s=time.perf_counter() - started,
            slurm_calls=calls,
            history_calls=0,
            snapshot_age_s=age,
            mode=self.config.mode,
        )
        self.last_result = result
        return result


# --------------------------------------------------------------------------- pure helpers


def _grow_check(config: Config) -> GrowCheck:
    return GrowCheck(config.model.grow_check_reports, config.model.grow_min_gain_share)


def user_groups(user: str) -> frozenset[str]:
    """Every group ``user`` belongs to on this host, its primary group included, as
    slurmctld's ``validate_group`` sees them (the head node shares the cluster's user
    database); none for a user this host does not know (only partitions open to every
    group are then offered to the job)."""
    try:
        entry = pwd.getpwnam(user)
        gids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, OSError):
        return frozenset()
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue  # a gid without a name cannot be listed in AllowGroups
    return frozenset(names)


def keep_current_plan(problem: AllocationProblem, note: str) -> Plan:
    """'No change': every job keeps its size (pending jobs stay pending)."""
    return Plan(
        decisions=tuple(
            Decision(d.job_id, d.current_nodes, d.current_nodes, Explanation(0.0, 0.0, "no-change"))
            for d in problem.elastic
        ),
        solver="none",
        status=SolverStatus.NO_CHANGE,
        objective=0.0,
        note=note,
    )


# --------------------------------------------------------------------------- adapters


# Pure and read for every queued job every cycle: parsed once per distinct comment and range.
_marker_spec = functools.lru_cache(maxsize=4096)(resolve_spec)


def _resolve_spec(
    job: JobView, *, known: Mapping[int, ElasticSpec], capacity: Callable[[JobView], int]
) -> ElasticSpec | None:
    """The job's spec: remembered from when it was first seen, else from its marker, capped
    at what its partitions can ever give (``OutOfReach`` when its minimum is more).

    Remembered first, because pinning ``NumNodes=n-n`` (and running) erases the node
    range Slurm reports, and a marker left incomplete (no job_submit plugin) needs that
    range; the marker must still be there (a user may remove it to opt out).  Capped every
    cycle, because the plugin checks only submissions: a comment changed later with
    ``scontrol update`` reaches the daemon unchecked.
    """
    spec = _marker_spec(job.comment, job.min_nodes, job.max_nodes)
    if spec is None:
        return None
    return cap_spec(known.get(job.job_id, spec), capacity(job))


def _policy_allocate(
    problem: AllocationProblem, policy: str, *, fallback: str = DEFAULT_FALLBACK
) -> Plan:
    # Imported on first use: the solver stack (numpy, highspy) is not needed by
    # ``slurm-elastic --help`` or by code that only reads the controller's types.
    from slurm_elastic.policy import allocate

    return allocate(problem, policy, fallback=fallback)
