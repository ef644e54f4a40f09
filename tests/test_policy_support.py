"""Builders, hypothesis strategies and independent oracles for the policy tests.

The oracles do not reuse the policy's own capacity code: feasibility is a max-flow over
pools (scipy's maximum_flow), and the brute force enumerates every legal size vector.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from hypothesis import strategies as st
from scipy.sparse.csgraph import maximum_flow

from slurm_elastic.policy.compiled import compile_problem
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.types import (
    AllocationProblem,
    ElasticDemand,
    NodePool,
    Outlook,
    Plan,
    RigidDemand,
    SizeEstimate,
)


def outlook(
    job_id: int,
    cur: int,
    sizes: tuple[int, ...],
    *,
    alpha: float = 0.8,
    scale: float = 1.0,
    work: float = 1e7,
    cost: float = 60.0,
) -> Outlook:
    est = tuple(SizeEstimate(n, scale * n**alpha, work / (scale * n**alpha)) for n in sizes)
    return Outlook(job_id, cur, est, work, cost)


def elastic(
    job_id: int,
    partition: str = "batch",
    cur: int = 0,
    sizes: tuple[int, ...] = (1, 2, 3, 4),
    *,
    weight: float = 1.0,
    submit: float = 0.0,
    frozen: bool = False,
    requested: int | None = None,
    entitled: int | None = None,
    loan_yields: bool = False,
    priority: float = 0.0,
    **kw: float,
) -> ElasticDemand:
    return ElasticDemand(
        job_id=job_id,
        partition=partition,
        current_nodes=cur,
        allowed_sizes=sizes,
        outlook=outlook(job_id, cur, sizes, **kw),
        weight=weight,
        submit_time=submit,
        requested_nodes=requested,
        frozen=frozen,
        priority=priority,
        entitled_nodes=entitled,
        loan_yields=loan_yields,
    )


def pools(**nodes: int) -> tuple[NodePool, ...]:
    """``pools(a=4, a_b=2)``: 4 nodes only in a, 2 nodes in both a and b."""
    return tuple(NodePool(frozenset(k.split("_")), v) for k, v in nodes.items())


def problem(
    jobs: list[ElasticDemand],
    node_pools: tuple[NodePool, ...],
    rigid: tuple[RigidDemand, ...] = (),
    **kw: float,
) -> AllocationProblem:
    return AllocationProblem(0.0, tuple(jobs), rigid, node_pools, **kw)


# --------------------------------------------------------------------------- oracles


def fits(p: AllocationProblem, sizes: dict[int, int]) -> bool:
    """Transportation feasibility by max-flow: classes demand nodes, pools supply them."""
    demand: dict[frozenset[str], int] = {}
    for d in p.elastic:
        c = frozenset(d.partition.split(","))
        demand[c] = demand.get(c, 0) + sizes[d.job_id]
    for r in p.rigid:
        if r.running:
            c = frozenset(r.partition.split(","))
            demand[c] = demand.get(c, 0) + r.nodes
    classes = [c for c, v in demand.items() if v > 0]
    need = sum(demand[c] for c in classes)
    if need == 0:
        return True
    n_cls, n_pool = len(classes), len(p.pools)
    src, sink = 0, 1 + n_cls + n_pool
    rows, cols, caps = [], [], []
    for i, c in enumerate(classes):
        rows.append(src)
        cols.append(1 + i)
        caps.append(demand[c])
        for k, pool in enumerate(p.pools):
            if pool.partitions & c:
                rows.append(1 + i)
                cols.append(1 + n_cls + k)
                caps.append(need)
    for k, pool in enumerate(p.pools):
        rows.append(1 + n_cls + k)
        cols.append(sink)
        caps.append(pool.nodes)
    graph = sp.csr_array((np.array(caps, dtype=np.int32), (rows, cols)), shape=(sink + 1, sink + 1))
    return int(maximum_flow(graph, src, sink).flow_value) == need


def legal_sizes(d: ElasticDemand, reclaiming: bool = False) -> list[int]:
    """The sizes a plan may give ``d``.  A frozen job keeps its size, except that a borrower
    (``loan_yields``) in a class with a reclaim row may give back its loan, down to the
    allowed size at or below its entitlement (``reclaim_grid_floor``)."""
    if d.frozen:
        if reclaiming and d.loan_yields and d.reclaim_grid_floor < d.current_nodes:
            lowest = d.reclaim_grid_floor
            return [s for s in d.allowed_sizes if lowest <= s < d.current_nodes] + [d.current_nodes]
        return [d.current_nodes]
    if d.current_nodes > 0:
        return sorted(set(d.allowed_sizes) | {d.current_nodes})
    return [0, *d.allowed_sizes]


def brute_force(
    p: AllocationProblem,
    options: PolicyOptions | None = None,
    must_start: frozenset[int] = frozenset(),
    *,
    loans_only: bool = False,
    holds: Callable[[AllocationProblem, dict[int, int]], bool] | None = None,
) -> float:
    """Best objective over every legal size vector that fits (capacity only) and gives
    every job in ``must_start`` a size.  ``loans_only``: among those that shrink no running
    borrower (a job with nodes on loan) below the size a reclaim leaves it at
    (``reclaim_grid_floor``).  ``holds``: among those it accepts (``reservations_hold``)."""
    compiled = compile_problem(p, options or PolicyOptions())
    floors = {
        d.job_id: d.reclaim_grid_floor for d in p.elastic if loans_only and d.is_running and d.loan
    }
    values = [
        dict(zip(j.legal.tolist(), j.legal_value.tolist(), strict=True)) for j in compiled.jobs
    ]
    # Whether a reclaim row covers a frozen borrower is the compile's reading of the queue
    # (the reclaim tests check it): it then offers more than the current size.  What the
    # borrower may give back is ``legal_sizes``'s own rule.
    reclaiming = [
        d.frozen and len(j.legal) > 1 for d, j in zip(p.elastic, compiled.jobs, strict=True)
    ]
    best = -math.inf
    for combo in itertools.product(
        *(legal_sizes(d, r) for d, r in zip(p.elastic, reclaiming, strict=True))
    ):
        sizes = {d.job_id: s for d, s in zip(p.elastic, combo, strict=True)}
        if any(sizes[j] == 0 for j in must_start):
            continue
        if any(sizes[j] < floor for j, floor in floors.items()):
            continue
        if fits(p, sizes) and (holds is None or holds(p, sizes)):
            best = max(best, sum(v[s] for v, s in zip(values, combo, strict=True)))
    return best


def fifo_admitted(p: AllocationProblem) -> frozenset[int]:
    """Pending jobs that fit, in Slurm's queue order, at their smallest candidate size while every
    running job is at its smallest (a frozen one at its size): the admission floor, by
    max-flow (capacity only: use without pending rigid jobs or frozen pending elastic ones,
    ``instances(pending_rigid=False, pending_frozen=False)``)."""
    compiled = compile_problem(p, PolicyOptions())
    sizes = {j.job_id: int(j.sizes[0]) for j in compiled.jobs}
    started: set[int] = set()
    for j in sorted(compiled.jobs, key=lambda j: _place(j.demand)):
        if j.demand.is_running or len(j.sizes) < 2:
            continue
        trial = {**sizes, j.job_id: int(j.sizes[1])}
        if fits(p, trial):
            sizes = trial
            started.add(j.job_id)
    return frozenset(started)


def targets(plan: Plan) -> dict[int, int]:
    return {d.job_id: d.target_nodes for d in plan.decisions}


def same_plan(a: Plan, b: Plan) -> bool:
    return (
        a.decisions == b.decisions
        and a.solver == b.solver
        and a.status == b.status
        and math.isclose(a.objective, b.objective, rel_tol=1e-12, abs_tol=1e-9)
    )


# --------------------------------------------------------------------------- strategies

PARTS = ("a", "b", "c")


@st.composite
def instances(
    draw: st.DrawFn,
    *,
    max_jobs: int = 4,
    one_pool: bool = False,
    pending_rigid: bool = True,
    pending_frozen: bool = True,
) -> AllocationProblem:
    """Small random problems whose *current* state fits (reality always does).
    ``pending_frozen=False``: only running jobs are frozen (a frozen pending job waits in
    Slurm's queue and is served in its order: the plan reserves for it like for a pending
    rigid job, which a capacity-only oracle cannot express)."""
    if one_pool:
        node_pools = (NodePool(frozenset({"a"}), draw(st.integers(0, 10))),)
        parts: tuple[str, ...] = ("a",)
    else:
        n_pools = draw(st.integers(1, 3))
        node_pools = tuple(
            NodePool(
                frozenset(draw(st.sets(st.sampled_from(PARTS), min_size=1, max_size=3))),
                draw(st.integers(0, 6)),
            )
            for _ in range(n_pools)
        )
        parts = (*PARTS, "a,b")
    n_jobs = draw(st.integers(1, max_jobs))
    jobs = []
    for i in range(n_jobs):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, lo + 4))
        step = draw(st.integers(1, 2))
        sizes = tuple(range(lo, hi + 1, step))
        running = draw(st.booleans())
        cur = draw(st.sampled_from(sizes)) if running else 0
        if running and draw(st.integers(0, 5)) == 0:
            cur = hi + 1  # off the grid (e.g. the step changed): keeping it is still allowed
        # Running jobs may hold nodes on loan above an entitlement between min and now.
        entitled = draw(st.one_of(st.none(), st.integers(lo, cur))) if cur >= lo else None
        jobs.append(
            elastic(
                100 + i,
                draw(st.sampled_from(parts)),
                cur,
                sizes,
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                submit=float(draw(st.integers(0, 5))),
                frozen=draw(st.integers(0, 4)) == 0 and (pending_frozen or running),
                requested=draw(st.one_of(st.none(), st.integers(1, hi + 1))),
                entitled=entitled,
                loan_yields=draw(st.booleans()),
                priority=draw(st.sampled_from([0.0, 0.0, 10.0])),
                alpha=draw(st.floats(0.2, 1.0)),
                scale=draw(st.sampled_from([0.5, 1.0, 3.0])),
                work=draw(st.sampled_from([50.0, 2000.0, 1e5, math.inf])),
                cost=draw(st.sampled_from([0.0, 30.0, 600.0, 5000.0])),
            )
        )
    rigid = []
    for i in range(draw(st.integers(0, 4))):
        running = not pending_rigid or draw(st.booleans())
        rigid.append(
            RigidDemand(
                900 + i,
                draw(st.sampled_from(parts)),
                draw(st.integers(1, 4)),
                running,
                submit_time=float(draw(st.integers(0, 5))),
                priority=draw(st.sampled_from([0.0, 0.0, 10.0])),
                startable=running or draw(st.integers(0, 3)) > 0,
            )
        )
    p = problem(jobs, node_pools, tuple(rigid), horizon_s=draw(st.sampled_from([600.0, 3600.0])))
    current = {d.job_id: d.current_nodes for d in p.elastic}
    if not fits(p, current):  # the cluster as it is must fit; drop running rigid until it does
        idle = tuple(r for r in rigid if not r.running)
        p = problem(jobs, node_pools, idle, horizon_s=p.horizon_s)
    if not fits(p, current):
        p = problem(
            [d if d.current_nodes == 0 else _pending(d) for d in jobs],
            node_pools,
            p.rigid,
            horizon_s=p.horizon_s,
        )
    return p


def _pending(d: ElasticDemand) -> ElasticDemand:
    return elastic(d.job_id, d.partition, 0, d.allowed_sizes, submit=d.submit_time)


def _place(d: ElasticDemand | RigidDemand) -> tuple[float, float, int]:
    """Slurm's queue order: higher priority first, then submit time, then job id."""
    return (-d.priority, d.submit_time, d.job_id)


