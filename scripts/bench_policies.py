"""Benchmark the allocation policies: decision time and plan quality at three scales.

Instances use real data through the real model code:
* jobs are drawn from the Microsoft ITP cluster06 trace with ElasticFlow's model, batch
  size and iteration counts (``../shared/traces/itp_elasticflow/augmented/cluster06.csv``);
* each job's speed curve is ``slurm_elastic.model.throughput.fit_throughput`` fitted to
  ElasticFlow's measured A100 iterations/s for its model and batch size
  (``../shared/traces/elasticflow_throughputs/A100/``), with 8 GPUs per node, so the
  table's 8..64 GPUs are 1..8 nodes;
* the ``Outlook`` comes from ``slurm_elastic.model.outlook.estimate_outlook`` (remaining
  work = the trace's iterations minus a random fraction already done for running jobs).

Scales: (100 jobs, 256 GPUs = 32 nodes), (1,000, 1,024 GPUs = 128 nodes), (10,000,
16,384 GPUs = 2,048 nodes); one partition, so the DP optimum is the reference.  The
cluster is filled in submit order with running jobs at their requested size up to 95%;
the rest is pending.  Times are wall-clock ``allocate()`` calls (compile, solve, plan and
explanations included), one call per instance per policy after one untimed warm-up.

Also: pulp's model-building time (the named modelling layer, measured to justify not
using it on the decision path), and a variant with two partitions sharing 40% of the
nodes plus pending rigid jobs (several coupled rows; no DP reference there).  The load
average is printed because the development machine is shared.

Last line: ``key=value`` figures.  Run: ``python scripts/bench_policies.py [--quick]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from slurm_elastic.model.outlook import JobFit, estimate_outlook
from slurm_elastic.model.priors import Prior
from slurm_elastic.model.throughput import ThroughputFit, fit_throughput
from slurm_elastic.policy import PolicyOptions, allocate
from slurm_elastic.policy.compiled import compile_problem
from slurm_elastic.policy.pulp_model import build_pulp, solve_pulp
from slurm_elastic.policy.registry import POLICIES
from slurm_elastic.types import (
    AllocationProblem,
    ElasticDemand,
    ElasticSpec,
    NodePool,
    RigidDemand,
)

GPUS_PER_NODE = 8
MAX_NODES = 8
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SCALES = ((100, 256), (1_000, 1_024), (10_000, 16_384))
NO_FLOOR = PolicyOptions(fair_floor=False)


@dataclass(frozen=True)
class TraceJob:
    model: str
    batch: int
    gpus: int
    iterations: int


def load_profiles(traces: Path) -> dict[tuple[str, int], ThroughputFit]:
    """Fit the real throughput model to every (model, global batch) row of the A100 tables."""
    fits: dict[tuple[str, int], ThroughputFit] = {}
    for path in sorted((traces / "elasticflow_throughputs" / "A100").glob("*.csv")):
        with path.open() as fh:
            for row in csv.DictReader(fh):
                nodes, rates = [], []
                for g in (8, 16, 32, 64):
                    v = float(row[str(g)]) if row[str(g)] not in ("", "nan") else math.nan
                    if math.isfinite(v) and v > 0:
                        nodes.append(g // GPUS_PER_NODE)
                        rates.append(v)
                fit = fit_throughput(nodes, rates) if nodes else None
                if fit is not None:
                    fits[(path.stem, int(row["global_batch_size"]))] = fit
    return fits


def load_jobs(traces: Path, fits: dict[tuple[str, int], ThroughputFit]) -> list[TraceJob]:
    out = []
    with (traces / "itp_elasticflow" / "augmented" / "cluster06.csv").open() as fh:
        for row in csv.DictReader(fh):
            key = (row["model_name"], int(row["batch_size"]))
            if key in fits and int(row["num_iteration"]) > 0:
                out.append(TraceJob(key[0], key[1], int(row["num_gpu"]), int(row["num_iteration"])))
    return out


def build_problem(
    n_jobs: int,
    gpus: int,
    seed: int,
    jobs: list[TraceJob],
    fits: dict[tuple[str, int], ThroughputFit],
    time_limit_s: float,
    shared: bool = False,
) -> AllocationProblem:
    """One instance; ``shared``: two partitions sharing 40% of the nodes, plus pending rigid
    jobs (2% of the job count) interleaved in the FIFO queue."""
    rng = np.random.default_rng(seed)
    capacity = gpus // GPUS_PER_NODE
    picks = rng.integers(0, len(jobs), size=n_jobs)
    submits = np.sort(rng.uniform(0.0, 86_400.0, size=n_jobs))
    now = 86_400.0
    used = 0
    demands = []
    for i, (pick, submit) in enumerate(zip(picks, submits, strict=True)):
        tj = jobs[int(pick)]
        fit = fits[(tj.model, tj.batch)]
        want = min(MAX_NODES, max(1, math.ceil(tj.gpus / GPUS_PER_NODE)))
        spec = ElasticSpec(min_nodes=max(1, want // 2), max_nodes=MAX_NODES)
        running = used + want <= 0.95 * capacity
        cur = want if running else 0
        used += cur
        done = int(tj.iterations * rng.uniform(0.05, 0.95)) if running else 0
        cost = float(rng.uniform(20.0, 120.0))
        job_fit = JobFit(
            job_id=i,
            step=done,
            time=now,
            nodes=cur,
            n_reports=1 if running else 0,
            convergence=None,
            throughput=fit,
            total_steps=tj.iterations,
            target_metric=None,
            resize_cost_s=cost,
        )
        prior = Prior(
            runtime_s=tj.iterations / fit.throughput(want),
            reference_nodes=want,
            scaling=fit.params,
            scaling_measured=True,
            total_steps=float(tj.iterations),
            sizes_used=(want,),
            n_similar=0,
            source="site",
        )
        outlook = estimate_outlook(
            job_id=i,
            spec=spec,
            current_nodes=cur,
            fit=job_fit,
            prior=prior,
            now=now,
            default_resize_cost_s=cost,
        )
        demands.append(
            ElasticDemand(
                job_id=i,
                partition="long" if shared and i % 3 == 0 else "gpu",
                current_nodes=cur,
                allowed_sizes=spec.allowed_sizes,
                outlook=outlook,
                submit_time=float(submit),
                requested_nodes=want,
            )
        )
    pools = (NodePool(frozenset({"gpu"}), capacity),)
    rigid: tuple[RigidDemand, ...] = ()
    if shared:
        both, long_only = int(0.4 * capacity), int(0.2 * capacity)
        pools = (
            NodePool(frozenset({"gpu"}), capacity - both - long_only),
            NodePool(frozenset({"gpu", "long"}), both),
            NodePool(frozenset({"long"}), long_only),
        )
        rigid = tuple(
            RigidDemand(
                job_id=n_jobs + k,
                partition=str(rng.choice(["gpu", "long"])),
                nodes=int(rng.integers(1, MAX_NODES + 1)),
                running=False,
                submit_time=float(rng.uniform(0.0, 86_400.0)),
            )
            for k in range(max(1, n_jobs // 50))
        )
    return AllocationProblem(
        now=now,
        elastic=tuple(demands),
        rigid=rigid,
        pools=pools,
        horizon_s=3600.0,
        time_limit_s=time_limit_s,
    )


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q, method="higher"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances (a smoke run)")
    ap.add_argument("--traces", type=Path, default=TRACES)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

    fits = load_profiles(args.traces)
    jobs = load_jobs(args.traces, fits)
    instances = {100: 30, 1_000: 20, 10_000: 8} if not args.quick else {100: 5, 1_000: 5, 10_000: 2}
    limits = {100: 1.0, 1_000: 1.0, 10_000: 2.0}
    load_start = os.getloadavg()[0]
    print(
        f"profiles={len(fits)} trace_jobs={len(jobs)} gpus_per_node={GPUS_PER_NODE} "
        f"cpus={os.cpu_count()} load_avg_1m={load_start:.2f}"
    )
    figures: dict[str, float] = {}
    for n_jobs, gpus in SCALES:
        times: dict[str, list[float]] = {p: [] for p in POLICIES}
        objs: dict[str, list[float]] = {p: [] for p in POLICIES}
        notes: list[str] = []
        warm = build_problem(n_jobs, gpus, 10_000, jobs, fits, limits[n_jobs])
        for p in POLICIES:
            allocate(warm, p)
        open_mip: list[float] = []
        for seed in range(instances[n_jobs]):
            prob = build_problem(n_jobs, gpus, seed, jobs, fits, limits[n_jobs])
            for p in POLICIES:
                t = time.perf_counter()
                plan = allocate(prob, p)
                times[p].append(time.perf_counter() - t)
                objs[p].append(plan.objective)
                if plan.solver != p:
                    notes.append(f"{p}->{plan.solver}: {plan.note}")
            # The gap is measured on the problem dp solves: dp knows no admission floor.
            open_mip.append(allocate(prob, "mip", options=NO_FLOOR).objective)
        dp = np.array(objs["dp"])
        gap = float(np.max((dp - np.array(open_mip)) / np.abs(dp)))
        vs_greedy = float(np.median(np.array(objs["mip"]) / np.array(objs["greedy"])))
        vs_static = float(np.median(np.array(objs["mip"]) / np.array(objs["static"])))
        print(
            f"jobs={n_jobs} gpus={gpus} nodes={gpus // GPUS_PER_NODE} "
            f"instances={instances[n_jobs]} mip_gap_vs_dp_max={gap:.2e} "
            f"mip/greedy={vs_greedy:.4f} mip/static={vs_static:.4f}"
        )
        for p in POLICIES:
            print(f"  {p:7s} p50={pct(times[p], 50):.4f}s p99={pct(times[p], 99):.4f}s")
            figures[f"{p}_p50_{n_jobs}_s"] = pct(times[p], 50)
            figures[f"{p}_p99_{n_jobs}_s"] = pct(times[p], 99)
        for note in notes:
            print(f"  fallback: {note}")
        if n_jobs >= 1_000:
            compiled = compile_problem(prob, PolicyOptions())
            t = time.perf_counter()
            build_pulp(compiled)
            figures[f"pulp_build_{n_jobs}_s"] = time.perf_counter() - t
            print(f"  pulp model build (no solve) {figures[f'pulp_build_{n_jobs}_s']:.3f}s")
            if n_jobs == 1_000:
                t = time.perf_counter()
                choice = solve_pulp(compiled, time_limit_s=60.0)
                figures["pulp_solve_1000_s"] = time.perf_counter() - t
                ratio = compiled.objective(choice) / objs["mip"][-1]
                took = figures["pulp_solve_1000_s"]
                print(f"  pulp+HiGHS build+solve {took:.3f}s, objective/mip={ratio:.6f}")
        figures[f"mip_gap_{n_jobs}"] = max(gap, 0.0)
        figures[f"mip_vs_greedy_objective_{n_jobs}"] = vs_greedy
        figures[f"mip_vs_static_objective_{n_jobs}"] = vs_static
        figures[f"fallbacks_{n_jobs}"] = float(len(notes))
    for n_jobs, gpus in SCALES[1:]:
        shared_times: dict[str, list[float]] = {"mip": [], "greedy": []}
        ratios, rows, statuses = [], 0, set()
        for seed in range(instances[n_jobs] // 2):
            prob = build_problem(n_jobs, gpus, seed, jobs, fits, limits[n_jobs], shared=True)
            plans = {}
            for p in shared_times:
                t = time.perf_counter()
                plans[p] = allocate(prob, p)
                shared_times[p].append(time.perf_counter() - t)
            ratios.append(plans["mip"].objective / plans["greedy"].objective)
            rows = len(compile_problem(prob, PolicyOptions()).rows)
            statuses.add(f"{plans['mip'].solver}/{plans['mip'].status}")
        print(
            f"shared partitions + pending rigid: jobs={n_jobs} rows={rows} "
            f"mip p50={pct(shared_times['mip'], 50):.4f}s p99={pct(shared_times['mip'], 99):.4f}s "
            f"greedy p50={pct(shared_times['greedy'], 50):.4f}s "
            f"mip/greedy={float(np.median(ratios)):.4f} mip={','.join(sorted(statuses))}"
        )
        figures[f"shared_mip_p99_{n_jobs}_s"] = pct(shared_times["mip"], 99)
        figures[f"shared_mip_vs_greedy_objective_{n_jobs}"] = float(np.median(ratios))
    keys = [
        "mip_p50_1000_s",
        "mip_p99_1000_s",
        "mip_p99_10000_s",
        "mip_gap_10000",
        "mip_vs_greedy_objective_1000",
    ]
    figures["load_avg_1m_start"] = load_start
    figures["load_avg_1m_end"] = os.getloadavg()[0]
    rest = sorted(k for k in figures if k not in keys)
    print(" ".join(f"{k}={figures[k]:.4g}" for k in keys + rest))


if __name__ == "__main__":
    main()
