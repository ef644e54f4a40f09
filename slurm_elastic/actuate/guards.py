"""Guard rails: pure functions that say whether a planned change may happen now.

Every knob has a name in the ``guards`` config section.  A guard returns ``None`` when
it lets the change through, or a short stable reason when it blocks it; the reason
ends up in the job's status row and in the log, so an operator can see which rule
fired.  Time is always passed in.

Two kinds of guard:

* freeze guards (``freeze_reason``) run *before* the policy: a frozen job keeps its
  current size in the plan, so the solver does not count on nodes it cannot get back
  (cooldown after our own resize, minimum dwell at a size, an action in flight);
* action guards (``block_reason``) run on each action the diff proposes: elastic flag,
  min/max, the batch host, the TimeLimit, and payback of the resize cost; a grow also
  waits out the backoff after failed companions, and stops after too many
  (``grow_retry_reason``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from slurm_elastic.actuate.journal import JOB_SHAPE, Refusal, Retry
from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.policy.capacity import RECLAIM
from slurm_elastic.types import Action, ActionKind, JobView, Outlook

# Actions that restart the job's workers at a new size and so count against
# ``max_resizes_per_cycle``; pinning a pending job and cancelling companions do not.
RESIZE_KINDS = frozenset({ActionKind.SHRINK, ActionKind.GROW})


@dataclass(frozen=True, slots=True)
class GuardKnobs:
    enforce: bool = False  # mode: shadow (False) computes and publishes but never acts
    cooldown_s: float = 120.0
    min_dwell_s: float = 300.0
    max_resizes_per_cycle: int = 2
    payback_horizon_s: float = 1800.0
    hard_shrink: bool = False
    reclaim_hard_shrink: bool = True
    ack_timeout_s: float = 60.0
    time_limit_margin_s: float = 300.0
    stale_snapshot_s: float = 60.0
    default_resize_cost_s: float = 30.0
    companion_fail_window_s: float = 60.0
    companion_retry_backoff_s: float = 60.0
    companion_max_failures: int = 3
    refusal_hold_s: float = 3600.0
    retry_backoff_s: float = 2.0
    retry_backoff_max_s: float = 120.0

    @classmethod
    def from_config(cls, config: object) -> GuardKnobs:
        """From a ``slurm_elastic.config.Config`` (typed loosely to keep this module pure)."""
        g = config.guards  # type: ignore[attr-defined]
        return cls(
            enforce=config.mode == "enforce",  # type: ignore[attr-defined]
            cooldown_s=g.cooldown_s,
            min_dwell_s=g.min_dwell_s,
            max_resizes_per_cycle=g.max_resizes_per_cycle,
            payback_horizon_s=g.payback_horizon_s,
            hard_shrink=g.hard_shrink,
            reclaim_hard_shrink=g.reclaim_hard_shrink,
            ack_timeout_s=g.ack_timeout_s,
            time_limit_margin_s=g.time_limit_margin_s,
            stale_snapshot_s=g.stale_snapshot_s,
            refusal_hold_s=g.refusal_hold_s,
            retry_backoff_s=g.retry_backoff_s,
            retry_backoff_max_s=g.retry_backoff_max_s,
            default_resize_cost_s=config.model.default_resize_cost_s,  # type: ignore[attr-defined]
            companion_fail_window_s=config.grow.companion_fail_window_s,  # type: ignore[attr-defined]
            companion_retry_backoff_s=config.grow.companion_retry_backoff_s,  # type: ignore[attr-defined]
            companion_max_failures=config.grow.companion_max_failures,  # type: ignore[attr-defined]
        )


# --------------------------------------------------------------------------- freeze


def size_since(job: JobView, last_resize_at: float | None) -> float | None:
    """When the job reached its current size: start, Slurm's resize time, or our last resize."""
    times = [t for t in (job.start_time, job.resize_time, last_resize_at) if t is not None]
    return max(times) if times else None


