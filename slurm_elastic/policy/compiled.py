"""Validate an ``AllocationProblem`` and turn it into the numeric form all policies share.

Candidates (the sizes a job may be given this cycle)
----------------------------------------------------
* frozen job: only its current size;
* running job: its allowed sizes (all >= min, so never below min and never 0: no
  preemption; Slurm keeps the first nodes on a shrink, so the batch host stays) plus its
  current size, which is always allowed as "no change" even when it is off the grid;
* pending job: 0 (stay pending) or any allowed size.

Value of a candidate (the MIP objective, also used to score every other policy's plan)
-----------------------------------------------------------------------------------
``f_j(s)`` is the outlook's throughput (a size the outlook lacks is interpolated; a job
with no estimate is assumed to scale linearly), ``f_j^max`` its best throughput over its
candidates, ``W_j`` the remaining work (steps), ``c_j`` the measured restart cost (seconds
of lost progress, paid by a running job that changes size, not by a pending job that
starts), ``H`` the horizon, ``w_j`` the weight.  The estimated completion time from now
at size ``s`` is

    C_j(s) = c_j [resized] + W_j / f_j(s)                 if that is <= H (finishes inside)
    C_j(s) = H + (W_j - f_j(s) * (H - c_j [resized])) / f_j^max          otherwise
    C_j(0) = H + W_j / f_j^max                            (a pending job waits the horizon)

(beyond the horizon: the work still left then, done at the job's best speed; the branches
meet at ``C = H``), and

    value_j(s) = w_j * (C_j(0) - C_j(s)),   value_j(0) = 0 (stays pending),

the seconds of completion time that this cycle's choice saves the job.  Maximising total
value is minimising total weighted estimated completion time, i.e. mean JCT, whose unit
is seconds: a job that runs for the horizon at its best speed gains ``H`` whatever its
length (waiting costs every job one second per second), a slower size gains the fraction
``f(s) / f^max`` of that, and a job that finishes inside the horizon gains only by
finishing earlier, so nodes do not go to nearly-done jobs beyond what shortens them.  The
reference speed after the horizon is the job's best one, not its current one, so a
candidate's value does not depend on the size the job happens to have now (a plan that
moved the reference with the job would chase its own resizes).  An earlier objective
counted the work left after the horizon in horizon units (``C = H (2 - f H / W)``): a
long job's completion then hardly depended on its size or on whether it waited, so long
jobs were grown last and left pending first, although they carry most of the mean JCT on
real traces (``scripts/analyze_sim.py``; docs/benchmarks.md, "Simulated policies").  Two
tie-breaks far below any real difference (``PolicyOptions.change_penalty``): a change of size costs
``penalty * H``, and among equal pending jobs the older wins.

Payback: a larger candidate whose value is not higher than that of a smaller candidate
is dominated (it needs at least as much of every row for no more value) and is dropped.
For a running job this is exactly "a growth must pay back its resize cost within the
horizon".  Dropping dominated candidates never changes the optimum.

Greedy's utility is Optimus' own: remaining time ``T_j(s) = c_j [resized] + W_j / f_j(s)``
(a job with unknown remaining work is given ten horizons of work at its best speed).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from slurm_elastic.errors import SolverError
from slurm_elastic.policy.capacity import (
    CAPACITY,
    RECLAIM,
    RESERVATION,
    Class,
    QueueKey,
    RowSpec,
    build_rows,
    demand_class,
    queue_key,
)
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.types import AllocationProblem, ElasticDemand

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Row:
    """One constraint row of the allocation problem: a capacity or a FIFO reservation."""

    name: str
    kind: str  # CAPACITY, RESERVATION, RECLAIM or PROMISE
    rhs: float
    reserver: int | None = None  # the pending job a reservation or reclaim row is for


@dataclass(slots=True, eq=False)
class JobModel:
    """One elastic job's candidates and what each costs and buys.

    Read-only by convention, not ``frozen``: a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, 3.3 us for these 13 fields against 0.6 us
    (measured), and ``compile_problem`` builds one per job every cycle.
    """

    demand: ElasticDemand
    legal: IntArray  # every size allowed this cycle (before dominance pruning)
    legal_value: FloatArray  # objective value of each legal size
    sizes: IntArray  # candidates, ascending; index 0 is the job's floor
    value: FloatArray  # objective value per candidate
    progress: FloatArray  # steps over the horizon per candidate
    throughput: FloatArray  # steps/s per candidate
    remaining_s: FloatArray  # Optimus remaining time per candidate (inf at 0 nodes)
    rows: IntArray  # rows this job appears in
    coef: FloatArray  # shape (len(rows), len(sizes)): row usage per candidate
    keep: int  # index of the current size ("no change")
    static: int  # index of the size the static policy gives it
    queue: QueueKey  # its place in Slurm's queue (``capacity.queue_key``)

    @property
    def job_id(self) -> int:
        return self.demand.job_id

    def index(self, size: int) -> int | None:
        hit = np.flatnonzero(self.sizes == size)
        return int(hit[0]) if hit.size else None


@dataclass(frozen=True, slots=True, eq=False)
class Compiled:
    """An ``AllocationProblem`` compiled once into flat arrays that every solver reads."""

    problem: AllocationProblem
    options: PolicyOptions
    jobs: tuple[JobModel, ...]  # in the problem's order
    rows: tuple[Row, ...]
    rhs: FloatArray  # per row, read-only (the rows' rhs as one array, built once)
    start: IntArray  # flat view: job j's candidates are start[j]:start[j+1]
    value: FloatArray  # flat candidate values
    coef: FloatArray  # dense (rows x flat candidates) row usage
    sizes: IntArray  # flat candidate sizes
    progress: FloatArray  # flat candidate progress
    throughput: FloatArray  # flat candidate throughput
    keep: IntArray  # flat index of each job's current size ("no change")
    # Per job (``jobs``): the index of the problem's demand it places, when some demand
    # has placement options (``ElasticDemand.options``): such a demand is one job per
    # option here, side by side, of which one at most starts (``placements``).  Empty when
    # none has: then ``jobs[i]`` places demand ``i``.
    owner: tuple[int, ...] = ()
    # The jobs of each demand placed in several partitions: at most one of them starts.
    # Kept as groups rather than as one more dense row per demand: a long queue of such
    # jobs would otherwise add a row per pending job to every solver's matrix.
    placements: tuple[tuple[int, ...], ...] = ()

    @property
    def placed(self) -> bool:
        """Whether some demand has placement options (``owner`` is given)."""
        return bool(self.owner)

    def starts_once(self, choice: Sequence[int]) -> bool:
        """Every demand placed in several partitions starts in one of them at most."""
        return all(sum(1 for j in group if choice[j] > 0) <= 1 for group in self.placements)

    def at(self, choice: Sequence[int]) -> IntArray:
        """Flat index of each job's chosen candidate."""
        return self.start[:-1] + np.asarray(choice, dtype=np.int64).reshape(-1)

    def floor_usage(self) -> FloatArray:
        return self.coef[:, self.start[:-1]].sum(axis=1)

    def usage(self, choice: Sequence[int]) -> FloatArray:
        return self.coef[:, self.at(choice)].sum(axis=1)

    def objective(self, choice: Sequence[int]) -> float:
        return float(self.value[self.at(choice)].sum())

    def feasible(self, choice: Sequence[int]) -> bool:
        return bool(np.all(self.usage(choice) <= self.rhs + _EPS)) and self.starts_once(choice)


