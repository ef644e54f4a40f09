"""What decide, estimate and actuate know about each job, derived from one snapshot (pure).

The neutral ground of the daemon's layers: the problem builder (decide), the estimator and
the executor (actuate) all read the cluster through it, and it imports none of them.

``classify`` sorts every job of a snapshot into exactly one class:

* an elastic parent (valid marker, not het, not a companion, managed partition) with
  its active companion jobs folded in — the policy sees the parent's *effective* size
  (its own nodes plus its running companions' nodes);
* a companion — a job the daemon submitted to grow a parent, as its journal links them
  (``links``: companion id -> parent id), or an orphan when the parent is gone or no
  longer running.  The daemon's own record, never the job's comment
  (``slurm-elastic:companion-of=<PARENT>``, which the owner can change after submission):
  a companion whose comment, name or work directory its owner changed is still counted
  as its parent's nodes on loan, still reclaimed, still cancelled with its parent.  Only
  callers without a journal (tools, tests) fall back on the comments (``comment_links``);
* anything else, with the reason it is not elastic ("not elastic", "malformed marker:
  ...", "comment not trusted, ...", "heterogeneous job", ...).  Those jobs are never
  touched.

Beside it: when a companion job is an orphan (``orphan_reason``; the companion token's
grammar, ``companion_parent``, is ``marker``'s), the layout of a shrink (``shrink_layout``:
which companions go, how many of the parent's own nodes stay), the sizes a job may be
offered (``offered_sizes``), and the pending jobs Slurm will not start whatever the free
nodes (``not_eligible``: the problem builder leaves them out, the controller freezes them).
And the GPU type of each partition (``partition_gpu_types``), for placing jobs by GPU kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from slurm_elastic.errors import MarkerError, OutOfReach
from slurm_elastic.marker import companion_parent, untrusted
from slurm_elastic.types import (
    MIXED_GPU_TYPE,
    ClusterSnapshot,
    ElasticSpec,
    JobState,
    JobView,
    PartitionView,
)

# job -> its spec, None (no marker), or raises MarkerError (malformed marker; OutOfReach
# when its minimum is more than its partitions can ever give).
SpecResolver = Callable[[JobView], ElasticSpec | None]


@dataclass(frozen=True, slots=True)
class ElasticJob:
    job: JobView
    spec: ElasticSpec
    companions: tuple[JobView, ...] = ()  # active companions, oldest first
    # Derived from the fields above once, at construction (the object is immutable): a
    # cycle reads them several times per job, and they were a visible share of its cost.
    _running: tuple[JobView, ...] = field(init=False, repr=False, compare=False)
    _pending: tuple[JobView, ...] = field(init=False, repr=False, compare=False)
    _effective: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built for every elastic job every cycle, and most have no companion.
        running: tuple[JobView, ...] = ()
        pending: tuple[JobView, ...] = ()
        grown = 0
        if self.companions:
            running = tuple(c for c in self.companions if c.state is JobState.RUNNING)
            pending = tuple(c for c in self.companions if c.state is JobState.PENDING)
            grown = sum(c.node_count for c in running)
        effective = self.job.node_count + grown if self.job.is_running else 0
        object.__setattr__(self, "_running", running)
        object.__setattr__(self, "_pending", pending)
        object.__setattr__(self, "_effective", effective)

    @property
    def running_companions(self) -> tuple[JobView, ...]:
        return self._running

    @property
    def pending_companions(self) -> tuple[JobView, ...]:
        return self._pending

    @property
    def effective_nodes(self) -> int:
        """Nodes the job trains on now: 0 while pending, else its own plus running companions."""
        return self._effective

    @property
    def pending_companion_nodes(self) -> int:
        return sum(c.node_count for c in self.pending_companions)


@dataclass(frozen=True, slots=True)
class Classification:
    elastic: Mapping[int, ElasticJob]
    companions: Mapping[int, int]  # companion job id -> parent id (every active companion)
    orphans: tuple[tuple[JobView, str], ...]  # companion, why it is an orphan
    not_elastic: Mapping[int, str]  # job id -> reason (companions included)
    jobs: Mapping[int, JobView] = field(default_factory=dict)
    # Parents of orphans that the snapshot still shows COMPLETED: job id -> end time.
    completed_parents: Mapping[int, float] = field(default_factory=dict)


def comment_links(jobs: Collection[JobView]) -> dict[int, int]:
    """Companion id -> parent id as the jobs' comments claim it: for callers without the
    daemon's journal (tools, tests) and for adopting, after a crash, a companion whose
    ``sbatch`` ran before its link was written (``actuate.reconcile``)."""
    out = {}
    for job in jobs:
        parent_id = companion_parent(job.comment)
        if parent_id is not None:
            out[job.job_id] = parent_id
    return out


def classify(
    snapshot: ClusterSnapshot,
    resolve_spec: SpecResolver,
    partition_allowed: Callable[[str], bool] = lambda _p: True,
    links: Mapping[int, int] | None = None,
) -> Classification:
    """Sort the snapshot's active jobs into the classes of the module doc (pure).
    ``links``: companion id -> parent id, the daemon's journal; None reads the comments
    (``comment_links``)."""
    active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
    if links is None:
        links = comment_links(active.values())
    elastic_specs: dict[int, ElasticSpec] = {}
    not_elastic: dict[int, str] = {}
    companions_of: dict[int, list[JobView]] = {}
    companion_parent_of: dict[int, int] = {}
    for job in active.values():
        parent_id = links.get(job.job_id)
        if parent_id is not None:
            companion_parent_of[job.job_id] = parent_id
            companions_of.setdefault(parent_id, []).append(job)
            parent = active.get(parent_id)
            # A token naming another user's job links nothing (it is neither counted for
            # that job nor cancelled with it): its REASON must not say it is a companion.
            not_elastic[job.job_id] = (
                f"companion of {parent_id}"
                if parent is None or parent.user == job.user
                else f"not a companion: its comment names job {parent_id}, another user's"
            )
            continue
        reason, spec = _elastic_or_reason(job, resolve_spec, partition_allowed)
        if spec is None:
            not_elastic[job.job_id] = reason
        else:
            elastic_specs[job.job_id] = spec

    elastic: dict[int, ElasticJob] = {}
    orphans: list[tuple[JobView, str]] = []
    for job_id, spec in elastic_specs.items():
        parent = active[job_id]
        mine = companions_of.get(job_id)
        # Another user's job naming this parent is not ours to count (or to cancel).
        kept = (
            tuple(sorted((c for c in mine if c.user == parent.user), key=lambda c: c.job_id))
            if mine
            else ()
        )
        elastic[job_id] = ElasticJob(job=parent, spec=spec, companions=kept)
    for comp_id in sorted(companion_parent_of):
        why = orphan_reason(active[comp_id], companion_parent_of[comp_id], active)
        if why is not None:
            orphans.append((active[comp_id], why))
    completed: dict[int, float] = {}
    if orphans:
        wanted = {companion_parent_of[c.job_id] for c, _ in orphans}
        for job in snapshot.jobs:
            if job.job_id in wanted and job.state is JobState.COMPLETED and job.end_time:
                completed[job.job_id] = job.end_time
    return Classification(
        elastic=elastic,
        companions=companion_parent_of,
        orphans=tuple(orphans),
        not_elastic=not_elastic,
        jobs=active,
        completed_parents=completed,
    )


def _elastic_or_reason(
    job: JobView, resolve_spec: SpecResolver, partition_allowed: Callable[[str], bool]
) -> tuple[str, ElasticSpec | None]:
    why = untrusted(job.comment)
    if why is not None:
        return f"comment not trusted, job left alone: {why}", None
    try:
        spec = resolve_spec(job)
    except OutOfReach as exc:
        return f"out of reach: {exc}", None
    except MarkerError as exc:
        return f"malformed marker: {exc}", None
    if spec is None:
        return "not elastic", None
    if job.is_het:
        return "heterogeneous job (not resized)", None
    if not partition_allowed(job.partition):
        return f"partition {job.partition} not managed", None
    return "", spec


# --------------------------------------------------------------------------- companions


def orphan_reason(companion: JobView, parent_id: int, active: Mapping[int, JobView]) -> str | None:
    """Why an active ``companion`` of ``parent_id`` should be cancelled, or None while its
    parent runs.

    ``active`` maps job ids to the active jobs of the same snapshot.  A job linked to a
    parent owned by someone else is not a companion of ours: None, never cancelled.
    """
    if companion.state is JobState.COMPLETING:
        return None  # already ending
    parent = active.get(parent_id)
    if parent is None:
        return f"orphan: parent {parent_id} has ended"
    if parent.user != companion.user:
        return None
    if parent.state is not JobState.RUNNING:
        return f"orphan: parent {parent_id} is {parent.state.value.lower()}"
    return None


# --------------------------------------------------------------------------- shrink layout


@dataclass(frozen=True, slots=True)
class ShrinkLayout:
    cancel_companions: tuple[int, ...]  # companion job ids to cancel, newest first
    parent_nodes: int  # the parent's own node count afterwards
    keep_nodes: tuple[str, ...]  # every node the job keeps (parent first, then companions)


def shrink_layout(ej: ElasticJob, target: int) -> ShrinkLayout:
    """Drop whole companions first (newest first), then trim the parent's tail.

    Companions go first because cancelling a job frees exactly its nodes, while the
    parent's ``NumNodes=N`` keeps its first N nodes, the batch host among them.
    """
    running = ej.running_companions
    n_kept, parent_nodes = shrink_split(
        ej.effective_nodes, ej.job.node_count, tuple(c.node_count for c in running), target
    )
    kept = running[:n_kept]
    cancel = tuple(c.job_id for c in reversed(running[n_kept:]))
    keep = (*ej.job.nodes[:parent_nodes], *(n for c in kept for n in c.nodes))
    return ShrinkLayout(cancel, parent_nodes, tuple(keep))


def shrink_split(
    effective: int, own: int, companion_nodes: tuple[int, ...], target: int
) -> tuple[int, int]:
    """``shrink_layout`` in numbers: (how many running companions, oldest first, stay;
    the parent's own node count afterwards) for a job of ``effective`` nodes, ``own`` of
    them its own, whose running companions hold ``companion_nodes``."""
    kept = len(companion_nodes)
    total = effective
    while kept and total - companion_nodes[kept - 1] >= target:
        kept -= 1
        total -= companion_nodes[kept]
    return kept, min(own, target - sum(companion_nodes[:kept]))


# --------------------------------------------------------------------------- sizes


def offered_sizes(ej: ElasticJob) -> tuple[int, ...]:
    """The sizes the policy may choose for the job, ascending: its spec's sizes, plus its
    current size when running, less the sizes a shrink cannot reach.

    Three size sets, each with one home: ``ElasticSpec.allowed_sizes`` is the grid the
    user's marker promises; this is that grid as the job's state allows it now (the
    problem's ``ElasticDemand.allowed_sizes``); ``ElasticDemand.candidate_sizes`` are the
    values the solver picks from (0 added for a pending job, the current size alone for
    a frozen one).

    A shrink (``shrink_layout``) cancels whole companions (newest first) and then trims
    the parent's own nodes, keeping at least the batch host, so a size that would leave
    the parent with no node of its own while companions remain (2 own + a 4-node
    companion cannot become 3) cannot be reached; the guards would block that shrink.
    Offering it to the policy would let the plan count on nodes it cannot free (pending
    jobs it "starts" with them stay pending), so it is not a candidate.
    """
    running = ej.running_companions
    return _offered_sizes(
        ej.spec,
        ej.effective_nodes,
        ej.job.node_count,
        tuple(c.node_count for c in running) if running else (),
    )


# Asked for every elastic job every cycle, from a few small numbers that rarely change
# (~10 us a job with the set, the sort and a shrink layout per size): computed once each.
@functools.lru_cache(maxsize=4096)
def _offered_sizes(
    spec: ElasticSpec, current: int, own: int, companion_nodes: tuple[int, ...]
) -> tuple[int, ...]:
    sizes = set(spec.allowed_sizes)
    if current > 0:
        # The current size is always a choice, so "no change" stays feasible whatever
        # the step; it may lie off the grid after an earlier hard resize.
        sizes.add(current)
        if companion_nodes:
            sizes = {
                s
                for s in sizes
                if s >= current or shrink_split(current, own, companion_nodes, s)[1] >= 1
            }
    return tuple(sorted(sizes))


def with_partitions(cls: Classification, lists: Mapping[int, tuple[str, ...]]) -> Classification:
    """``cls`` with each listed pending job shown in those partitions (``Partition=a,b``):
    what the daemon plans a job it narrowed among again (``actuate.diff.narrowed_from``)."""
    if not lists:
        return cls
    elastic = dict(cls.elastic)
    for job_id, partitions in lists.items():
        ej = elastic[job_id]
        elastic[job_id] = replace(ej, job=replace(ej.job, partition=",".join(partitions)))
    return replace(cls, elastic=elastic)


def pinned_to(job: JobView, nodes: int) -> bool:
    """Whether a pending job's node request is exactly ``nodes`` (``NumNodes=n-n``).
    Slurm 22.05's JSON shows no maximum for a requeued job pending again (``max_nodes``
    0: ``slurm.parse_v0038``), so there the minimum alone says it."""
    return job.min_nodes == nodes and job.max_nodes in (nodes, None)


# --------------------------------------------------------------------------- eligibility

# squeue's state_reason for pending jobs that cannot start now, as Slurm 22.05 spells it
# (tests/fixtures/slurm/22.05/squeue-held-dependency.json), with the REASON shown.  Limits
# (QOS*/Assoc*Limit) are not here: a smaller size may be what lets such a job start.
NOT_ELIGIBLE_REASONS: Mapping[str, str] = {
    "JobHeldUser": "held",  # sbatch --hold, scontrol uhold (priority 0)
    "JobHeldAdmin": "held",  # scontrol hold by an operator (priority 0)
    "JobHoldMaxRequeue": "held",  # requeued too often, held by Slurm
    "Dependency": "dependency",
    "DependencyNeverSatisfied": "dependency never satisfied",
    "BeginTime": "begin time",  # --begin in the future, or just requeued
    "Reservation": "reservation not started",
}


def not_eligible_reason(job: JobView) -> str | None:
    """Why Slurm will not start this pending job now whatever the free nodes, or None."""
    if job.state not in (JobState.PENDING, JobState.REQUEUED):
        return None
    return NOT_ELIGIBLE_REASONS.get(job.state_reason)


def not_eligible(
    classification: Classification, now: float | None = None, requeue_window_s: float = 0.0
) -> dict[int, str]:
    """Elastic jobs that get no capacity this cycle, with the reason.

    Not among them: a requeued job (preempted, or ``scontrol requeue``) waiting out the
    begin time Slurm gave it, when that comes within ``requeue_window_s`` of ``now``.  Slurm
    starts such a job the moment its begin time passes, at the size pinned for its last
    run, before a cycle could pin another; so it is planned like any pending job, and it
    comes back at the size the policy chooses."""
    return {
        job_id: why
        for job_id, ej in classification.elastic.items()
        if (why := not_eligible_reason(ej.job)) is not None
        and not _requeued_soon(ej.job, now, requeue_window_s)
    }


def _requeued_soon(job: JobView, now: float | None, window_s: float) -> bool:
    begins = job.eligible_time
    return (
        now is not None
        and job.restart_count > 0
        and job.state_reason == "BeginTime"
        and begins is not None
        and begins <= now + window_s
    )


# --------------------------------------------------------------------------- GPU types


def partition_gpu_types(
    snapshot: ClusterSnapshot, configured: Mapping[str, str] | None = None
) -> Mapping[str, str]:
    """Partition name -> the type of its GPUs, for every partition of the snapshot (pure).

    A partition's type is that of its usable nodes with GPUs (``NodeView.gpu_type``; its
    members as Slurm lists them in the partition, as ``daemon.problem.node_pools`` reads
    them), whatever the partition's state: a type is a fact of the hardware, and the
    partition's state is the scheduler's business.  Sites put each GPU generation in a
    partition of its own, so one type is the rule:

    * all of them share one type: that type ("" when it is untyped: ``gpu:4``);
    * none (no GPU node, or every GPU node down or drained): "" -- nothing to say, and a
      node that comes back brings its type with it;
    * several types, or typed beside untyped nodes (whose type nobody knows):
      :data:`~slurm_elastic.types.MIXED_GPU_TYPE`, never the most common type -- a job there
      may land on either kind, and a per-type speed would then be a guess.  A node whose own
      gres hold several types is "mixed" too and makes its partition so.

    ``configured`` (``cluster.gpu_types`` in the config: partition -> type, lower case)
    decides for the partitions it names, whatever their nodes say: for sites whose gres are
    untyped, or to settle a "mixed" one.  A configured partition that Slurm does not list is
    left out, like any partition the snapshot does not have.
    """
    by_name = {node.name: node for node in snapshot.nodes}
    types: dict[str, str] = {}
    for part in snapshot.partitions:
        if configured is not None and part.name in configured:
            types[part.name] = configured[part.name]
            continue
        seen = {
            node.gpu_type
            for name in part.nodes
            if (node := by_name.get(name)) is not None and node.gpus > 0 and node.is_usable
        }
        types[part.name] = seen.pop() if len(seen) == 1 else (MIXED_GPU_TYPE if seen else "")
    return types


# --------------------------------------------------------------------------- access


def may_use(
    job: JobView,
    partition: PartitionView,
    groups: Collection[str],
    *,
    slurm_user: str = "",
    parent_accounts: Collection[str] = (),
) -> bool:
    """Whether Slurm lets the job run in ``partition``, by its access lists (pure).

    Why: Slurm accepts a job listing a partition its user may not use beside one it may
    (``-p batch,private``), and root's narrowing of a pending job to such a partition
    strands it, pending for good (docs/design.md); so a placement offers only the
    partitions this says yes to.

    The rule is slurmctld's (``validate_group``, ``part_policy_valid_acct`` and
    ``part_policy_valid_qos`` in ``src/slurmctld/partition_mgr.c``, read at 22.05.8,
    24.11.5 and 26.05.3; checked when the job is scheduled, the groups on 22.05 at
    submission only):

    * AllowGroups (None: everyone): the user is root or SlurmUser (``slurm_user``), or
      one of its ``groups`` (every group it belongs to, its primary group included) is
      listed.
    * AllowAccounts: when set, the job's account must be listed, and DenyAccounts is
      ignored; else its account must not be in DenyAccounts.  From 24.11 on a listed
      account also covers its sub-accounts (pass the account's ancestors as
      ``parent_accounts`` there; 22.05 compares the account alone: pass none).
    * AllowQos: when set, the job's QOS must be listed (a job without a QOS may not run),
      and DenyQos is ignored; else its QOS must not be in DenyQos.  No one is exempt:
      root's job with an unlisted QOS stays pending on 22.05 and 24.11 (measured), though
      slurm.conf(5) says root may use any partition whatever its AllowQos.

    Account and QOS names compare in lower case (slurmctld lower-cases the lists), group
    names as they are.  Not modelled: 24.11 and later skip the account lists unless
    AccountingStorageEnforce has ``associations`` (applied here anyway: a no only narrows
    the placement), and slurmctld refuses everyone but root and SlurmUser when no user
    at all turned up as a member of the listed groups (group enumeration off).
    """
    if partition.allow_groups is not None:
        super_users = {"root", slurm_user} - {""}
        privileged = job.user_id == 0 or job.user in super_users
        if not privileged and not set(partition.allow_groups) & set(groups):
            return False
    accounts = {a.lower() for a in (job.account, *parent_accounts) if a}
    if partition.allow_accounts is not None:
        if not accounts & {a.lower() for a in partition.allow_accounts}:
            return False
    elif accounts & {a.lower() for a in partition.deny_accounts}:
        return False
    qos = job.qos.lower()
    if partition.allow_qos is not None:
        return qos in {q.lower() for q in partition.allow_qos}
    return qos not in {q.lower() for q in partition.deny_qos}
