"""The compile and plan-building shortcuts give exactly what the plain computation gives.

``compile_problem`` memoises the capacity helpers (partition classes, Hall sets, row
names), reads throughputs straight off an outlook that has exactly the candidate sizes,
gives a job in every row a view of the row usage, and keeps flat per-candidate arrays
that ``build_plan`` gathers from; ``Ledger`` and greedy do their arithmetic in Python
floats.  Random instances check each against the computation written out plainly.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.policy.capacity import (
    CAPACITY,
    RECLAIM,
    RowSpec,
    _name,
    build_rows,
    demand_class,
    hall_sets,
    queue_key,
)
from slurm_elastic.policy.compiled import Compiled, _throughput, compile_problem
from slurm_elastic.policy.explain import build_plan
from slurm_elastic.policy.ledger import Ledger
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.types import AllocationProblem, ElasticDemand, SizeEstimate, SolverStatus
from tests.test_policy_support import instances, outlook

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTIONS = PolicyOptions(isolate=False)


def _bits(xs: object) -> list[str]:
    """Floats down to the sign of a zero and the payload of a NaN."""
    return [float(x).hex() if not math.isnan(x) else "nan" for x in np.ravel(xs)]


def _fresh(c: frozenset[str]) -> frozenset[str]:
    """An equal class that is not the same object (as the next cycle's would be)."""
    return frozenset(list(c))


@SOME
@given(p=instances(max_jobs=6))
def test_memoised_capacity_helpers_match_the_plain_computation(p: AllocationProblem) -> None:
    for d in (*p.elastic, *p.rigid):
        assert demand_class(d.partition) == demand_class.__wrapped__(d.partition)
    classes = sorted(
        {demand_class(d.partition) for d in (*p.elastic, *p.rigid)}, key=lambda c: sorted(c)
    )
    plain = hall_sets.__wrapped__(tuple(classes), p.pools, 12)
    for _ in range(2):  # the second call is answered from the cache
        again = hall_sets(
            tuple(_fresh(c) for c in classes),
            tuple(dataclasses.replace(pool) for pool in p.pools),
            12,
        )
        assert again == plain
        assert [_name(s) for s, _ in again] == [_name.__wrapped__(s) for s, _ in plain]


def _plain_throughput(d: ElasticDemand, sizes: list[int]) -> list[float]:
    est = {e.nodes: e.throughput for e in d.outlook.sizes}
    if not est:
        return [float(s) for s in sizes]
    if all(s == 0 or s in est for s in sizes):
        return [float(est[s]) if s > 0 else 0.0 for s in sizes]
    xs = sorted(est)
    thr = np.interp(np.array(sizes, dtype=float), xs, [est[x] for x in xs])
    return [float(x) if s > 0 else 0.0 for s, x in zip(sizes, thr, strict=True)]


def test_throughput_read_off_matches_lookup_and_interpolation() -> None:
    rng = random.Random(5)
    base = outlook(1, 0, (1,))
    for _ in range(3000):
        grid = sorted(rng.sample(range(1, 12), rng.randint(1, 6)))
        known = [n for n in grid if rng.random() < 0.85] if rng.random() < 0.5 else grid
        if rng.random() < 0.2:
            known = sorted(set(known) | {rng.randint(1, 14)})
        ests = tuple(
            SizeEstimate(n, rng.choice([0.0, rng.uniform(0.1, 9.0), math.inf]), 1.0) for n in known
        )
        if rng.random() < 0.2:  # a duplicate size: the later estimate counts
            ests += (SizeEstimate(rng.choice(grid), rng.uniform(0.1, 9.0), 1.0),)
        sizes = rng.choice([grid, [0, *grid], sorted({*grid, rng.randint(1, 14)})])
        d = ElasticDemand(1, "a", 0, tuple(grid), dataclasses.replace(base, sizes=ests))
        assert _bits(_throughput(d, sizes)) == _bits(_plain_throughput(d, sizes))


def _plain_coefficient(spec: RowSpec, d: ElasticDemand, size: int) -> float:
    """A row's usage by job ``d`` at ``size``, from the ``capacity`` docstring."""
    if demand_class(d.partition) not in spec.classes:
        return 0.0
    if spec.growth_only:  # a promise row: running jobs' growth only
        return float(size - d.current_nodes) if d.is_running else 0.0
    if spec.kind == CAPACITY or spec.cutoff is None:
        return float(size)
    if spec.kind == RECLAIM:  # the loans given back: a shrink down to the entitlement only
        return float(max(size, d.reclaim_grid_floor) - d.current_nodes) if d.is_running else 0.0
    if d.is_running:
        return float(size - d.current_nodes)
    key = queue_key(d.priority, d.submit_time, d.job_id)
    if key < spec.cutoff or (spec.through and key == spec.cutoff):
        return float(size - d.min_nodes) if size > 0 else 0.0
    return float(size)


def _check_views(p: AllocationProblem, c: Compiled) -> None:
    specs = {
        s.name: s
        for s in build_rows(
            p,
            {d.job_id: demand_class(d.partition) for d in p.elastic},
            OPTIONS.max_component_classes,
        )
    }
    assert _bits(c.rhs) == _bits([r.rhs for r in c.rows]) and not c.rhs.flags.writeable
    for j, job in enumerate(c.jobs):
        a, b = int(c.start[j]), int(c.start[j + 1])
        assert c.sizes[a:b].tolist() == job.sizes.tolist()
        assert _bits(c.value[a:b]) == _bits(job.value)
        assert _bits(c.progress[a:b]) == _bits(job.progress)
        assert _bits(c.throughput[a:b]) == _bits(job.throughput)
        assert int(c.keep[j]) == a + job.keep
        assert job.coef.shape == (job.rows.size, b - a)
        assert _bits(job.coef) == _bits(c.coef[job.rows, a:b])
        for r, row in enumerate(c.rows):
            spec = specs[row.name]
            want = [_plain_coefficient(spec, job.demand, int(s)) for s in job.sizes]
            assert _bits(c.coef[r, a:b]) == _bits(want)
            in_row = demand_class(job.demand.partition) in spec.classes
            assert (r in job.rows.tolist()) == in_row


@SOME
@given(p=instances(max_jobs=6))
def test_flat_arrays_job_views_and_rows_agree(p: AllocationProblem) -> None:
    _check_views(p, compile_problem(p, OPTIONS))


def _plain_violated(c: Compiled, choice: list[int], i: int, to: int) -> int | None:
    job = c.jobs[i]
    usage = c.usage(choice)
    delta = job.coef[:, to] - job.coef[:, choice[i]]
    hit = np.flatnonzero((usage[job.rows] + delta > c.rhs[job.rows] + 1e-9) & (delta > 0))
    return int(job.rows[hit[0]]) if hit.size else None


@SOME
@given(p=instances(max_jobs=6), seed=st.integers(0, 2**16))
def test_ledger_matches_array_arithmetic(p: AllocationProblem, seed: int) -> None:
    c = compile_problem(p, OPTIONS)
    ledger = Ledger(c)
    rng = random.Random(seed)
    for _ in range(20):
        if not c.jobs:
            break
        i = rng.randrange(len(c.jobs))
        to = rng.randrange(len(c.jobs[i].sizes))
        assert ledger.violated(i, to) == _plain_violated(c, ledger.choice, i, to)
        ledger.move(i, to)
        assert _bits(ledger.usage) == _bits(c.usage(ledger.choice))


@SOME
@given(p=instances(max_jobs=6), seed=st.integers(0, 2**16))
def test_plan_reads_each_jobs_choice(p: AllocationProblem, seed: int) -> None:
    c = compile_problem(p, OPTIONS)
    rng = random.Random(seed)
    choice = [rng.randrange(len(job.sizes)) for job in c.jobs]
    plan = build_plan(c, choice, solver="mip", status=SolverStatus.OPTIMAL)
    assert _bits([plan.objective]) == _bits([c.objective(choice)])
    for job, k, dec in zip(c.jobs, choice, plan.decisions, strict=True):
        d = job.demand
        assert dec.target_nodes == int(job.sizes[k])
        gain = float(job.progress[k] - job.progress[job.keep])
        assert _bits([dec.explanation.predicted_gain]) == _bits([gain])
        resized = d.is_running and int(job.sizes[k]) != d.current_nodes
        cost = float(job.throughput[k]) * min(d.outlook.resize_cost_s, p.horizon_s)
        assert _bits([dec.explanation.resize_cost]) == _bits([cost if resized else 0.0])
        last = k + 1 == len(job.sizes)
        if last and not d.frozen:
            want = "max" if int(job.sizes[k]) >= int(job.legal.max()) else "payback"
            assert dec.explanation.rule == want