# --------------------------------------------------------------------------- validation


def _validate_options(d: ElasticDemand) -> None:
    if d.is_running:
        raise SolverError(f"job {d.job_id}: a running job has no placement options")
    own = demand_class(d.partition)
    names = [o.partition for o in d.options]
    if len(set(names)) != len(names) or not own.issuperset(names):
        raise SolverError(
            f"job {d.job_id}: placement options {names!r} must be distinct partitions of "
            f"its own {d.partition!r}"
        )


def _validate(problem: AllocationProblem, placed: Sequence[ElasticDemand]) -> None:
    """``placed``: the problem's demands, one per placement option (``_placements``)."""
    if not (problem.horizon_s > 0 and math.isfinite(problem.horizon_s)):
        raise SolverError(f"horizon_s must be a positive number, got {problem.horizon_s!r}")
    if not problem.time_limit_s > 0:
        raise SolverError(f"time_limit_s must be positive, got {problem.time_limit_s!r}")
    seen: set[int] = set()
    for d in problem.elastic:
        if d.job_id in seen:
            raise SolverError(f"job {d.job_id} appears twice in the problem")
        seen.add(d.job_id)
        if d.options:
            _validate_options(d)
    for d in placed:
        sizes = d.allowed_sizes
        # Ascending and distinct, so all >= 1 exactly when the first is.
        if not sizes or sizes[0] < 1 or list(sizes) != sorted(set(sizes)):
            raise SolverError(
                f"job {d.job_id}: allowed_sizes must be ascending, distinct and >= 1, got {sizes!r}"
            )
        if d.current_nodes < 0:
            raise SolverError(f"job {d.job_id}: negative current_nodes {d.current_nodes}")
        if not (d.weight >= 0 and math.isfinite(d.weight)):
            raise SolverError(f"job {d.job_id}: weight must be finite and >= 0, got {d.weight}")
        if d.outlook.resize_cost_s < 0 or math.isnan(d.outlook.resize_cost_s):
            raise SolverError(f"job {d.job_id}: resize_cost_s must be >= 0")
        for est in d.outlook.sizes:
            if not est.throughput >= 0:
                raise SolverError(f"job {d.job_id}: outlook throughput must be >= 0")
    for r in problem.rigid:
        if r.job_id in seen:
            raise SolverError(f"job {r.job_id} appears twice in the problem")
        seen.add(r.job_id)
        if r.nodes < 0:
            raise SolverError(f"rigid job {r.job_id}: negative node count {r.nodes}")
    for p in problem.pools:
        if p.nodes < 0:
            raise SolverError(f"node pool {sorted(p.partitions)}: negative node count")


