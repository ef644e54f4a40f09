"""Crash recovery: close the journal's open actions against Slurm, cancel orphan companions.

Run once, on the daemon's first good snapshot (``Executor.reconcile``, called by the
controller).  Because every action is committed to the journal before Slurm is called, a
daemon killed at any point leaves either an ``intent`` or a ``waiting`` row; each is
closed here exactly once — completed when Slurm shows the effect, rolled back when it
does not — so nothing is repeated and nothing is forgotten.  Then companion jobs whose
parent is gone are cancelled (the orphan sweep).  docs/design.md, "Journal and recovery".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from slurm_elastic.actuate.journal import ActionStatus, JournalEntry, JournalStore
from slurm_elastic.cluster_state import orphan_reason, pinned_to
from slurm_elastic.errors import SlurmError
from slurm_elastic.marker import companion_parent
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.types import Action, ActionKind, ClusterSnapshot, JobView

log = structlog.get_logger("slurm_elastic.journal")


@dataclass(slots=True)
class ReconcileReport:
    completed: list[int] = field(default_factory=list)  # action ids now marked applied
    rolled_back: list[int] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)  # companions found and linked
    cancelled: list[int] = field(default_factory=list)  # orphan companions cancelled
    errors: list[str] = field(default_factory=list)


def reconcile(
    journal: JournalStore, backend: SlurmBackend, snapshot: ClusterSnapshot, *, act: bool = True
) -> ReconcileReport:
    """Close every open action against what Slurm shows, and cancel orphan companions.

    * start_at_size: applied when the job is pinned to (or running at) the size,
      else rolled back — the next cycle decides afresh.
    * grow: applied when a companion of the parent that the journal does not know
      yet is in the queue (submitted just before the crash: adopted), else rolled back.
      Only a job of the parent's owner is adopted: another user's job naming the
      parent in its comment is not ours (``classify`` ignores it as well).
    * shrink: applied when the parent already runs at the target and the companions it
      drops are gone, else rolled back; the instruction's deadline lets a waiting agent
      resume on its own.
    * cancel_companion: applied when the companion is gone, else rolled back (the
      orphan sweep below or the next cycle cancels it again).
    * reconfigure: rolled back (not observable in Slurm); the next cycle repeats it.

    With ``act=False`` (shadow mode) the journal is updated but Slurm is not touched.
    Reconciling again closes nothing more (no row is open) and cancels only new orphans.

    Raises:
        StateError: the journal cannot be written; rows closed before it stay closed.
    A Slurm error cancelling an orphan is not raised: the cancel's row is marked failed
    and the error listed in ``ReconcileReport.errors``.
    """
    now = snapshot.taken_at
    report = ReconcileReport()
    active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
    linked = {c.companion_id for c in journal.companions(active_only=False)}
    for entry in journal.open_actions():
        adopted = _adopt(journal, entry, active, linked, now)
        if adopted is not None:
            linked.add(adopted)
            report.adopted.append(adopted)
            report.completed.append(entry.id)
            continue
        done, why = _seen_done(entry, active)
        if done:
            journal.mark(entry.id, ActionStatus.APPLIED, now, detail="reconciled")
            report.completed.append(entry.id)
        else:
            journal.mark(entry.id, ActionStatus.ROLLED_BACK, now, detail=f"reconciled: {why}")
            report.rolled_back.append(entry.id)
    sweep_companions(journal, backend, snapshot, report, act=act)
    log.info(
        "journal.reconciled",
        completed=report.completed,
        rolled_back=report.rolled_back,
        adopted=report.adopted,
        cancelled=report.cancelled,
    )
    return report


def _adopt(
    journal: JournalStore,
    entry: JournalEntry,
    active: dict[int, JobView],
    linked: set[int],
    now: float,
) -> int | None:
    """An open grow whose companion is in the queue though not linked (sbatch ran, the
    daemon died before writing it down): link it, mark the grow applied, return its id."""
    parent = active.get(entry.job_id)
    if entry.kind is not ActionKind.GROW or parent is None:
        return None
    # Anyone can write a companion comment naming any job: only a job of the parent's
    # owner, submitted since the grow was written down, can be the one our sbatch (run as
    # that owner) created.  (Slurm's submit time has whole seconds.)
    since = int(entry.created_at) - 1
    found = [
        j
        for j in active.values()
        if companion_parent(j.comment) == entry.job_id
        and j.job_id not in linked
        and j.user == parent.user
        and (j.submit_time is None or j.submit_time >= since)
    ]
    if not found:
        return None
    comp = min(found, key=lambda j: j.job_id)
    journal.link_companion(entry.job_id, comp.job_id, comp.node_count, entry.id, now)
    journal.mark(entry.id, ActionStatus.APPLIED, now, detail="adopted", companion_id=comp.job_id)
    return comp.job_id


def _seen_done(entry: JournalEntry, active: dict[int, JobView]) -> tuple[bool, str]:
    """Whether Slurm shows the open action's effect, and why not when it does not."""
    job = active.get(entry.job_id)
    if entry.kind is ActionKind.CANCEL_COMPANION:
        return job is None, "companion still active"
    if entry.kind is ActionKind.RECONFIGURE:
        # Slurm keeps no trace of a reconfigure: rolled back, the next cycle issues it
        # again (it is idempotent).
        return False, "reconfigure not confirmed before restart"
    if job is None:
        return False, "job has ended"
    if entry.kind is ActionKind.START_AT_SIZE:
        if job.is_pending:
            done = pinned_to(job, entry.action.to_nodes)
        else:
            done = job.node_count == entry.action.to_nodes
        return done, "pin not visible in Slurm"
    if entry.kind is ActionKind.GROW:
        return False, "no companion was submitted"  # (one that was is adopted instead)
    # A shrink: done when the parent runs at its new size without the dropped companions.
    extra = dict(entry.action.extra)
    dropped = [int(c) for c in extra.get("cancel_companions", "").split(",") if c]
    parent_nodes = int(extra.get("parent_nodes", entry.action.to_nodes))
    done = (
        job.is_running and job.node_count == parent_nodes and not any(c in active for c in dropped)
    )
    return done, "shrink not applied before restart"


def sweep_companions(
    journal: JournalStore,
    backend: SlurmBackend,
    snapshot: ClusterSnapshot,
    report: ReconcileReport,
    *,
    act: bool,
) -> None:
    """End the links of companions no longer in the queue, and (``act``) cancel every
    active companion whose parent is gone (``companion.orphan_reason``), journal first:
    one ``cancel_companion`` row each, applied, or failed with the Slurm error noted in
    ``report.errors``."""
    now = snapshot.taken_at
    active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
    parents: dict[int, int] = {}  # the journal's links, never what a comment says
    for link in journal.companions():
        if link.companion_id not in active:
            journal.end_companion(link.companion_id, now)
        else:
            parents[link.companion_id] = link.parent_id
    for comp_id, parent_id in sorted(parents.items()):
        job = active[comp_id]
        if orphan_reason(job, parent_id, active) is None or not act:
            continue
        action = Action(
            ActionKind.CANCEL_COMPANION,
            job.job_id,
            job.node_count,
            0,
            reason="orphan at start-up",
        )
        action_id = journal.record_intent(action, now)
        try:
            backend.cancel(job.job_id)
        except SlurmError as exc:
            journal.mark(action_id, ActionStatus.FAILED, now, detail=str(exc))
            report.errors.append(f"cancel {job.job_id}: {exc}")
            continue
        journal.mark(action_id, ActionStatus.APPLIED, now)
        journal.end_companion(job.job_id, now)
        report.cancelled.append(job.job_id)