def reservations_hold(p: AllocationProblem, sizes: dict[int, int]) -> bool:
    """The reservation and reclaim rules written out naively (one partition, every pending
    rigid job), from the ``policy.capacity`` docstring."""
    cap = sum(pool.nodes for pool in p.pools)
    rigid_running = sum(r.nodes for r in p.rigid if r.running)
    running = [d for d in p.elastic if d.current_nodes > 0]
    pending = [d for d in p.elastic if d.current_nodes == 0]
    queue = sorted((r for r in p.rigid if not r.running and r.startable), key=_place)
    loans = sum(d.current_nodes - d.reclaim_floor for d in running)  # one partition: all
    promised = sum(r.nodes for r in p.rigid if not r.running and not r.startable)
    if promised:  # growth stays out of the nodes of a start promised soon
        free = cap - rigid_running - sum(d.current_nodes for d in running) - promised
        if sum(sizes[d.job_id] - d.current_nodes for d in running) > max(0, free):
            return False
    for k, r in enumerate(queue):
        ahead = [d for d in pending if _place(d) < _place(r)]
        behind = [d for d in pending if _place(d) > _place(r)]
        free = cap - rigid_running - sum(d.current_nodes for d in running)
        free -= sum(d.min_nodes for d in ahead) + sum(q.nodes for q in queue[: k + 1])
        reclaim = free < 0 <= free + loans
        if reclaim and _given_back(running, sizes) > free:
            return False
        if _claims(running, ahead, behind, sizes) > (free if reclaim else max(0, free)):
            return False
    for e in sorted(pending, key=_place):  # a pending elastic job that loans hold back
        if e.frozen:
            continue  # cannot start this cycle: reclaims nothing
        ahead = [d for d in pending if _place(d) <= _place(e)]
        behind = [d for d in pending if _place(d) > _place(e)]
        free = cap - rigid_running - sum(d.current_nodes for d in running)
        free -= sum(d.min_nodes for d in ahead) + sum(
            q.nodes for q in queue if _place(q) < _place(e)
        )
        if not free < 0 <= free + loans:
            continue
        if _given_back(running, sizes) > free or _claims(running, ahead, behind, sizes) > free:
            return False
    return True