# --------------------------------------------------------------------------- values


def _static_size(d: ElasticDemand) -> int:
    """What the job asked for: requested_nodes (snapped down to the grid), else its max."""
    if d.frozen or d.is_running:
        return d.current_nodes
    want = d.requested_nodes if d.requested_nodes is not None else d.max_nodes
    fitting = [s for s in d.allowed_sizes if s <= want]
    return fitting[-1] if fitting else d.min_nodes


def _throughput(d: ElasticDemand, sizes: list[int]) -> list[float]:
    est = d.outlook.sizes
    if not est:
        return [float(s) for s in sizes]  # no estimate: assume linear speed-up
    # Usually the outlook has exactly the positive candidates, in order: read them off
    # (the lookup below would find the same numbers; this skips its dict).
    nodes = [e.nodes for e in est]
    if nodes == sizes:
        return [float(e.throughput) for e in est]
    if sizes[0] == 0 and nodes == sizes[1:]:
        return [0.0, *(float(e.throughput) for e in est)]
    by_nodes = {e.nodes: e.throughput for e in est}
    if all(s <= 0 or s in by_nodes for s in sizes):
        return [float(by_nodes[s]) if s > 0 else 0.0 for s in sizes]
    xs = sorted(by_nodes)
    thr = np.interp(np.array(sizes, dtype=float), xs, [by_nodes[x] for x in xs])
    return [float(x) if s > 0 else 0.0 for s, x in zip(sizes, thr, strict=True)]


@dataclass(frozen=True, slots=True)
class _Flat:
    """Every legal candidate of every job, side by side (job ``j`` owns start[j]:start[j+1])."""

    start: IntArray
    job: IntArray
    local: IntArray  # index within its job
    width: int  # most candidates of any job
    sizes: IntArray
    value: FloatArray
    progress: FloatArray
    throughput: FloatArray
    remaining: FloatArray
    current: FloatArray  # the job's current size, per candidate
    running: npt.NDArray[np.bool_]  # per candidate
    queue: list[QueueKey]  # per job