def freeze_reason(
    ej: ElasticJob,
    knobs: GuardKnobs,
    now: float,
    *,
    last_resize_at: float | None,
    in_flight: str | None,
) -> str | None:
    """Why the job must keep its current size this cycle, or None."""
    return busy_reason(ej, in_flight) or dwell_reason(ej, knobs, now, last_resize_at)


def busy_reason(ej: ElasticJob, in_flight: str | None) -> str | None:
    """An action of ours on the job is under way: nothing else may change its size."""
    if in_flight:
        return in_flight
    if ej.pending_companions:
        return f"grow: companion {ej.pending_companions[0].job_id} pending"
    return None


def dwell_reason(
    ej: ElasticJob, knobs: GuardKnobs, now: float, last_resize_at: float | None
) -> str | None:
    """The job resized too recently to resize again (cooldown, minimum dwell).  Unlike
    ``busy_reason`` this protects the job's own progress, not an action: a reclaim may
    still take back its loan (``ElasticDemand.loan_yields``)."""
    if not ej.job.is_running:
        return None  # pending jobs have no size to dwell at
    if last_resize_at is not None and now - last_resize_at < knobs.cooldown_s:
        return f"cooldown ({knobs.cooldown_s - (now - last_resize_at):.0f}s left)"
    since = size_since(ej.job, last_resize_at)
    if since is not None and now - since < knobs.min_dwell_s:
        return f"min dwell ({knobs.min_dwell_s - (now - since):.0f}s left)"
    return None


# --------------------------------------------------------------------------- refusals


def job_shape(job: JobView) -> str:
    """A digest of what Slurm's answer to a pin or shrink depends on that the job's owner or
    an admin can change: its partitions, QOS, account, node range, time limit, GPUs and its
    run (a requeue starts a new one).  The executor notes it with each pin and shrink
    (``journal.JOB_SHAPE``); a refusal holds only while the job keeps it."""
    fields = (
        job.partition,
        job.qos,
        job.account,
        job.min_nodes,
        job.max_nodes,
        job.node_count,
        job.time_limit_s,
        job.gpus_per_node,
        job.restart_count,
        job.start_time,
    )
    return hashlib.blake2s(repr(fields).encode(), digest_size=8).hexdigest()


def with_job_shape(action: Action, job: JobView) -> Action:
    """``action`` with the job's shape noted in its extra (``job_shape``)."""
    return replace(action, extra=(*action.extra, (JOB_SHAPE, job_shape(job))))


def refusal_bars(
    refusals: Iterable[Refusal],
    elastic: Mapping[int, ElasticJob],
    now: float,
    hold_s: float,
) -> dict[tuple[int, ActionKind], str]:
    """(job, kind) -> why, for the actions Slurm refused on a job that still stands as it
    was refused (the executor's ``refused`` journal rows): a start-at-size refusal holds
    while the job is pending; a shrink refusal while the job runs the allocation it was
    refused in (a requeued job starts afresh).  Either holds ``hold_s`` at most
    (``guards.refusal_hold_s``) and only while the job keeps the shape it had when refused
    (``job_shape``): then the action may be asked once more.

    Slurm refuses for reasons the daemon cannot always see coming (a job with
    ``--distribution=arbitrary`` cannot change its node count from 23.11 on, and 24.11's
    squeue and scontrol do not show the distribution), so a refusal is kept as a fact about
    the job, with Slurm's message as its reason in ``status``: the policy is offered no size
    that needs the barred action (``daemon.problem``), and the guard blocks any that comes.
    Only refusals Slurm gives as final get here: "try again" answers are retries
    (``retry_bars``), never facts.
    """
    bars: dict[tuple[int, ActionKind], str] = {}
    for r in refusals:
        ej = elastic.get(r.job_id)
        if ej is None:
            continue
        job = ej.job
        if r.kind is ActionKind.START_AT_SIZE:
            holds = job.is_pending
        elif r.kind is ActionKind.SHRINK:
            holds = job.is_running and (job.start_time is None or r.at >= job.start_time)
        else:
            holds = False
        left = r.at + hold_s - now
        if not holds or left <= 0 or (r.shape and r.shape != job_shape(job)):
            continue
        what = r.kind.value.replace("_", " ")
        bars[(r.job_id, r.kind)] = (
            f"{what} refused by Slurm: {r.detail} (barred {left:.0f}s more, or until the job "
            "changes)"
        )
    return bars


