"""Capacity and FIFO reservations as linear rows ``sum_j a_rj(size_j) <= rhs_r``.

Shared nodes
------------
Nodes come in ``NodePool``s: nodes that belong to exactly the same set of partitions.  A
job's *demand class* is the set of partitions it was submitted to (Slurm accepts
``-p a,b``); it may use any node of any pool that meets its class.  Whether a set of job
sizes fits is then a transportation problem (classes demand nodes, pools supply them),
and by Gale's supply-demand theorem (Hall's condition) it is feasible iff for every set
``S`` of demand classes

    demand(S) <= nodes in the pools adjacent to some class of S.

Only sets ``S`` that are connected through shared pools are needed (a disconnected set's
row is the sum of its parts' rows), so we enumerate the connected subsets of each
component of the class graph.  Real clusters have a handful of partitions; a component of
more than ``PolicyOptions.max_component_classes`` classes is refused with a SolverError
rather than approximated.  Running rigid jobs consume their class's capacity.  Where a
running job actually sits is not known to the policy (the problem carries counts, not
placements); the rows assume Slurm can place the plan, which is exact for disjoint
partitions and an upper bound with shared nodes.

Reservations for pending rigid jobs
-----------------------------------
Elastic jobs must not jump Slurm's queue.  Pending jobs are ordered as Slurm starts them:
by descending priority, then ``(submit_time, job_id)`` (``queue_key``).  A pending rigid
job R is *ahead* of: every pending elastic job behind it, the part of a pending elastic job
ahead of it above its minimum, and any growth of a running elastic job.  Those are the
claims that R's nodes are protected from:

    sum_running (t_j - cur_j) + sum_ahead_pending (t_j - min_j) + sum_behind_pending t_j
        <= cap(S) - rigid_running(S) - sum_running cur_j
           - sum_ahead_pending min_j - pending_rigid_up_to_R(S)            (= slack)

(pending elastic jobs ahead of R count at their minimum, whether or not they start: a
conservative reading of their place in line).  Three cases:

* ``slack >= 0``: R fits beside everything running; the row keeps its nodes free.
* ``slack < 0`` but the running elastic jobs' *loans* cover it: a job's loan is what it
  holds above its entitlement (``ElasticDemand.entitled_nodes``: the nodes Slurm gave it
  on its own, the companions' nodes being borrowed).  R waits only because of loans, so
  they are reclaimed, by two rows with the negative ``slack`` as right side:

      sum_running (max(t_j, floor_j) - cur_j) <= slack                 (the reclaim row)

  (``floor_j`` = ``reclaim_grid_floor``: the entitlement, or the allowed size just below
  it when the entitlement is off the job's grid), so the loans given back cover R's
  shortfall, and R's reservation row as above, every shrink counted whole, so R's room
  stays free of the growth of jobs ahead and behind.  The solver picks which borrowers
  give back (the cheapest loss of progress); no job is shrunk below its entitlement for
  R, but a job that shrinks further of its own accord (it is nearly done) frees nodes the
  jobs ahead of R may use.
* otherwise R cannot start even so: the right side is 0, nothing behind R may take free
  nodes (strict priority order, no backfill of elastic work, which has no reliable end
  time), although running elastic jobs may still trade nodes among themselves; the rows of
  later pending rigid jobs are implied.

A pending *elastic* job E that loans keep from starting at its minimum gets the two rows
too, with the admission floor on (``PolicyOptions.fair_floor``, which makes E start): the
same with E's minimum as its reservation, E itself counted as ahead (its own start is no
claim on the row).  Where E fits anyway, or cannot fit even so, it has no row: the
admission floor and the objective decide (``mip``).

Reclaim rows are made only in the capacity set of the waiting job's own demand class
alone: in a wider set (partitions that share nodes) the loans of jobs in other
partitions would count, and their nodes may be ones the waiting job cannot use.

Promised starts
---------------
A pending job that Slurm will start at a known time soon (a ``--begin`` time within the
payback window: ``RigidDemand.startable`` False) is not in the queue yet, so it neither
reserves free nodes from pending jobs nor reclaims loans; but a grow into its nodes would
have to be given back before it paid for its restart.  A *promise* row per class keeps
the growth of running elastic jobs out of them:

    sum_running (t_j - cur_j) <= max(0, cap(S) - rigid_running(S) - sum_running cur_j
                                        - promised(S))

Consecutive pending rigid jobs with no pending elastic job between them and the same kind
of row give identical left sides, so only the last of each run is kept.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from slurm_elastic.errors import SolverError
from slurm_elastic.types import AllocationProblem, ElasticDemand, NodePool, RigidDemand

CAPACITY = "capacity"
RESERVATION = "fifo-reservation"
RECLAIM = "reclaim"
PROMISE = "promise"

Class = frozenset[str]


# The results below are pure functions of small immutable inputs that recur every cycle
# (a cluster has a handful of partitions), so they are memoised.
_MEMO = 256


@functools.lru_cache(maxsize=_MEMO)
def demand_class(partition: str) -> Class:
    """Partitions a job may run in (``a,b`` = either)."""
    names = frozenset(p.strip() for p in partition.split(",") if p.strip())
    if not names:
        raise SolverError(f"job has an empty partition name {partition!r}")
    return names


QueueKey = tuple[float, float, int]


def queue_key(priority: float, submit_time: float, job_id: int) -> QueueKey:
    """A pending job's place in Slurm's queue: higher priority first, then submit order."""
    return (-priority, submit_time, job_id)


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One linear row before job coefficients are attached."""

    name: str
    kind: str  # CAPACITY, RESERVATION, RECLAIM or PROMISE
    rhs: float
    classes: frozenset[Class]
    cutoff: QueueKey | None = None  # queue key of the reserving job: jobs before it are ahead
    through: bool = False  # the reserving job counts as ahead of itself (an elastic job)
    growth_only: bool = False  # counts only running jobs' growth (a promise row)