def _values(
    problem: AllocationProblem,
    options: PolicyOptions,
    reclaiming: frozenset[Class],
    owner: Sequence[int] = (),
) -> _Flat:
    """Objective value, progress and Optimus remaining time of every legal candidate.

    ``owner``: the demand each job places (``Compiled.owner``), when some demand has
    placement options; a job's best speed is then its demand's best over every placement,
    so a slower partition's sizes are worth less than a faster one's.

    ``C(s)`` is the job's estimated completion time from now: ``c [resized] + W / f(s)``
    when that is inside the horizon, else ``H + (W - f(s) H_eff) / f_max`` (the work left
    at the horizon, done at the job's best speed).  ``value = w (C(0) - C(s))`` with
    ``C(0) = H + W / f_max`` (waits the horizon out): the seconds of completion time this
    cycle's size saves, 0 for a pending job that stays pending (see the module docstring).
    ``reclaiming``: the demand classes with a reclaim row, where a job frozen by dwell or
    cooldown may still give back its loan (``ElasticDemand.candidate_sizes``).
    """
    demands = problem.elastic
    horizon = problem.horizon_s
    n = len(demands)
    # One pass over the jobs gathers everything; the arithmetic below is on flat arrays.
    # A cycle has about 16 jobs, so numpy calls (about 1 us each) and Python objects, not
    # arithmetic, are the cost: each array is built once, not once per job.
    all_sizes: list[int] = []
    all_thr: list[float] = []
    all_local: list[int] = []
    counts: list[int] = []
    per_job: list[tuple[float, bool, float, float, float]] = []
    queue: list[QueueKey] = []
    for d in demands:
        legal = d.candidate_sizes(bool(reclaiming) and demand_class(d.partition) in reclaiming)
        all_sizes += legal
        all_thr += _throughput(d, legal)
        all_local += range(len(legal))
        counts.append(len(legal))
        out = d.outlook
        per_job.append(
            (
                d.current_nodes,
                d.is_running,
                out.resize_cost_s,
                d.weight,
                max(out.remaining_work, 0.0),
            )
        )
        queue.append(queue_key(d.priority, d.submit_time, d.job_id))
    count = np.array(counts, dtype=np.int64)
    start = np.array(list(itertools.accumulate(counts, initial=0)), dtype=np.int64)
    job = np.repeat(np.arange(n), count)
    sizes = np.array(all_sizes, dtype=np.int64)
    thr = np.array(all_thr, dtype=float)
    # Per-job numbers repeated onto each of the job's candidates, all five at once.
    cur, run, cost, weight, raw_work = np.repeat(
        np.array(per_job, dtype=float).reshape(n, 5), count, axis=0
    ).T
    running = run > 0
    top = np.maximum.reduceat(thr, start[:-1]) if n else np.zeros(0)
    if owner:
        of = np.asarray(owner, dtype=np.int64)
        fastest = np.zeros(int(of.max()) + 1)
        np.maximum.at(fastest, of, top)
        top = fastest[of]
    best = top[job]
    # Unknown remaining work: at least ten horizons at the job's best speed.
    work = np.where(np.isfinite(raw_work), raw_work, 10.0 * horizon * best)
    changed, positive = sizes != cur, sizes > 0
    resized = running & changed
    heff = np.where(resized, np.maximum(horizon - cost, 0.0), horizon)
    reach = thr * heff  # steps inside the horizon, before the cap at the work left
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = np.where(thr > 0, work / thr, np.inf) + np.where(resized, cost, 0.0)
        # Beyond the horizon the rest runs at the job's best speed: an estimate that does
        # not depend on the job's current size, so the plan does not chase its own moves.
        saved = np.where(
            tau <= horizon,
            horizon + work / best - tau,  # C(0) - C(s), finishing inside the horizon
            reach / best,  # C(0) - C(s) = f(s) H_eff / f_max, beyond it
        )
    value = np.where(positive & (work > 0) & (best > 0), weight * saved, 0.0)
    # Tie-breaks far below any real difference: change as little as possible, and among
    # equally good pending jobs start the older one.
    tick = options.change_penalty * horizon
    rank = np.empty(n)
    rank[sorted(range(n), key=queue.__getitem__)] = np.arange(n)
    older = 1.0 - rank / max(n, 1)
    value = value - tick * changed + 0.5 * tick * older[job] * (~running & positive)
    progress = np.minimum(raw_work, reach)
    local = np.array(all_local, dtype=np.int64)
    width = max(counts, default=1)
    return _Flat(start, job, local, width, sizes, value, progress, thr, tau, cur, running, queue)