def retry_wait_s(count: int, knobs: GuardKnobs) -> float:
    """The wait after ``count`` temporary answers in a row: ``retry_backoff_s`` doubled per
    answer after the first, at most ``retry_backoff_max_s``."""
    if count <= 0:
        return 0.0
    return min(knobs.retry_backoff_max_s, knobs.retry_backoff_s * 2.0 ** min(count - 1, 60))


def retry_bars(
    retries: Iterable[Retry], knobs: GuardKnobs, now: float
) -> dict[tuple[int, ActionKind], str]:
    """(job, kind) -> why, for the actions whose last attempts Slurm answered "not now" (or
    that found no Slurm: journal ``retry`` rows) while their backoff runs (``retry_wait_s``).
    A bar for that long only: after it the action is proposed like any other, however many
    answers came before, because Slurm said nothing about the request itself."""
    bars: dict[tuple[int, ActionKind], str] = {}
    for r in retries:
        left = r.at + retry_wait_s(r.count, knobs) - now
        if left > 0:
            what = r.kind.value.replace("_", " ")
            bars[(r.job_id, r.kind)] = (
                f"{what} to retry in {left:.0f}s: Slurm said not now "
                f"({r.count} in a row): {r.detail}"
            )
    return bars


def stepmgr_bars(elastic: Mapping[int, ElasticJob]) -> dict[tuple[int, ActionKind], str]:
    """(job, SHRINK) -> why, for each running job whose steps Slurm's step manager runs
    (``JobView.stepmgr``: the job flag ``STEPMGR_ENABLED``).  Known before acting: a shrink
    of such a job does not tell the step manager to end the steps on the removed nodes, so
    they run on there (SchedMD ticket 25167, fixed after 26.05: every version of the
    matrix that has a step manager, 24.11 and 26.05; 22.05 has none).  Slurm accepts that
    shrink, so no refusal would ever say so.  A pending one is barred too: it starts at its
    smallest size (``daemon.problem.elastic_demand``)."""
    return {
        (job_id, ActionKind.SHRINK): "shrink barred: the job's steps run under Slurm's step "
        "manager (STEPMGR_ENABLED), which a shrink leaves running on the removed nodes up to "
        "Slurm 26.05"
        for job_id, ej in elastic.items()
        if ej.job.stepmgr and (ej.job.is_running or ej.job.is_pending)
    }


# --------------------------------------------------------------------------- actions


def block_reason(
    action: Action,
    ej: ElasticJob | None,
    knobs: GuardKnobs,
    now: float,
    outlook: Outlook | None = None,
    *,
    agent_seen: bool = True,
) -> str | None:
    """Why ``action`` must not be applied, or None.  ``ej`` is None for non-elastic jobs.

    ``agent_seen``: the job's agent has reported at least once.  A graceful shrink of a
    job without one would only wait out ``ack_timeout_s`` and roll back, so it is not
    even started unless ``hard_shrink`` allows shrinking without an ack.
    """
    if action.kind is ActionKind.CANCEL_COMPANION:
        return None  # diff only proposes these for jobs carrying the companion comment
    if ej is None:
        return "not elastic"
    spec = ej.spec
    if action.to_nodes < spec.min_nodes:
        return f"below min ({action.to_nodes} < {spec.min_nodes})"
    if action.to_nodes > spec.max_nodes:
        return f"above max ({action.to_nodes} > {spec.max_nodes})"
    if action.kind is ActionKind.START_AT_SIZE:
        return None if ej.job.is_pending else "not pending"
    if not ej.job.is_running:
        return "not running"
    if action.kind is ActionKind.SHRINK:
        if not agent_seen and not forced_on_timeout(action, knobs):
            return "no agent has reported (hard_shrink off)"
        return _batch_host_reason(action, ej.job) or _time_limit_reason(
            action, ej.job, knobs, now, outlook
        )
    return _payback_reason(action, knobs, outlook)