def _connected_subsets(members: list[int], adj: dict[int, int]) -> Iterator[int]:
    """Bitmasks (over ``members`` indices) of every non-empty connected subset."""
    m = len(members)
    for mask in range(1, 1 << m):
        start = (mask & -mask).bit_length() - 1
        seen = 1 << start
        frontier = seen
        while frontier:
            i = (frontier & -frontier).bit_length() - 1
            frontier &= frontier - 1
            new = adj[i] & mask & ~seen
            seen |= new
            frontier |= new
        if seen == mask:
            yield mask


@functools.lru_cache(maxsize=_MEMO)
def hall_sets(
    classes: tuple[Class, ...], pools: tuple[NodePool, ...], max_component: int
) -> tuple[tuple[frozenset[Class], int], ...]:
    """Every connected set of demand classes with the nodes of the pools it touches."""
    touch = {c: frozenset(i for i, p in enumerate(pools) if p.partitions & c) for c in classes}
    order = sorted(classes, key=lambda c: sorted(c))
    # components of the "share a pool" graph, by union-find on class indices
    parent = list(range(len(order)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            if touch[order[i]] & touch[order[j]]:
                parent[find(i)] = find(j)
    components: dict[int, list[int]] = {}
    for i in range(len(order)):
        components.setdefault(find(i), []).append(i)

    out: list[tuple[frozenset[Class], int]] = []
    for members in components.values():
        if len(members) > max_component:
            names = ", ".join("+".join(sorted(order[i])) for i in members)
            raise SolverError(
                f"{len(members)} partition classes share nodes ({names}); "
                f"more than {max_component} is not supported"
            )
        adj = {
            a: sum(
                1 << b
                for b, mb in enumerate(members)
                if b != a and touch[order[members[a]]] & touch[order[mb]]
            )
            for a in range(len(members))
        }
        for mask in _connected_subsets(members, adj):
            chosen = frozenset(order[members[a]] for a in range(len(members)) if mask >> a & 1)
            pool_ids = frozenset().union(*(touch[c] for c in chosen))
            out.append((chosen, sum(pools[i].nodes for i in pool_ids)))
    return tuple(out)


@functools.lru_cache(maxsize=_MEMO)
def _name(classes: frozenset[Class]) -> str:
    return "+".join(sorted(",".join(sorted(c)) for c in classes))


def build_rows(
    problem: AllocationProblem,
    classes_of: dict[int, Class],
    max_component: int,
    elastic_reclaims: bool = True,
    placement_classes: Iterable[Class] = (),
) -> list[RowSpec]:
    """Capacity rows (one per Hall set), reservation, reclaim and promise rows, in a
    stable order.  ``elastic_reclaims``: pending elastic jobs reclaim loans too (with the
    admission floor, ``PolicyOptions.fair_floor``, which makes them start).
    ``placement_classes``: the partitions of jobs' placement options, whose capacity rows
    are needed although no job's demand class is one of them."""
    rigid_classes = {r.job_id: demand_class(r.partition) for r in problem.rigid}
    all_classes = sorted(
        set(classes_of.values()) | set(rigid_classes.values()) | set(placement_classes),
        key=lambda c: sorted(c),
    )
    sets = []  # (classes, their pending and running rigid jobs, nodes no running rigid job holds)
    for classes, cap in hall_sets(tuple(all_classes), tuple(problem.pools), max_component):
        rigid_in = [r for r in problem.rigid if rigid_classes[r.job_id] in classes]
        sets.append((classes, rigid_in, cap - sum(r.nodes for r in rigid_in if r.running)))
    futile: set[int] = set()
    for classes, rigid_in, free in sets:
        if len(classes) > 1:
            futile |= _cannot_start(classes, free, rigid_in, problem.elastic, classes_of)
    rows: list[RowSpec] = []
    for classes, rigid_in, free in sets:
        name = _name(classes)
        rows.append(RowSpec(f"{CAPACITY}:{name}", CAPACITY, float(free), classes))
        rows.extend(
            _reservations(
                name,
                classes,
                free,
                rigid_in,
                problem.elastic,
                classes_of,
                elastic_reclaims,
                futile,
            )
        )
        rows.extend(_promise(name, classes, free, rigid_in, problem.elastic, classes_of))
    return rows


def _promise(
    name: str,
    classes: frozenset[Class],
    free_of_rigid: int,
    rigid_in: list[RigidDemand],
    elastic: tuple[ElasticDemand, ...],
    classes_of: dict[int, Class],
) -> list[RowSpec]:
    """Running elastic jobs grow only into nodes no promised start needs."""
    promised = sum(r.nodes for r in rigid_in if not r.running and not r.startable)
    if not promised:
        return []
    running_cur = sum(
        e.current_nodes for e in elastic if e.is_running and classes_of[e.job_id] in classes
    )
    rhs = float(max(0, free_of_rigid - running_cur - promised))
    return [RowSpec(f"{PROMISE}:{name}", PROMISE, rhs, classes, growth_only=True)]


def _queue(
    classes: frozenset[Class],
    rigid_in: list[RigidDemand],
    elastic: tuple[ElasticDemand, ...],
    classes_of: dict[int, Class],
) -> tuple[list[RigidDemand], list[ElasticDemand], list[tuple[QueueKey, int, bool]]]:
    """The pending rigid jobs (startable, in Slurm's order), the running elastic jobs and
    the pending elastic jobs ``(key, minimum, not frozen)`` (in Slurm's order) of a row."""
    pending_rigid = sorted(
        (r for r in rigid_in if not r.running and r.startable),
        key=lambda r: queue_key(r.priority, r.submit_time, r.job_id),
    )
    elastic_in = [e for e in elastic if classes_of[e.job_id] in classes]
    running = [e for e in elastic_in if e.is_running]
    pending = sorted(
        (queue_key(e.priority, e.submit_time, e.job_id), e.min_nodes, not e.frozen)
        for e in elastic_in
        if not e.is_running
    )
    return pending_rigid, running, pending


def _cannot_start(
    classes: frozenset[Class],
    free_of_rigid: int,
    rigid_in: list[RigidDemand],
    elastic: tuple[ElasticDemand, ...],
    classes_of: dict[int, Class],
) -> set[int]:
    """Pending jobs of a set of several partitions that could not start at their minimum
    even if every borrower of the set gave back its whole loan: the jobs ahead of them in
    Slurm's queue, in any of these partitions, take the nodes first.  A reclaim for one of
    them (a row of its own partition alone, which does not see those jobs) would shrink
    borrowers for nodes that then go to the jobs ahead, or stand idle."""
    pending_rigid, running, pending = _queue(classes, rigid_in, elastic, classes_of)
    loans = sum(e.current_nodes - e.reclaim_floor for e in running)
    if not loans:
        return set()
    free = free_of_rigid - sum(e.current_nodes for e in running) + loans
    waiting = sorted(
        [(key, least) for key, least, _ in pending]
        + [(queue_key(r.priority, r.submit_time, r.job_id), r.nodes) for r in pending_rigid]
    )
    out: set[int] = set()
    ahead = 0
    for key, least in waiting:
        if ahead + least > free:
            out.add(key[2])
        ahead += least
    return out


def _reservations(
    name: str,
    classes: frozenset[Class],
    free_of_rigid: int,
    rigid_in: list[RigidDemand],
    elastic: tuple[ElasticDemand, ...],
    classes_of: dict[int, Class],
    elastic_reclaims: bool,
    futile: Collection[int],
) -> list[RowSpec]:
    pending_rigid, running, pending = _queue(classes, rigid_in, elastic, classes_of)
    loans = sum(e.current_nodes - e.reclaim_floor for e in running)
    if not pending_rigid and not loans:
        return []
    running_cur = sum(e.current_nodes for e in running)
    keys = [k for k, _, _ in pending]
    ahead_min = list(itertools.accumulate((m for _, m, _ in pending), initial=0))
    # Reclaims only where the nodes freed are ones the waiting job can use: in the row of
    # its own demand class alone (a wider set also counts borrowers of other partitions).
    reclaims = loans > 0 and len(classes) == 1
    rigid_keys = [queue_key(r.priority, r.submit_time, r.job_id) for r in pending_rigid]
    rigid_upto = list(itertools.accumulate((r.nodes for r in pending_rigid), initial=0))
    rows: list[RowSpec] = []
    if reclaims and elastic_reclaims:
        # A pending elastic job that loans keep from starting at its minimum reclaims them
        # too: its row counts itself as ahead (``through``), so its own start is no claim.
        for at, (key, least, can_start) in enumerate(pending):
            before = bisect.bisect_left(rigid_keys, key)
            slack = float(free_of_rigid - running_cur - ahead_min[at] - rigid_upto[before] - least)
            if can_start and slack < 0 <= slack + loans and key[2] not in futile:
                rows.extend(_reclaim(name, slack, classes, key, through=True))
    reserved = 0
    for k, r in enumerate(pending_rigid):
        key = rigid_keys[k]
        reserved += r.nodes
        at = bisect.bisect_left(keys, key)  # pending elastic jobs ahead of R
        slack = float(free_of_rigid - running_cur - ahead_min[at] - reserved)
        if slack >= 0:
            kind, rhs = RESERVATION, slack
        elif reclaims and slack + loans >= 0 and r.job_id not in futile:
            rows.extend(_reclaim(name, slack, classes, key, through=False))
            continue
        else:
            kind, rhs = RESERVATION, 0.0
        # No pending elastic job between R and the next, whose row is then of the same
        # kind (or a reclaim, implied by the same left side with a smaller right side).
        implied = (
            k + 1 < len(pending_rigid)
            and kind == RESERVATION
            and rhs > 0
            and bisect.bisect_left(keys, rigid_keys[k + 1]) == at
        )
        if implied:
            continue
        rows.append(RowSpec(f"{kind}:{name}:job{r.job_id}", kind, rhs, classes, key))
        # Nothing more can start behind a job that nothing frees room for; but a job that
        # fits exactly (slack 0) still leaves the next ones their reclaims.
        if kind == RESERVATION and rhs == 0 and not (reclaims and slack + loans >= 0):
            break
    return rows


def _reclaim(
    name: str, slack: float, classes: frozenset[Class], key: QueueKey, through: bool
) -> tuple[RowSpec, RowSpec]:
    """A reclaim for the pending job at ``key``: the loans given back cover its shortfall
    (the reclaim row, running jobs alone, a shrink counted down to the entitlement), and
    the room it needs stays free (its reservation row, every shrink counted whole)."""
    job = key[2]
    return (
        RowSpec(f"{RECLAIM}:{name}:job{job}", RECLAIM, slack, classes, key, through),
        RowSpec(f"{RESERVATION}:{name}:job{job}", RESERVATION, slack, classes, key, through),
    )