def _undominated(flat: _Flat, protect: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Mask of candidates worth more than every smaller candidate of the same job."""
    n_jobs, local, width = flat.start.size - 1, flat.local, flat.width
    grid = np.full((n_jobs, width), -np.inf)
    grid[flat.job, local] = flat.value
    best_before = np.maximum.accumulate(grid, axis=1)
    shifted = np.concatenate([np.full((n_jobs, 1), -np.inf), best_before[:, :-1]], axis=1)
    return (flat.value > shifted[flat.job, local] + _EPS) | (local == 0) | protect


# --------------------------------------------------------------------------- compile


def _class_index(classes: list[Class]) -> tuple[list[Class], IntArray]:
    """The distinct classes in a stable order, and each job's position among them."""
    distinct = sorted(set(classes), key=sorted)
    position = {c: i for i, c in enumerate(distinct)}
    return distinct, np.array([position[c] for c in classes], dtype=np.int64)


def _row_coefficients(
    demands: Sequence[ElasticDemand],
    specs: list[RowSpec],
    classes: list[Class],
    flat: _Flat,
    kept: IntArray,
    sizes: IntArray,
    job: IntArray,
    queue_classes: list[Class] | None = None,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Dense (rows x kept candidates) usage, and a (rows x jobs) mask of who is in each row.

    ``sizes`` and ``job`` are ``flat``'s at ``kept``.  ``classes``: each job's demand class
    in the capacity rows; ``queue_classes`` (default the same): in the queue's rows
    (reservations, reclaims, promises), where a placement option still counts as the job
    Slurm queues in all its partitions.
    """
    s = sizes.astype(float)
    capacity_view = _class_index(classes)
    queue_view = capacity_view if queue_classes is None else _class_index(queue_classes)
    coef = np.zeros((len(specs), sizes.size))
    member = np.zeros((len(specs), len(demands)), dtype=bool)
    if any(spec.kind != CAPACITY and spec.cutoff is not None for spec in specs):
        running, cur = flat.running[kept], flat.current[kept]
        mins = np.array([d.min_nodes for d in demands], dtype=float)[job]
        floors = np.array([d.reclaim_grid_floor for d in demands], dtype=float)[job]
        keys = [flat.queue[j] for j in range(len(demands))]
    for i, spec in enumerate(specs):
        distinct, class_ix = capacity_view if spec.kind == CAPACITY else queue_view
        inside = [c in spec.classes for c in distinct]
        if spec.growth_only:
            row = np.where(flat.running[kept], s - flat.current[kept], 0.0)
        elif spec.kind == CAPACITY or spec.cutoff is None:
            row = s
        elif spec.kind == RECLAIM:
            # The loans given back: running jobs alone, a shrink counted only down to the
            # entitlement (or the grid size just below it, which the shrink cannot stop
            # above).  The waiting job's room is its reservation row's.
            row = np.where(running, np.maximum(s, floors) - cur, 0.0)
        else:
            cutoff = spec.cutoff
            through = spec.through
            ahead = np.array([k < cutoff or (through and k == cutoff) for k in keys])[job]
            row = np.where(running, s - cur, np.where(ahead, np.where(sizes > 0, s - mins, 0.0), s))
        if all(inside):  # the usual single partition: every job is in the row
            member[i] = True
            coef[i] = row
        else:
            member[i] = np.array(inside, dtype=bool)[class_ix]
            coef[i] = np.where(member[i][job], row, 0.0)
    return coef, member


def _reserver(spec: RowSpec) -> int | None:
    return None if spec.cutoff is None else spec.cutoff[2]


def _placements(
    demands: Sequence[ElasticDemand],
) -> tuple[tuple[ElasticDemand, ...], tuple[int, ...]]:
    """One demand per placement (a demand's options, else the demand itself), each with the
    index of the demand it places."""
    placed: list[ElasticDemand] = []
    owner: list[int] = []
    for i, d in enumerate(demands):
        for option in d.options:
            placed.append(
                replace(
                    d,
                    partition=option.partition,
                    allowed_sizes=option.allowed_sizes,
                    outlook=option.outlook,
                    options=(),
                )
            )
            owner.append(i)
        if not d.options:
            placed.append(d)
            owner.append(i)
    return tuple(placed), tuple(owner)


def _placement_groups(owner: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The jobs of each demand that has several placements, in the demand's order."""
    by_demand: dict[int, list[int]] = {}
    for j, demand in enumerate(owner):
        by_demand.setdefault(demand, []).append(j)
    return tuple(tuple(g) for g in by_demand.values() if len(g) > 1)


def compile_problem(problem: AllocationProblem, options: PolicyOptions) -> Compiled:
    """Validate and compile; raises SolverError with a one-line reason on bad input.

    A demand with placement options becomes one job per option (``Compiled.owner``), each
    in the capacity rows of its own partition, of which one at most starts
    (``Compiled.placements``).
    """
    placed = any(d.options for d in problem.elastic)
    demands, owner = _placements(problem.elastic) if placed else (problem.elastic, ())
    _validate(problem, demands)
    n = len(demands)
    classes = [demand_class(d.partition) for d in demands]
    queue_classes = [demand_class(problem.elastic[i].partition) for i in owner] or None
    specs = build_rows(
        problem,
        {d.job_id: demand_class(d.partition) for d in problem.elastic},
        options.max_component_classes,
        options.fair_floor,
        placement_classes=classes if placed else (),
    )
    reclaiming = frozenset().union(*(spec.classes for spec in specs if spec.kind == RECLAIM))
    flat = (
        _values(replace(problem, elastic=demands), options, reclaiming, owner)
        if placed
        else _values(problem, options, reclaiming)
    )
    static = np.array([_static_size(d) for d in demands], dtype=np.int64)
    protect = (flat.sizes == flat.current) | (flat.sizes == static[flat.job])
    kept = np.flatnonzero(_undominated(flat, protect))
    kjob, ksizes = flat.job[kept], flat.sizes[kept]
    kstart = np.searchsorted(kjob, np.arange(n + 1))
    coef, member = _row_coefficients(
        demands, specs, classes, flat, kept, ksizes, kjob, queue_classes
    )
    # Relax each row to what the jobs' floors already use (never force below min), and
    # drop rows that no choice can violate (candidates ascend, so usage does too).
    floor = coef[:, kstart[:-1]].sum(axis=1)
    top = coef[:, kstart[1:] - 1].sum(axis=1)
    rhs = np.maximum([s.rhs for s in specs], floor) if specs else np.zeros(0)
    live = np.flatnonzero(top > rhs + _EPS)
    rows = tuple(
        Row(specs[i].name, specs[i].kind, float(rhs[i]), _reserver(specs[i])) for i in live
    )
    coef, member, rhs = coef[live], member[live], rhs[live]
    rhs.flags.writeable = False  # shared by every reader of this Compiled

    keep_at = np.flatnonzero(ksizes == flat.current[kept])  # one hit per job (protected)
    static_at = np.flatnonzero(ksizes == static[kjob]) - kstart[:-1]
    # Gathered once; each job's candidates are then a slice (this loop runs per cycle).
    kvalue, kprogress = flat.value[kept], flat.progress[kept]
    kthroughput, kremaining = flat.throughput[kept], flat.remaining[kept]
    ks, ls = kstart.tolist(), flat.start.tolist()
    keeps, statics = (keep_at - kstart[:-1]).tolist(), static_at.tolist()
    # Per demand class: its rows, and whether that is every row (then each job's usage
    # is a view of ``coef``, not a fancy-indexed copy: 0.4 us against 2.5 us per job).
    rows_of: dict[Class, tuple[IntArray, bool]] = {}
    jobs = []
    for j, d in enumerate(demands):
        a, b = ks[j], ks[j + 1]
        la, lb = ls[j], ls[j + 1]
        # Without placements, jobs of one class share their rows; with them a job's rows
        # also depend on its demand's queue class (``_row_coefficients``).
        got = None if placed else rows_of.get(classes[j])
        if got is None:
            in_rows = np.flatnonzero(member[:, j])
            got = (in_rows, in_rows.size == len(rows))
            if not placed:
                rows_of[classes[j]] = got
        in_rows, every_row = got
        jobs.append(
            JobModel(
                demand=d,
                legal=flat.sizes[la:lb],
                legal_value=flat.value[la:lb],
                sizes=ksizes[a:b],
                value=kvalue[a:b],
                progress=kprogress[a:b],
                throughput=kthroughput[a:b],
                remaining_s=kremaining[a:b],
                rows=in_rows,
                coef=coef[:, a:b] if every_row else coef[in_rows, a:b],
                keep=keeps[j],
                static=statics[j],
                queue=flat.queue[j],
            )
        )
    return Compiled(
        problem,
        options,
        tuple(jobs),
        rows,
        rhs,
        kstart,
        kvalue,
        coef,
        ksizes,
        kprogress,
        kthroughput,
        keep_at,
        owner,
        _placement_groups(owner),
    )


__all__ = ["CAPACITY", "RECLAIM", "RESERVATION", "Compiled", "JobModel", "Row", "compile_problem"]