def _claims(
    running: list[ElasticDemand],
    ahead: list[ElasticDemand],
    behind: list[ElasticDemand],
    sizes: dict[int, int],
) -> int:
    """What a reservation protects a waiting job's nodes from: running jobs' growth (a
    shrink counted whole), the jobs ahead above their minimum, the jobs behind whole."""
    claims = sum(sizes[d.job_id] - d.current_nodes for d in running)
    claims += sum(sizes[d.job_id] - d.min_nodes for d in ahead if sizes[d.job_id] > 0)
    return claims + sum(sizes[d.job_id] for d in behind)


def _given_back(running: list[ElasticDemand], sizes: dict[int, int]) -> int:
    """The growth of running jobs less the loans they give back (a shrink counts only down
    to the size a reclaim leaves the job at): a reclaim's first rule."""
    return sum(max(sizes[d.job_id], d.reclaim_grid_floor) - d.current_nodes for d in running)


def test_the_solver_banner_never_reaches_stdout() -> None:
    """HiGHS prints a banner from a process's first Highs(), before any option can be set;
    the daemon's stdout (its journal under systemd) must not carry it."""
    import subprocess
    import sys

    def stdout_of(code: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout

    plain = "import highspy; highspy.Highs(); print('done')"
    assert "Running HiGHS" in stdout_of(plain)  # what is being hidden, in this highspy
    quiet = "from slurm_elastic.policy.mip import quiet_solver_banner as q; q(); q(); " + plain
    assert stdout_of("print('before', flush=True); " + quiet) == "before\ndone\n"
