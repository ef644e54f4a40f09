"""Applies guarded actions to Slurm, journal first.

Every action is written to the journal *before* Slurm is called, then marked with what
Slurm answered:

* ``applied``;
* ``refused``: Slurm said the request cannot be done (``SlurmRejected`` to a pin or a
  shrink of a job in the state it needs): a fact about the job, which bars that action for
  a while (``guards.refusal_bars``); a refused ``sbatch`` is a failed grow instead;
* ``retry``: Slurm said "not now" (``SlurmBusy``: "try again in a bit", a controller in
  standby, ...) or could not be reached (``SlurmUnreachable``): nothing was applied, and
  the action is proposed again once its backoff has run (``guards.retry_bars``);
* ``failed``: anything else (a timeout, output that cannot be read).

The backend retries its idempotent calls (pin, shrink, cancel) within the call on the
same transient answers; ``sbatch`` is not retried there, because a timed-out submission
may still have created the job: reconciliation (``Executor.reconcile``,
``actuate.reconcile``) adopts it instead.

Graceful shrink, one small state machine per job (driven by ``start_shrink`` then
``advance_shrinks`` once per cycle)::

    start_shrink:  journal(waiting, instruction id, deadline = now + ack_timeout_s)
                   board.post(instruction: target, keep_nodes, deadline)
    advance_shrinks, each later cycle:
        mode switched to shadow (SIGHUP)                 -> rolled_back (shadow never acts)
        job ended / not running / size changed under us -> rolled_back (companions it was
          asked to release that ended are no change)
        ack "ready"                                      -> apply
        ack "failed", a reclaim, reclaim_hard_shrink     -> apply (the loan is due)
        ack "failed", hard_shrink                        -> apply ("hard shrink")
        ack "failed"                                     -> rolled_back (the job said no)
        deadline passed, hard_shrink (or a reclaim with
          guards.reclaim_hard_shrink)                    -> apply ("hard shrink")
        deadline passed, otherwise                       -> rolled_back (no agent answered)
        otherwise                                        -> keep waiting
    apply:  cancel the companions being dropped that still run (the job ends them itself
            before it acks: ``Instruction.release``), then ``NumNodes=<parent_nodes>`` on the
            parent (Slurm keeps its first N nodes, the batch host among them) -> applied;
            Slurm's answer otherwise -> refused, retry or failed, as above.  The
            instruction is cleared in every end state.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from slurm_elastic.actuate.companion import (
    companion_comment,
    companion_extra_args,
    companion_name,
    companion_script,
)
from slurm_elastic.actuate.guards import GuardKnobs, forced_on_timeout, with_job_shape
from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import ActionStatus, CompanionLink, JournalEntry, JournalStore
from slurm_elastic.actuate.reconcile import ReconcileReport, reconcile
from slurm_elastic.cluster_state import Classification, ElasticJob
from slurm_elastic.errors import SlurmBusy, SlurmError, SlurmRejected, SlurmUnreachable
from slurm_elastic.policy.capacity import RECLAIM
from slurm_elastic.protocol import AckStatus, Instruction, InstructionKind
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import (
    Action,
    ActionKind,
    ActionOutcome,
    ClusterSnapshot,
    JobState,
    JobView,
)

log = structlog.get_logger("slurm_elastic.actuate")


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """What became of one proposed action this cycle."""

    action: Action
    outcome: ActionOutcome
    detail: str = ""
    action_id: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "kind": str(self.action.kind),
            "job_id": self.action.job_id,
            "from_nodes": self.action.from_nodes,
            "to_nodes": self.action.to_nodes,
            "reason": self.action.reason,
            "outcome": str(self.outcome),
            "detail": self.detail,
            "action_id": self.action_id,
        }


class Executor:
    """Carries out the controller's guarded actions on Slurm, each written to the journal
    before Slurm is called.

    Contract: a Slurm failure is an outcome, not an exception: every method returns an
    ``ActionRecord`` whose outcome is ``failed`` (or ``rolled_back``) with Slurm's reason,
    and the journal says the same.

    Raises (every method):
        StateError: the journal cannot be written; nothing more is sent to Slurm.
    """

    def __init__(
        self,
        backend: SlurmBackend,
        journal: JournalStore,
        board: InstructionBoard,
        knobs: GuardKnobs,
        *,
        agent_command: str,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.backend = backend
        self.journal = journal
        self.board = board
        self.knobs = knobs
        self.agent_command = agent_command
        self._new_id = new_id
        self._started: dict[int, float] = {}  # linked companion -> when it was seen started

    # ------------------------------------------------------------------ crash recovery

    def reconcile(self, snapshot: ClusterSnapshot) -> ReconcileReport:
        """Close the journal's open actions against ``snapshot`` and cancel orphan
        companions (``actuate.reconcile``); Slurm is touched only in enforce mode.

        Raises:
            StateError: the journal cannot be written.
        """
        return reconcile(self.journal, self.backend, snapshot, act=self.knobs.enforce)

    # ------------------------------------------------------------------ new actions

    def apply(self, action: Action, elastic: Mapping[int, ElasticJob], now: float) -> ActionRecord:
        """Carry out one action: pin, grow (submit a companion), cancel a companion, or
        start a graceful shrink (``start_shrink``).  ``elastic`` holds the action's job.

        Raises:
            StateError: the journal cannot be written (before or after the Slurm call).
        """
        if action.kind is ActionKind.SHRINK:
            return self.start_shrink(action, elastic[action.job_id], now)
        if action.kind is ActionKind.START_AT_SIZE:
            action = with_job_shape(action, elastic[action.job_id].job)
        action_id = self.journal.record_intent(action, now)
        try:
            if action.kind is ActionKind.START_AT_SIZE:
                extra = dict(action.extra)
                partition = extra.get("partition")
                submitted = tuple(filter(None, extra.get("submitted", "").split(",")))
                self.backend.pin_pending_size(action.job_id, action.to_nodes, partition, submitted)
                detail = f"pinned NumNodes={action.to_nodes}-{action.to_nodes}"
                if partition is not None:
                    detail += f" Partition={partition}"
            elif action.kind is ActionKind.GROW:
                companion_id = self._submit_companion(action, elastic[action.job_id].job, now)
                self.journal.link_companion(
                    action.job_id, companion_id, _companion_nodes(action), action_id, now
                )
                self.journal.mark(
                    action_id,
                    ActionStatus.APPLIED,
                    now,
                    companion_id=companion_id,
                    detail=f"companion {companion_id} submitted",
                )
                return self._done(
                    action,
                    ActionOutcome.APPLIED,
                    f"grow: companion {companion_id} pending",
                    action_id,
                )
            else:
                self.backend.cancel(action.job_id)
                self.journal.end_companion(action.job_id, now)
                detail = f"cancelled companion ({action.reason})"
        except SlurmRejected as exc:
            if action.kind is not ActionKind.START_AT_SIZE:  # sbatch refused: grow retries
                return self._failed(action, action_id, str(exc), now)
            return self._refused(action, action_id, exc, now)
        except (SlurmBusy, SlurmUnreachable) as exc:
            return self._retry(action, action_id, exc, now)
        except SlurmError as exc:
            return self._failed(action, action_id, str(exc), now)
        self.journal.mark(action_id, ActionStatus.APPLIED, now, detail=detail)
        return self._done(action, ActionOutcome.APPLIED, detail, action_id)

    def _failed(self, action: Action, action_id: int, detail: str, now: float) -> ActionRecord:
        self.journal.mark(action_id, ActionStatus.FAILED, now, detail=detail)
        return self._done(action, ActionOutcome.FAILED, detail, action_id)

    def _refused(
        self, action: Action, action_id: int, exc: SlurmRejected, now: float
    ) -> ActionRecord:
        """Slurm itself refused a pin or a shrink of a job in the state it needs (the
        backend checks the state just before): a fact about the job, kept as the journal's
        ``refused`` row with Slurm's message, which bars that kind of action on the job
        (``actuate.guards.refusal_reason``) instead of a retry every cycle."""
        detail = _refusal(exc)
        self.journal.mark(action_id, ActionStatus.REFUSED, now, detail=detail)
        return self._done(action, ActionOutcome.REFUSED, detail, action_id)

    def _retry(
        self, action: Action, action_id: int, exc: SlurmBusy | SlurmUnreachable, now: float
    ) -> ActionRecord:
        """Slurm said "not now" or could not be reached: nothing was applied.  Not a fact
        about the job and not a failure of the grow: the ``retry`` row only delays the next
        attempt (``guards.retry_bars``)."""
        detail = _retry_detail(exc)
        self.journal.mark(action_id, ActionStatus.RETRY, now, detail=detail)
        return self._done(action, ActionOutcome.RETRY, detail, action_id)

    def _submit_companion(self, action: Action, parent: JobView, now: float) -> int:
        return self.backend.submit(
            companion_script(parent, self.agent_command),
            user=parent.user,
            nodes=_companion_nodes(action),
            partition=parent.partition,
            account=parent.account or None,
            qos=parent.qos or None,
            name=companion_name(parent),
            comment=companion_comment(parent.job_id),
            work_dir=parent.work_dir or None,
            extra_args=companion_extra_args(parent, now),
        )

    # ------------------------------------------------------------------ failed companions

    def note_companion_ends(
        self, cls: Classification, snapshot: ClusterSnapshot, now: float
    ) -> list[ActionRecord]:
        """Close the journal's link of every companion that left the queue by itself, and
        turn its grow into a failed one when it failed at once: it ended sooner than
        ``companion_fail_window_s`` after it started (or never started) while its parent
        still runs.  The guards then back off before the next grow of that parent and
        give up after ``companion_max_failures`` (``guards.grow_retry_reason``).

        Companions the daemon cancels have their link closed when cancelled, and one that
        ends with its parent is no failure.  When a companion is seen running, its start
        is noted: squeue keeps an ended job only for ``MinJobAge``.
        """
        records: list[ActionRecord] = []
        finished: dict[int, JobView] | None = None
        for link in self.journal.companions():
            comp = cls.jobs.get(link.companion_id)
            if comp is not None:
                if comp.start_time is not None:
                    self._started[link.companion_id] = comp.start_time
                continue
            if finished is None:
                finished = {j.job_id: j for j in snapshot.jobs if not j.state.is_active}
            view = finished.get(link.companion_id)
            started = self._started.pop(link.companion_id, None)
            if view is not None and view.start_time:
                started = view.start_time
            self.journal.end_companion(link.companion_id, now)
            parent = cls.elastic.get(link.parent_id)
            if parent is None or not parent.job.is_running:
                continue  # ended with (or after) its parent: no failure of its own
            if view is not None and view.state is JobState.COMPLETED:
                continue  # its agent finished (training done): no failure however short
            ended = view.end_time if view is not None and view.end_time else now
            if started is not None and ended - started >= self.knobs.companion_fail_window_s:
                continue
            how = view.state.value if view is not None else "gone"
            detail = (
                f"companion {link.companion_id} {how} before it started"
                if started is None
                else f"companion {link.companion_id} {how} after {max(0.0, ended - started):.0f}s"
            )
            records.append(self._companion_failed(link, parent, detail, now))
        return records

    def _companion_failed(
        self, link: CompanionLink, parent: ElasticJob, detail: str, now: float
    ) -> ActionRecord:
        size = parent.effective_nodes
        action = Action(
            ActionKind.GROW,
            link.parent_id,
            size,
            size + link.nodes,
            reason="companion failed",
            extra=(("companion_nodes", str(link.nodes)),),
        )
        action_id = link.action_id
        if action_id is None:  # linked without a grow row: give it one, closed
            action_id = self.journal.record_intent(action, now, status=ActionStatus.FAILED)
        self.journal.mark(action_id, ActionStatus.FAILED, now, detail=detail)
        log.warning("companion.failed", job_id=link.parent_id, detail=detail)
        return self._done(action, ActionOutcome.FAILED, detail, action_id)

    # ------------------------------------------------------------------ graceful shrink

    def start_shrink(self, action: Action, ej: ElasticJob, now: float) -> ActionRecord:
        action = with_job_shape(action, ej.job)
        extra = dict(action.extra)
        instruction_id = self._new_id()
        deadline = now + self.knobs.ack_timeout_s
        action_id = self.journal.record_intent(
            action,
            now,
            status=ActionStatus.WAITING,
            instruction_id=instruction_id,
            deadline=deadline,
        )
        keep = tuple(n for n in extra.get("keep_nodes", "").split(",") if n)
        release = _released(action)
        self.board.post(
            action.job_id,
            Instruction(
                id=instruction_id,
                kind=InstructionKind.SHRINK,
                target_nodes=action.to_nodes,
                keep_nodes=keep,
                deadline=deadline,
                release=release,
            ),
        )
        log.info("shrink.instructed", job_id=action.job_id, target=action.to_nodes, keep=keep)
        return self._done(action, ActionOutcome.WAITING, "shrinking: awaiting ack", action_id)

    def advance_shrinks(self, elastic: Mapping[int, ElasticJob], now: float) -> list[ActionRecord]:
        records: list[ActionRecord] = []
        for entry in self.journal.open_actions():
            if entry.kind is ActionKind.SHRINK and entry.status is ActionStatus.WAITING:
                records.append(self._advance(entry, elastic.get(entry.job_id), now))
        return records

    def _advance(self, entry: JournalEntry, ej: ElasticJob | None, now: float) -> ActionRecord:
        action = entry.action
        if not self.knobs.enforce:
            return self._end_shrink(entry, ActionStatus.ROLLED_BACK, "mode is shadow", now)
        if ej is None or not ej.job.is_running or not self._as_instructed(ej, action):
            return self._end_shrink(entry, ActionStatus.ROLLED_BACK, "job changed or ended", now)
        ack = self.board.ack_for(entry.instruction_id or "")
        if ack is not None and ack.status is AckStatus.READY:
            # The ack's detail says what the job did: a checkpoint, or under the signal
            # contract (agent.stopping) how much training may be redone.
            why = f"agent ready at step {ack.step}" + (f": {ack.detail}" if ack.detail else "")
            return self._apply_shrink(entry, ej, now, why)
        forced = forced_on_timeout(action, self.knobs)
        if ack is not None:
            refused = f"agent refused: {ack.detail or 'failed'}"
            if forced:
                # The daemon's guards already keep min and the batch host: what is left to
                # refuse is a hold the workers did not reach, which a hard shrink overrides.
                kind = "reclaim" if action.reason == RECLAIM else "hard shrink"
                return self._apply_shrink(entry, ej, now, f"{kind}: {refused}; shrunk anyway")
            return self._end_shrink(entry, ActionStatus.ROLLED_BACK, refused, now)
        if entry.deadline is not None and now >= entry.deadline:
            if forced:
                return self._apply_shrink(entry, ej, now, "hard shrink: no ack before deadline")
            return self._end_shrink(
                entry,
                ActionStatus.ROLLED_BACK,
                "no ack within ack_timeout_s (hard_shrink off)",
                now,
            )
        return self._done(action, ActionOutcome.WAITING, "shrinking: awaiting ack", entry.id)

    def _as_instructed(self, ej: ElasticJob, action: Action) -> bool:
        """The job is as it was when instructed, but for companions it was asked to release
        that have ended by themselves (``Instruction.release``)."""
        running = {c.job_id for c in ej.running_companions}
        extra = dict(action.extra)
        counts = [int(n) for n in extra.get("cancel_companion_nodes", "").split(",") if n]
        sizes = dict(zip(_released(action), counts, strict=False))
        released = sum(n for c, n in sizes.items() if c not in running)
        return ej.effective_nodes == action.from_nodes - released

    def _apply_shrink(
        self, entry: JournalEntry, ej: ElasticJob, now: float, why: str
    ) -> ActionRecord:
        extra = dict(entry.action.extra)
        parent_nodes = int(extra.get("parent_nodes", entry.action.to_nodes))
        running = {c.job_id for c in ej.running_companions}
        try:
            for comp in _released(entry.action):
                if comp in running:  # one the job released itself is gone already
                    self.backend.cancel(comp)
                self.journal.end_companion(comp, now)
        except SlurmError as exc:
            return self._end_shrink(entry, ActionStatus.FAILED, str(exc), now)
        try:
            if parent_nodes < ej.job.node_count:
                self.backend.shrink(ej.job.job_id, parent_nodes)
        except SlurmRejected as exc:  # as for a pin (``_refused``): a fact, not retried
            return self._end_shrink(entry, ActionStatus.REFUSED, _refusal(exc), now)
        except (SlurmBusy, SlurmUnreachable) as exc:  # as for a pin (``_retry``)
            return self._end_shrink(entry, ActionStatus.RETRY, _retry_detail(exc), now)
        except SlurmError as exc:
            return self._end_shrink(entry, ActionStatus.FAILED, str(exc), now)
        return self._end_shrink(entry, ActionStatus.APPLIED, why, now)

    def _end_shrink(
        self, entry: JournalEntry, status: ActionStatus, detail: str, now: float
    ) -> ActionRecord:
        self.journal.mark(entry.id, status, now, detail=detail)
        self.board.clear(entry.job_id)
        log.info("shrink.ended", job_id=entry.job_id, status=str(status), detail=detail)
        return self._done(entry.action, ActionOutcome(status.value), detail, entry.id)

    # ------------------------------------------------------------------ Slurm quirks

    def reconfigure_after_shrink(self, ended: Iterable[int], now: float) -> list[ActionRecord]:
        """One ``scontrol reconfigure`` for jobs we shrank that have now ended.

        Slurm 22.05 can leave a node the shrink freed idle but unschedulable once the
        shrunk job has ended (``slurm.cli.leaks_nodes_after_shrink``); reconfiguring after
        the ending prevents it.  Each ending gets its own journal row; endings seen in the
        same cycle share one call, since one reconfigure covers the whole cluster.  A
        refusal is recorded ``failed`` and not repeated (the next ending tries again).
        """
        jobs = sorted(set(ended))
        if not jobs:
            return []
        why = "Slurm 22.05 node leak after a shrink"
        actions = [Action(ActionKind.RECONFIGURE, job_id, 0, 0, reason=why) for job_id in jobs]
        pending = [(a, self.journal.record_intent(a, now)) for a in actions]  # journal first
        try:
            self.backend.reconfigure()
        except SlurmError as exc:
            for _, action_id in pending:
                self.journal.mark(action_id, ActionStatus.FAILED, now, detail=str(exc))
            return [self._done(a, ActionOutcome.FAILED, str(exc), i) for a, i in pending]
        detail = f"scontrol reconfigure: shrunk job {','.join(map(str, jobs))} ended"
        for _, action_id in pending:
            self.journal.mark(action_id, ActionStatus.APPLIED, now, detail=detail)
        return [self._done(a, ActionOutcome.APPLIED, detail, i) for a, i in pending]

    def in_flight(self) -> dict[int, str]:
        """Jobs with an open action (a shrink awaiting its ack), with a status reason."""
        return {
            e.job_id: "shrinking: awaiting ack"
            for e in self.journal.open_actions()
            if e.kind is ActionKind.SHRINK
        }

    @staticmethod
    def _done(
        action: Action, outcome: ActionOutcome, detail: str, action_id: int | None
    ) -> ActionRecord:
        log.info(
            f"action.{outcome}",
            kind=str(action.kind),
            job_id=action.job_id,
            from_nodes=action.from_nodes,
            to_nodes=action.to_nodes,
            detail=detail,
        )
        return ActionRecord(action, outcome, detail, action_id)


def _refusal(exc: SlurmRejected) -> str:
    """A refusal's journal detail and REASON: Slurm's own message when it gave one."""
    return exc.slurm_message or str(exc)


def _retry_detail(exc: SlurmBusy | SlurmUnreachable) -> str:
    """A retry's journal detail: Slurm's own words when it gave some, else the error."""
    return (exc.slurm_message if isinstance(exc, SlurmBusy) else "") or str(exc)


def _companion_nodes(action: Action) -> int:
    return int(dict(action.extra).get("companion_nodes", action.to_nodes - action.from_nodes))


def _released(action: Action) -> tuple[int, ...]:
    """The companions a shrink gives back (its layout's ``cancel_companions``)."""
    return tuple(int(c) for c in dict(action.extra).get("cancel_companions", "").split(",") if c)
