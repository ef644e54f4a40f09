"""Snapshot -> AllocationProblem (pure).

* elastic demands: jobs with a valid elastic marker (see ``cluster_state.classify``),
  at their effective size (own nodes + running companions), frozen when a guard says so,
  offered only the sizes a shrink can reach (``cluster_state.offered_sizes``);
* loans: with ``reclaim`` (``policy.reclaim``) ``requested``, a running job is entitled to
  the nodes Slurm gave it itself (its own node count: its companions' nodes are on loan);
  ``minimum``: to its elastic minimum; ``off``: no loans.
  A job frozen only by dwell or cooldown (``yielding``) may still give its loan back;
* Slurm's priority, on every demand, orders the queue (``policy.capacity``);
* rigid demands: every other active job — plain jobs, het components, jobs with a
  malformed marker, orphan companions — and the *pending* companions of elastic jobs
  (they will take nodes when Slurm starts them).  Running companions of an elastic job
  are not rigid: their nodes are already counted in the parent's effective size, and
  counting them twice would make the solver see less capacity than there is;
* node pools: usable nodes of UP partitions, grouped by the exact set of partitions
  each node belongs to;
* placement (``Placing``, ``daemon.placement``): a pending job is only ever planned in
  partitions of its list that are UP and that its user may run in (a partition Slurm
  would not start it in is never planned for).  With ``policy.placement: plan`` one that
  may start in several gets one placement option per partition, each with the sizes that
  partition holds for it and its speed there, and the policy picks one; otherwise
  (``slurm``, the default) it is planned in the first of them and Slurm picks;
* pending jobs that Slurm will not start whatever the free nodes — held, waiting on a
  dependency, a begin time or a reservation that has not started (``cluster_state.
  not_eligible_reason``) — are left out: an elastic one gets no capacity this cycle (its
  REASON says why), a rigid one reserves nothing; except a job whose begin time comes
  within ``promise_window_s`` (``guards.payback_horizon_s``: sooner than a grow pays
  back): it is a rigid demand that is not startable yet, at its requested minimum, and
  running elastic jobs do not grow into its nodes (``policy.capacity``, promise rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from slurm_elastic.cluster_state import (
    Classification,
    ElasticJob,
    may_use,
    not_eligible,
    not_eligible_reason,
    offered_sizes,
)
from slurm_elastic.daemon.placement import own_partition, placement_options
from slurm_elastic.types import (
    AllocationProblem,
    ClusterSnapshot,
    ElasticDemand,
    JobState,
    JobView,
    NodePool,
    Outlook,
    PartitionView,
    PlacementOption,
    RigidDemand,
)


def _membership(partitions: Sequence[PartitionView]) -> Mapping[str, frozenset[str]]:
    """Node name -> the UP partitions it belongs to."""
    membership: dict[str, set[str]] = {}
    for part in partitions:
        if part.state.upper() != "UP":
            continue
        for node in part.nodes:
            membership.setdefault(node, set()).add(part.name)
    return {node: frozenset(parts) for node, parts in membership.items()}


def node_pools(snapshot: ClusterSnapshot) -> tuple[NodePool, ...]:
    """Usable nodes grouped by the exact set of UP partitions they belong to."""
    membership = _membership(snapshot.partitions)
    counts: Counter[frozenset[str]] = Counter()
    for node in snapshot.nodes:
        parts = membership.get(node.name)
        if parts and node.is_usable:
            counts[parts] += 1
    return tuple(
        NodePool(partitions=parts, nodes=n)
        for parts, n in sorted(counts.items(), key=lambda kv: sorted(kv[0]))
    )


def _capacities(partitions: Sequence[PartitionView]) -> Mapping[str, tuple[int, str]]:
    """Partition name -> (the most nodes one job can ever hold there, any node state: a
    node that is down now may come back; the partition's own QOS, "" when none)."""
    return {part.name: (part.job_capacity, part.qos) for part in partitions}


def partition_capacity(
    snapshot: ClusterSnapshot,
    qos_nodes: Mapping[str, int] | None = None,
    assoc_nodes: Mapping[tuple[str, str, str], int] | None = None,
) -> Callable[[JobView, str], int]:
    """(job, partition) -> the most nodes the job can ever hold in that listed partition
    (``job_capacity``'s rules, for one partition); 0 for a partition Slurm does not list."""
    capacities = _capacities(snapshot.partitions)
    qos = qos_nodes or {}
    assoc = assoc_nodes or {}

    def in_partition(job: JobView, name: str) -> int:
        if name not in capacities:
            return 0
        most, part_qos = capacities[name]
        for limit in (
            qos.get(part_qos),
            assoc.get((job.account, job.user, name), assoc.get((job.account, job.user, ""))),
            qos.get(job.qos),
        ):
            if limit is not None:
                most = min(most, limit)
        return most

    return in_partition


def access_rule(
    snapshot: ClusterSnapshot, groups_of: Callable[[str], Collection[str]]
) -> Callable[[JobView, str], bool]:
    """(job, partition) -> whether the job's user may run there (``cluster_state.may_use``,
    by the partition's access lists; ``groups_of``: a user's groups, asked only for a
    partition with AllowGroups).  A partition Slurm does not list: no."""
    by_name = {part.name: part for part in snapshot.partitions}

    def allowed(job: JobView, name: str) -> bool:
        part = by_name.get(name)
        if part is None:
            return False
        groups = groups_of(job.user) if part.allow_groups is not None else ()
        return may_use(job, part, groups)

    return allowed


def job_capacity(
    snapshot: ClusterSnapshot,
    qos_nodes: Mapping[str, int] | None = None,
    assoc_nodes: Mapping[tuple[str, str, str], int] | None = None,
    in_partition: Callable[[JobView, str], int] | None = None,
) -> Callable[[JobView], int]:
    """job -> the most nodes it can ever hold: the largest capacity among the partitions it
    may run in, or the cluster's node count when none of them is listed (a hidden one), and
    no more than its QOS's per-job node limit (``qos_nodes``: QOS name -> limit).

    A partition's capacity is the fewest of its nodes, its MaxNodes, the per-job node limit
    of the partition's own QOS and the ``MaxNodes`` of the job's user association there
    (``assoc_nodes``: (account, user, partition) -> limit; partition "" for all of them).

    Slurm enforces each of these on each job, and companions are jobs of their own: without
    this cap a job would grow past them.  Where several are set, Slurm applies the first in
    its order of precedence (partition QOS, job QOS, association); the fewest is never more
    than that one, so the cap never lets a job past what Slurm enforces, at the price of a
    smaller range where a partition's QOS grants more than the job's QOS does.

    Elastic ranges are capped at this every cycle (``marker.cap_spec``), so the sizes
    planned for a job -- its outlook, the solver's variables, the guards' checks -- never
    outnumber the cluster's nodes whatever its marker or ``--nodes`` say.  The partitions
    are read once per snapshot, not once per job; ``in_partition``: the snapshot's
    ``partition_capacity`` when the caller has built it already.
    """
    capacities = _capacities(snapshot.partitions)
    per_partition = in_partition or partition_capacity(snapshot, qos_nodes, assoc_nodes)
    everything = len(snapshot.nodes)
    qos = qos_nodes or {}
    assoc = assoc_nodes or {}

    def capacity(job: JobView) -> int:
        # The job's QOS caps every partition alike (in ``in_partition``), so capping the
        # largest is the same as the largest of the capped.
        known = [per_partition(job, p) for p in job.partitions if p in capacities]
        if known:
            return max(known)
        most = everything
        for limit in (qos.get(job.qos), assoc.get((job.account, job.user, ""))):
            if limit is not None:
                most = min(most, limit)
        return most

    return capacity


Reclaim = Literal["requested", "minimum", "off"]


def entitlement(ej: ElasticJob, sizes: tuple[int, ...], reclaim: Reclaim) -> int | None:
    """The nodes a running job holds by right (``reclaim`` mode), within its range and no
    more than it holds; None when pending or when nothing is reclaimed."""
    current = ej.effective_nodes
    if reclaim == "off" or current == 0:
        return None
    own = sizes[0] if reclaim == "minimum" else ej.job.node_count
    return min(max(own, sizes[0]), current)


def loans(cls: Classification, reclaim: Reclaim) -> dict[int, int]:
    """Nodes on loan of each running elastic job that has any (``entitlement``)."""
    out: dict[int, int] = {}
    for job_id, ej in cls.elastic.items():
        if reclaim == "off" or (reclaim == "requested" and not ej.running_companions):
            continue  # nothing on loan (a job's own nodes are its entitlement)
        entitled = entitlement(ej, offered_sizes(ej), reclaim)
        if entitled is not None and ej.effective_nodes > entitled:
            out[job_id] = ej.effective_nodes - entitled
    return out


@dataclass(frozen=True, slots=True)
class Placing:
    """What placing pending jobs by partition needs (``daemon.placement``), read once per
    cycle: each partition's relative GPU speed, the most nodes a job can hold in a partition
    (``partition_capacity``), and whether a job's user may run in it (``may_use``)."""

    speeds: Mapping[str, float] = field(default_factory=dict)
    capacity_in: Callable[[JobView, str], int] | None = None
    may_use: Callable[[JobView, str], bool] = lambda job, partition: True
    # Whether the policy chooses among the partitions (``policy.placement: plan``); else a
    # job is planned in the first it may use and Slurm picks where it starts.
    choose: bool = True


def _placed(
    job: JobView,
    sizes: tuple[int, ...],
    outlook: Outlook,
    placing: Placing,
    up: frozenset[str],
) -> tuple[str, tuple[int, ...], Outlook, tuple[PlacementOption, ...]]:
    """(partition, sizes, outlook, options) of a pending job listing several partitions:
    options where two or more are UP and usable (the first of them alone unless
    ``placing.choose``), the one partition where only one is, else the job as listed
    (Slurm then says why it waits)."""
    if placing.capacity_in is None:
        return own_partition(job), sizes, outlook, ()
    capacity_in = placing.capacity_in
    options = placement_options(
        job,
        sizes,
        outlook,
        placing.speeds,
        usable=lambda p: p in up and placing.may_use(job, p),
        capacity_in=lambda p: capacity_in(job, p),
    )
    if len(options) > 1 and placing.choose:
        return ",".join(o.partition for o in options), sizes, outlook, options
    if options:
        first = options[0]
        return first.partition, first.allowed_sizes, first.outlook, ()
    return own_partition(job), sizes, outlook, ()


def elastic_demand(
    ej: ElasticJob,
    outlook: Outlook,
    frozen: bool,
    weight: float = 1.0,
    *,
    reclaim: Reclaim = "off",
    loan_yields: bool = False,
    no_shrink: bool = False,
    placing: Placing | None = None,
    up: frozenset[str] = frozenset(),
) -> ElasticDemand:
    """``no_shrink``: the job may not be shrunk (``actuate.guards``: Slurm refused it, or its
    steps run under Slurm's step manager).  It keeps whatever it starts with, so a pending
    one is offered only its smallest size (more comes as companion jobs, which a reclaim
    can take back: no user gets a start above the minimum by making their job
    unshrinkable), and a running one nothing below its own size.

    ``placing``: a pending job listing several partitions is placed among the ``up`` ones
    (``_placed``).  ``outlook`` is priced in the job's own partition (``Estimator``)."""
    current = ej.effective_nodes
    sizes = offered_sizes(ej)
    if no_shrink:
        sizes = sizes[:1] if ej.job.is_pending else tuple(n for n in sizes if n >= current)
    partition = own_partition(ej.job)
    options: tuple[PlacementOption, ...] = ()
    if placing is not None and ej.job.is_pending and len(ej.job.partitions) > 1:
        partition, sizes, outlook, options = _placed(ej.job, sizes, outlook, placing, up)
    return ElasticDemand(
        job_id=ej.job.job_id,
        partition=partition,
        current_nodes=current,
        allowed_sizes=sizes,
        outlook=outlook,
        options=options,
        weight=weight,
        submit_time=ej.job.submit_time or 0.0,
        requested_nodes=ej.job.node_count if ej.job.is_pending else current,
        frozen=frozen,
        priority=ej.job.priority or 0.0,
        entitled_nodes=entitlement(ej, sizes, reclaim),
        loan_yields=loan_yields,
    )


def promised_soon(job: JobView, now: float, window_s: float) -> bool:
    """A pending job waiting only for its begin time, which comes within ``window_s``."""
    begins = job.eligible_time
    return job.state_reason == "BeginTime" and begins is not None and begins <= now + window_s


def rigid_demands(
    classification: Classification,
    elastic_ids: frozenset[int],
    now: float = 0.0,
    promise_window_s: float = 0.0,
) -> tuple[RigidDemand, ...]:
    """Every active job that is not an elastic demand and not a folded-in companion,
    except pending jobs Slurm cannot start now (they reserve nothing) but those with a
    start promised within ``promise_window_s`` (``startable=False``)."""
    folded = {c.job_id for ej in classification.elastic.values() for c in ej.running_companions}
    rigid: list[RigidDemand] = []
    for job_id, job in sorted(classification.jobs.items()):
        if job_id in elastic_ids or job_id in folded:
            continue
        startable = not_eligible_reason(job) is None
        if not startable and not promised_soon(job, now, promise_window_s):
            continue
        pending = job.state in (JobState.PENDING, JobState.REQUEUED)
        rigid.append(
            RigidDemand(
                job_id=job_id,
                partition=own_partition(job),
                nodes=max(1, job.node_count),
                running=not pending,
                submit_time=job.submit_time or 0.0,
                priority=job.priority or 0.0,
                startable=startable,
            )
        )
    return tuple(rigid)


def build_problem(
    snapshot: ClusterSnapshot,
    classification: Classification,
    outlooks: Mapping[int, Outlook],
    frozen: Mapping[int, str],
    *,
    now: float,
    horizon_s: float,
    time_limit_s: float,
    waiting: Mapping[int, str] | None = None,
    reclaim: Reclaim = "off",
    yielding: frozenset[int] = frozenset(),
    promise_window_s: float = 0.0,
    no_shrink: frozenset[int] = frozenset(),
    placing: Placing | None = None,
) -> AllocationProblem:
    """An elastic job without an outlook (the model failed on it) is held rigid at its size.

    A pending elastic job Slurm cannot start now (``not_eligible``) is neither elastic nor
    rigid: it has no size to keep and must not have nodes set aside for it.  ``waiting``:
    ``not_eligible(classification)`` when the caller has it already (the controller does).
    """
    elastic: list[ElasticDemand] = []
    if waiting is None:
        waiting = not_eligible(classification)
    up = frozenset(p.name for p in snapshot.partitions if p.state.upper() == "UP")
    for job_id, ej in sorted(classification.elastic.items()):
        if job_id in waiting:
            continue
        outlook = outlooks.get(job_id)
        if outlook is not None:
            elastic.append(
                elastic_demand(
                    ej,
                    outlook,
                    job_id in frozen,
                    reclaim=reclaim,
                    loan_yields=job_id in yielding,
                    no_shrink=job_id in no_shrink,
                    placing=placing,
                    up=up,
                )
            )
    return AllocationProblem(
        now=now,
        elastic=tuple(elastic),
        rigid=rigid_demands(
            classification, frozenset(d.job_id for d in elastic), now, promise_window_s
        ),
        pools=node_pools(snapshot),
        horizon_s=horizon_s,
        time_limit_s=time_limit_s,
    )
