"""Plan minus reality = actions (pure).

``diff`` turns the policy's target sizes into concrete actions; ``companion_cleanup``
adds the housekeeping that does not depend on the plan (orphan companions, companions
pending too long).  Neither applies anything: the executor does, after the guards.

Sizes are *effective* sizes: a running parent's own nodes plus its running companions'.
A shrink therefore may mean cancelling companions, shrinking the parent, or both; its
layout (``cluster_state.shrink_layout``, which the problem builder's offered sizes share)
goes into the action so the shrink instruction can tell the job which nodes stay.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from slurm_elastic.actuate.journal import ActionStatus, JournalEntry
from slurm_elastic.cluster_state import Classification, ElasticJob, pinned_to, shrink_layout
from slurm_elastic.policy.capacity import RECLAIM
from slurm_elastic.types import Action, ActionKind, JobView, Plan

# The reason of a requeued job's pin to its last planned size (``diff``'s ``returning``).
RETURNING = "requeued: last planned size"
# The reason of giving a job the daemon narrowed its partitions back (``diff``'s ``narrowed``).
WIDEN = "not started where placed: its partitions back"


def diff(
    plan: Plan,
    classification: Classification,
    frozen: Mapping[int, str],
    returning: Mapping[int, int] | None = None,
    narrowed: Mapping[int, tuple[str, ...]] | None = None,
    overdue: Collection[int] = frozenset(),
) -> list[Action]:
    """Actions that move every unfrozen elastic job to its planned size, and a job frozen
    by dwell or cooldown to the size a reclaim gives it.

    A pending job the plan starts in one of its partitions (a placement) is narrowed to it
    in the same update as its size, and the update carries the partitions it was submitted
    to (``submitted``: journalled, since Slurm forgets them).  ``narrowed``: pending jobs
    the daemon narrowed that have not started -> those of their partitions they may still
    use (``narrowed_from``).  One gets them back (``WIDEN``) when the plan does not start
    it, or places it where it already is and it is ``overdue`` (it has waited there longer
    than ``policy.placement_wait_s``: Slurm does not start it there).  A job narrowed to a
    partition where it then waits would otherwise wait there for good, whatever frees
    elsewhere; given back, it may be placed again at the next cycle.

    ``returning``: requeued jobs (preempted, or ``scontrol requeue``) -> the size the
    policy last chose for them (``last_planned_size``).  Slurm keeps a job's node request
    across a requeue and starts it the moment nodes free, before a cycle can pin another
    size, so a requeued job the plan does not start now is pinned to that size: it comes
    back at the policy's size for it, not at its parent's own share of it (a grow's
    companions are gone).  When a plan can start it, the plan's size is pinned instead.

    Order: pins of pending jobs first (they only use free nodes), then shrinks (they
    free nodes), then grows, so the per-cycle resize limit favours freeing capacity.
    """
    returning = returning or {}
    narrowed = narrowed or {}
    pins: list[Action] = []
    shrinks: list[Action] = []
    grows: list[Action] = []
    for decision in plan.decisions:
        ej = classification.elastic.get(decision.job_id)
        if ej is None:
            continue
        # A frozen job moves only to give back a loan (the policy offers it nothing else).
        if decision.job_id in frozen and decision.explanation.rule != RECLAIM:
            continue
        target = decision.target_nodes
        rule = decision.explanation.rule
        if ej.job.is_pending and target == 0 and decision.job_id in returning:
            target, rule = returning[decision.job_id], RETURNING
        if ej.job.is_pending:
            # A plan that places the job names one of its partitions (policy placement
            # options): the pin narrows the job to it in the same update.
            place = decision.partition if target > 0 else None
            narrows = place is not None and ej.job.partitions != (place,)
            own = narrowed.get(decision.job_id, ej.job.partitions)
            stuck = decision.job_id in narrowed and (
                target == 0 or (not narrows and decision.job_id in overdue)
            )
            if stuck:
                back = (("partition", ",".join(own)), ("submitted", ",".join(own)))
                size = target or ej.job.node_count
                pins.append(Action(ActionKind.START_AT_SIZE, ej.job.job_id, 0, size, WIDEN, back))
            elif target > 0 and (narrows or not pinned_to(ej.job, target)):
                extra = (
                    (("partition", place), ("submitted", ",".join(own)))
                    if place is not None
                    else ()
                )
                pins.append(Action(ActionKind.START_AT_SIZE, ej.job.job_id, 0, target, rule, extra))
            continue
        if not ej.job.is_running:
            continue
        current = ej.effective_nodes
        if target > current:
            grows.append(
                Action(
                    ActionKind.GROW,
                    ej.job.job_id,
                    current,
                    target,
                    reason=rule,
                    extra=(("companion_nodes", str(target - current)),),
                )
            )
        elif 0 < target < current:
            layout = shrink_layout(ej, target)
            waiting = decision.explanation.waiting_job
            # A reclaim names the job it frees nodes for (status, metrics, the journal).
            reclaim = () if waiting is None else (("reclaim_for", str(waiting)),)
            shrinks.append(
                Action(
                    ActionKind.SHRINK,
                    ej.job.job_id,
                    current,
                    target,
                    reason=rule,
                    extra=(
                        ("parent_nodes", str(layout.parent_nodes)),
                        # The parent's own size before: parent_nodes below it means a
                        # NumNodes= shrink (after which Slurm 22.05 may leak a node).
                        ("parent_from", str(ej.job.node_count)),
                        ("cancel_companions", ",".join(map(str, layout.cancel_companions))),
                        # Their sizes, in the same order: the job may end them itself
                        # before it acks (Executor._as_instructed).
                        ("cancel_companion_nodes", _node_counts(ej, layout.cancel_companions)),
                        ("keep_nodes", ",".join(layout.keep_nodes)),
                        *reclaim,
                    ),
                )
            )
    return [*pins, *shrinks, *grows]


def last_planned_size(entries: Iterable[JournalEntry]) -> int | None:
    """The size the policy last chose for a job: the target of its newest applied pin,
    grow or shrink (a grow whose companion failed is not applied), or None."""
    sized = (ActionKind.START_AT_SIZE, ActionKind.GROW, ActionKind.SHRINK)
    applied = [e for e in entries if e.kind in sized and e.status is ActionStatus.APPLIED]
    return max(applied, key=lambda e: e.id).action.to_nodes if applied else None


def narrowed_from(entries: Iterable[JournalEntry], partition: str) -> tuple[tuple[str, ...], float]:
    """(the partitions a pending job was submitted to, since when it has waited where it
    is), when the daemon narrowed it to ``partition`` and nothing has moved it since (its
    newest applied pin that set a partition set that one); else ``((), 0.0)`` (never
    narrowed, given back, or moved by its user)."""
    placed = [
        e
        for e in entries
        if e.kind is ActionKind.START_AT_SIZE
        and e.status is ActionStatus.APPLIED
        and "partition" in dict(e.action.extra)
    ]
    if not placed:
        return (), 0.0
    newest = max(placed, key=lambda e: e.id)
    extra = dict(newest.action.extra)
    if extra["partition"] != partition or not extra.get("submitted"):
        return (), 0.0
    # A re-pin to the same partition (a new size) keeps the time of the first: the job
    # has waited there since.
    moved = max((e.id for e in placed if dict(e.action.extra)["partition"] != partition), default=0)
    since = min(e.updated_at for e in placed if e.id > moved)
    return tuple(extra["submitted"].split(",")), since


def _node_counts(ej: ElasticJob, companions: tuple[int, ...]) -> str:
    sizes = {c.job_id: c.node_count for c in ej.running_companions}
    return ",".join(str(sizes.get(c, 0)) for c in companions)


def companion_cleanup(
    classification: Classification,
    now: float,
    pending_timeout_s: float,
    orphan_grace_s: float = 0.0,
) -> list[Action]:
    """Cancel orphans, and companions that Slurm has kept pending for too long.

    An orphan whose parent completed less than ``orphan_grace_s`` ago is left to end by
    itself: its training is done, and a cancelled job gets Slurm's "CANCELLED" error lines
    in its output.  Any other orphan (its parent failed, was cancelled, or is gone from the
    snapshot) is cancelled at once."""
    actions: list[Action] = []
    for job, why in classification.orphans:
        parent = classification.companions.get(job.job_id)
        ended = classification.completed_parents.get(parent) if parent is not None else None
        if ended is not None and now - ended < orphan_grace_s:
            continue
        actions.append(_cancel(job, why))
    for ej in classification.elastic.values():
        for comp in ej.pending_companions:
            if comp.submit_time is not None and now - comp.submit_time > pending_timeout_s:
                waited = now - comp.submit_time
                actions.append(_cancel(comp, f"pending {waited:.0f}s > {pending_timeout_s:.0f}s"))
    return actions


def _cancel(companion: JobView, why: str) -> Action:
    return Action(
        ActionKind.CANCEL_COMPANION,
        companion.job_id,
        companion.node_count,
        0,
        reason=why,
        extra=(("parent", companion.comment.rsplit("=", 1)[-1]),),
    )