def forced_on_timeout(action: Action, knobs: GuardKnobs) -> bool:
    """Whether a graceful shrink is applied anyway when its agent does not answer in time
    or refuses: every shrink with ``hard_shrink``, a reclaim's with ``reclaim_hard_shrink``."""
    return knobs.hard_shrink or (knobs.reclaim_hard_shrink and action.reason == RECLAIM)


def _batch_host_reason(action: Action, job: JobView) -> str | None:
    parent_nodes = int(dict(action.extra).get("parent_nodes", action.to_nodes))
    if parent_nodes < 1:
        return "would remove the batch host"
    if job.batch_host is not None and job.nodes and job.batch_host not in job.nodes[:parent_nodes]:
        # Slurm keeps the first N nodes on NumNodes=N; the batch host must be among them.
        return "would remove the batch host"
    return None


def _time_limit_reason(
    action: Action, job: JobView, knobs: GuardKnobs, now: float, outlook: Outlook | None
) -> str | None:
    if job.time_limit_s is None or job.start_time is None or outlook is None:
        return None
    left = job.start_time + job.time_limit_s - now
    at_now = outlook.at(action.from_nodes)
    at_target = outlook.at(action.to_nodes)
    if at_now is None or at_target is None:
        return None
    margin = knobs.time_limit_margin_s
    finishes_now = at_now.remaining_s + margin <= left
    finishes_after = at_target.remaining_s + outlook.resize_cost_s + margin <= left
    if finishes_now and not finishes_after:
        return "would miss TimeLimit"
    return None


def _payback_reason(action: Action, knobs: GuardKnobs, outlook: Outlook | None) -> str | None:
    """A grow must win back the progress its restart costs within the payback horizon.

    ``payback_horizon_s: 0`` turns this guard off.
    """
    if outlook is None or knobs.payback_horizon_s <= 0:
        return None
    at_now = outlook.at(action.from_nodes)
    at_target = outlook.at(action.to_nodes)
    if at_now is None or at_target is None:
        return None
    cost = outlook.resize_cost_s * at_now.throughput
    window = min(knobs.payback_horizon_s, at_target.remaining_s)
    if not math.isfinite(window):
        window = knobs.payback_horizon_s
    gain = (at_target.throughput - at_now.throughput) * max(0.0, window - outlook.resize_cost_s)
    if gain <= cost:
        return f"payback: gain {gain:.0f} <= cost {cost:.0f} steps"
    return None


def grow_retry_reason(
    failures: int, last_failed_at: float | None, last_detail: str, knobs: GuardKnobs, now: float
) -> str | None:
    """Why a job whose last ``failures`` grows in a row failed (sbatch refused, or the
    companion failed at once) must not grow now: given up after
    ``companion_max_failures``, else a backoff of ``companion_retry_backoff_s`` doubled
    per failure after the first.  None when it may try."""
    if failures <= 0:
        return None
    last = f" (last: {last_detail})" if last_detail else ""
    if failures >= knobs.companion_max_failures:
        return f"grow given up: {failures} companions failed in a row{last}"
    wait = knobs.companion_retry_backoff_s * 2 ** (failures - 1)
    if last_failed_at is not None and now - last_failed_at < wait:
        left = wait - (now - last_failed_at)
        return f"grow backoff: {failures} failed, next try in {left:.0f}s{last}"
    return None


def limit_resizes(actions: Iterable[Action], max_resizes: int) -> tuple[list[Action], list[Action]]:
    """Keep at most ``max_resizes`` resizes (in the given order); others wait a cycle."""
    taken: list[Action] = []
    deferred: list[Action] = []
    count = 0
    for action in actions:
        if action.kind in RESIZE_KINDS:
            if count >= max_resizes:
                deferred.append(action)
                continue
            count += 1
        taken.append(action)
    return taken, deferred
