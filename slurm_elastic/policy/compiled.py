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
``progress_j(s) = min(W_j, f_j(s) * H_eff)`` steps over the horizon ``H``, where ``f_j`` is
the outlook's throughput (linear interpolation between estimated sizes, flat beyond
them; a job with no estimate is assumed to scale linearly), ``W_j`` the remaining work and
``H_eff = H - c_j`` when a running job changes size (``c_j`` = measured restart cost in
seconds of lost progress), else ``H``.  Capping at ``W_j`` is what stops nodes going to a
job that finishes inside the horizon anyway.  Steps of different jobs are not comparable,
so the value is expressed in *node-seconds at the job's minimum-size efficiency*:

    value_j(s) = w_j * progress_j(s) * min_j / f_j(min_j)  -  penalty * H * [s != current]

A job running at its minimum for the whole horizon is worth ``min_j * H``; extra nodes are
worth what they add in speed-up.  ``w_j`` is the priority / fair-share weight.

Payback: a larger candidate whose value is not higher than that of a smaller candidate
is dominated (it needs at least as much of every row for no more value) and is dropped.
For a running job this is exactly "a growth must pay back its resize cost within the
horizon".  Dropping dominated candidates never changes the optimum.

Greedy's utility is Optimus' own: remaining time ``T_j(s) = c_j [resized] + W_j / f_j(s)``
(a job with unknown remaining work gets one horizon's work at its largest size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from slurm_elastic.errors import SolverError
from slurm_elastic.policy.capacity import (
    CAPACITY,
    RESERVATION,
    Class,
    RowSpec,
    build_rows,
    demand_class,
    fifo_key,
)
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.types import AllocationProblem, ElasticDemand

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    kind: str  # CAPACITY or RESERVATION
    rhs: float


@dataclass(frozen=True, slots=True, eq=False)
class JobModel:
    """One elastic job's candidates and what each costs and buys."""

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
    fifo: tuple[float, int]

    @property
    def job_id(self) -> int:
        return self.demand.job_id

    def index(self, size: int) -> int | None:
        hit = np.flatnonzero(self.sizes == size)
        return int(hit[0]) if hit.size else None


@dataclass(frozen=True, slots=True, eq=False)
class Compiled:
    problem: AllocationProblem
    options: PolicyOptions
    jobs: tuple[JobModel, ...]  # in the problem's order
    rows: tuple[Row, ...]

    def floor_usage(self) -> FloatArray:
        usage = np.zeros(len(self.rows))
        for j in self.jobs:
            usage[j.rows] += j.coef[:, 0]
        return usage

    def usage(self, choice: Sequence[int]) -> FloatArray:
        usage = np.zeros(len(self.rows))
        for j, k in zip(self.jobs, choice, strict=True):
            usage[j.rows] += j.coef[:, k]
        return usage

    def objective(self, choice: Sequence[int]) -> float:
        return float(sum(j.value[k] for j, k in zip(self.jobs, choice, strict=True)))

    def feasible(self, choice: Sequence[int]) -> bool:
        return bool(np.all(self.usage(choice) <= self.rhs + _EPS))

    @property
    def rhs(self) -> FloatArray:
        return np.array([r.rhs for r in self.rows], dtype=float)


# --------------------------------------------------------------------------- validation


def _validate(problem: AllocationProblem) -> None:
    if not (problem.horizon_s > 0 and math.isfinite(problem.horizon_s)):
        raise SolverError(f"horizon_s must be a positive number, got {problem.horizon_s!r}")
    if not problem.time_limit_s > 0:
        raise SolverError(f"time_limit_s must be positive, got {problem.time_limit_s!r}")
    seen: set[int] = set()
    for d in problem.elastic:
        if d.job_id in seen:
            raise SolverError(f"job {d.job_id} appears twice in the problem")
        seen.add(d.job_id)
        sizes = d.allowed_sizes
        if not sizes or any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise SolverError(
                f"job {d.job_id}: allowed_sizes must be ascending, distinct and >= 1, got {sizes!r}"
            )
        if d.current_nodes < 0:
            raise SolverError(f"job {d.job_id}: negative current_nodes {d.current_nodes}")
        if not (d.weight >= 0 and math.isfinite(d.weight)):
            raise SolverError(f"job {d.job_id}: weight must be finite and >= 0, got {d.weight}")
        if d.outlook.resize_cost_s < 0 or math.isnan(d.outlook.resize_cost_s):
            raise SolverError(f"job {d.job_id}: resize_cost_s must be >= 0")
        if any(not s.throughput >= 0 for s in d.outlook.sizes):
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


def _legal_sizes(d: ElasticDemand) -> list[int]:
    if d.frozen:
        return [d.current_nodes]
    if d.is_running:
        return sorted(set(d.allowed_sizes) | {d.current_nodes})
    return [0, *d.allowed_sizes]


def _static_size(d: ElasticDemand) -> int:
    """What the job asked for: requested_nodes (snapped down to the grid), else its max."""
    if d.frozen or d.is_running:
        return d.current_nodes
    want = d.requested_nodes if d.requested_nodes is not None else d.max_nodes
    fitting = [s for s in d.allowed_sizes if s <= want]
    return fitting[-1] if fitting else d.min_nodes


def _throughput(d: ElasticDemand, sizes: IntArray) -> FloatArray:
    est = d.outlook.sizes
    if not est:
        thr = sizes.astype(float)  # no estimate: assume linear speed-up
    else:
        xs = np.array([e.nodes for e in est], dtype=float)
        ys = np.array([e.throughput for e in est], dtype=float)
        order = np.argsort(xs, kind="stable")
        thr = np.interp(sizes.astype(float), xs[order], ys[order])
    return np.where(sizes > 0, thr, 0.0)


def _job_values(
    d: ElasticDemand, sizes: IntArray, horizon: float, penalty: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    thr = _throughput(d, sizes)
    work = d.outlook.remaining_work
    work = max(work, 0.0) if math.isfinite(work) else math.inf
    cost = d.outlook.resize_cost_s
    resized = (sizes != d.current_nodes) & d.is_running
    heff = np.where(resized, max(horizon - cost, 0.0), horizon)
    progress = np.minimum(work, thr * heff)
    ref = float(_throughput(d, np.array([d.min_nodes]))[0])
    scale = d.weight * d.min_nodes / ref if ref > 0 else 0.0
    value = progress * scale - penalty * horizon * (sizes != d.current_nodes)
    nominal = work if math.isfinite(work) else float(thr.max()) * horizon
    with np.errstate(divide="ignore", invalid="ignore"):
        remaining = np.where(thr > 0, nominal / thr, math.inf) + np.where(resized, cost, 0.0)
    return value, progress, thr, remaining


def _undominated(value: FloatArray, protect: set[int]) -> list[int]:
    keep: list[int] = []
    best = -math.inf
    for k, v in enumerate(value):
        if k == 0 or v > best + _EPS or k in protect:
            keep.append(k)
        best = max(best, v)
    return keep


# --------------------------------------------------------------------------- compile


def _coefficients(
    d: ElasticDemand, sizes: IntArray, specs: list[RowSpec], cls: Class
) -> tuple[list[int], list[FloatArray]]:
    ids: list[int] = []
    coefs: list[FloatArray] = []
    key = fifo_key(d.submit_time, d.job_id)
    s = sizes.astype(float)
    for i, spec in enumerate(specs):
        if cls not in spec.classes:
            continue
        if spec.kind == CAPACITY:
            c = s
        elif d.is_running:
            c = s - d.current_nodes
        elif spec.cutoff is not None and key < spec.cutoff:
            c = np.where(sizes > 0, s - d.min_nodes, 0.0)
        else:
            c = s
        ids.append(i)
        coefs.append(c)
    return ids, coefs


def compile_problem(problem: AllocationProblem, options: PolicyOptions) -> Compiled:
    """Validate and compile; raises SolverError with a one-line reason on bad input."""
    _validate(problem)
    classes_of = {d.job_id: demand_class(d.partition) for d in problem.elastic}
    specs = build_rows(problem, classes_of, options.max_component_classes)
    staged = []
    for d in problem.elastic:
        legal = np.array(_legal_sizes(d), dtype=np.int64)
        value, progress, thr, remaining = _job_values(
            d, legal, problem.horizon_s, options.change_penalty
        )
        protect = {int(np.flatnonzero(legal == x)[0]) for x in (d.current_nodes, _static_size(d))}
        keep = _undominated(value, protect)
        sizes = legal[keep]
        ids, coefs = _coefficients(d, sizes, specs, classes_of[d.job_id])
        staged.append((d, legal, sizes, keep, value, progress, thr, remaining, ids, coefs))

    # Relax each row to what the jobs' floors already use (never force below min), and
    # drop rows that no choice can violate.
    n = len(specs)
    floor = np.zeros(n)
    top = np.zeros(n)
    for *_, ids, coefs in staged:
        for i, c in zip(ids, coefs, strict=True):
            floor[i] += c[0]
            top[i] += c.max()
    rhs = np.array([max(s.rhs, floor[i]) for i, s in enumerate(specs)])
    live = [i for i in range(n) if top[i] > rhs[i] + _EPS]
    renum = {old: new for new, old in enumerate(live)}
    rows = tuple(Row(specs[i].name, specs[i].kind, float(rhs[i])) for i in live)

    jobs = []
    for d, legal, sizes, keep, value, progress, thr, remaining, ids, coefs in staged:
        kept_ids = [renum[i] for i in ids if i in renum]
        kept_coefs = [c for i, c in zip(ids, coefs, strict=True) if i in renum]
        jobs.append(
            JobModel(
                demand=d,
                legal=legal,
                legal_value=value,
                sizes=sizes,
                value=value[keep],
                progress=progress[keep],
                throughput=thr[keep],
                remaining_s=remaining[keep],
                rows=np.array(kept_ids, dtype=np.int64),
                coef=np.array(kept_coefs, dtype=float).reshape(len(kept_ids), len(sizes)),
                keep=int(np.flatnonzero(sizes == d.current_nodes)[0]),
                static=int(np.flatnonzero(sizes == _static_size(d))[0]),
                fifo=fifo_key(d.submit_time, d.job_id),
            )
        )
    return Compiled(problem, options, tuple(jobs), rows)


__all__ = ["CAPACITY", "RESERVATION", "Compiled", "JobModel", "Row", "compile_problem"]
