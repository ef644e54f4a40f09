#!/usr/bin/env python3
"""Benchmark of the mip policy against greedy and static on every job trace in shared/traces.

    python scripts/bench_traces.py [--traces DIR] [--only NAME ...] [--limit N]
                                   [--budget declared|converge|mix] [--out DIR]

Runs static, greedy and mip on each job trace of ``TRACES`` (the Philly week, the ITP
clusters raw and augmented, the ElasticFlow 195-job trace, and Pollux's 16 workloads) with
the settings of ``bench_sim.py``'s policy tables, which are the simulator's defaults: every
job elastic, min = req/2, max = 2 × req, seed 0, 1 GPU per node, the cluster size of
``study.default_nodes`` (70 %-FIFO-utilisation rule) per trace, and ``--budget`` (default
the simulator's, mix).  A trace the simulator cannot read (``read_trace`` or the workload
mapping raises ``ConfigError``) is skipped with its reason printed, never silently.

Prints one line per trace: jobs simulated, GPUs, average JCT under static, greedy and
mip, mip/greedy and mip/static average JCT, mip/greedy average queueing, and the trace's
wall seconds (cluster sizing plus the three runs).  The last line is ``key=value`` pairs:
``budget``, ``traces`` (how many ran), ``mip_over_greedy_jct_max``/``_median``,
``mip_over_static_jct_max``, ``worst_trace`` (highest mip/greedy average JCT), then
``mip_over_greedy_jct_<name>`` per trace.  ``--out DIR`` gets ``rows.json``: every
row with each policy's full summary (``slurm_elastic.sim.metrics.summarize``).
``--limit N`` keeps each trace's first N jobs (quick runs, the test).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import structlog

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench_sim import TRACES as BENCH_SIM_TRACES  # noqa: E402
from bench_sim import make_study  # noqa: E402

from slurm_elastic.errors import ConfigError  # noqa: E402
from slurm_elastic.sim import study  # noqa: E402
from slurm_elastic.sim.metrics import summarize  # noqa: E402
from slurm_elastic.sim.traces import read_trace  # noqa: E402
from slurm_elastic.sim.workload import BUDGETS, WorkloadConfig  # noqa: E402

POLICIES = ("static", "greedy", "mip")
# name -> path under the traces directory; every job trace of shared/traces/README.md.
TRACES: dict[str, str] = {
    "philly": BENCH_SIM_TRACES["philly"],
    "itp_raw_cluster06": BENCH_SIM_TRACES["cluster06"],
    "itp_raw_cluster10": "itp_elasticflow/raw/cluster10.csv",
    "itp_aug_cluster06": "itp_elasticflow/augmented/cluster06.csv",
    "itp_aug_cluster10": "itp_elasticflow/augmented/cluster10.csv",
    "itp_aug_195job": "itp_elasticflow/augmented/195job.csv",
    **{f"pollux_w{k}": f"pollux/workloads/workload-{k}.csv" for k in range(1, 9)},
    **{
        f"pollux_realistic_w{k}": f"pollux/workloads-realistic/workload-{k}.csv"
        for k in range(1, 9)
    },
}
COLUMNS = (
    ("trace", 24),
    ("jobs", 6),
    ("GPUs", 6),
    ("static_jct_s", 13),
    ("greedy_jct_s", 13),
    ("mip_jct_s", 13),
    ("mip/greedy", 11),
    ("mip/static", 11),
    ("mip/greedy_q", 13),
    ("wall_s", 8),
)


def key_name(name: str) -> str:
    """``name`` as a key suffix: lower case, anything outside [a-z0-9_] turned into ``_``."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def strict(value: Any) -> Any:
    """``value`` with every NaN as None (``rows.json`` stays strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    return value


def run_trace(
    name: str, rel: str, traces_dir: Path, cfg: WorkloadConfig, limit: int | None = None
) -> dict[str, Any]:
    """One trace under static, greedy and mip; raises ConfigError if it cannot be read."""
    t0 = time.perf_counter()
    trace = read_trace(traces_dir / rel, limit=limit)
    st = make_study(trace, rel, traces_dir, cfg=cfg)
    workload = st.workload()
    summaries: dict[str, dict[str, float | int]] = {}
    walls: dict[str, float] = {}
    for policy in POLICIES:
        outcome = study.run_policy(st, policy, workload)
        summaries[policy] = summarize(outcome)
        walls[policy] = round(outcome.wall_s, 2)
    static, greedy, mip = (summaries[p] for p in POLICIES)
    return {
        "name": name,
        "path": rel,
        "format": trace.format,
        "jobs": len(workload.jobs),
        "rejected": len(workload.rejected),
        "gpus": st.nodes * st.gpus_per_node,
        "policies": summaries,
        "policy_wall_s": walls,
        "mip_over_greedy_jct": ratio(mip["avg_jct_s"], greedy["avg_jct_s"]),
        "mip_over_static_jct": ratio(mip["avg_jct_s"], static["avg_jct_s"]),
        "mip_over_greedy_queue": ratio(mip["avg_queue_s"], greedy["avg_queue_s"]),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def row_line(row: dict[str, Any]) -> str:
    p = row["policies"]
    cells = [
        row["name"],
        f"{row['jobs']}",
        f"{row['gpus']}",
        *(f"{p[policy]['avg_jct_s']:,.1f}" for policy in POLICIES),
        f"{row['mip_over_greedy_jct']:.3f}",
        f"{row['mip_over_static_jct']:.3f}",
        f"{row['mip_over_greedy_queue']:.3f}",
        f"{row['wall_s']:.1f}",
    ]
    return f"{cells[0]:<{COLUMNS[0][1]}}" + "".join(
        f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], COLUMNS[1:], strict=True)
    )


def last_line(budget: str, rows: list[dict[str, Any]], limit: int | None) -> str:
    figures: dict[str, str] = {"budget": budget}
    if limit is not None:
        figures["limit"] = str(limit)
    figures["traces"] = str(len(rows))
    over_greedy = {
        r["name"]: r["mip_over_greedy_jct"] for r in rows if math.isfinite(r["mip_over_greedy_jct"])
    }
    over_static = [
        r["mip_over_static_jct"] for r in rows if math.isfinite(r["mip_over_static_jct"])
    ]
    if over_greedy:
        worst = max(over_greedy, key=lambda n: over_greedy[n])
        figures["mip_over_greedy_jct_max"] = f"{over_greedy[worst]:.3f}"
        figures["mip_over_greedy_jct_median"] = f"{statistics.median(over_greedy.values()):.3f}"
    if over_static:
        figures["mip_over_static_jct_max"] = f"{max(over_static):.3f}"
    if over_greedy:
        figures["worst_trace"] = worst
    for r in rows:
        figures[f"mip_over_greedy_jct_{key_name(r['name'])}"] = f"{r['mip_over_greedy_jct']:.3f}"
    return " ".join(f"{k}={v}" for k, v in figures.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    ap.add_argument("--out", type=Path, default=Path("sim-out/bench-traces"))
    ap.add_argument("--only", choices=list(TRACES), action="append", metavar="NAME")
    ap.add_argument("--limit", type=int, help="only the first N jobs of each trace")
    ap.add_argument("--budget", choices=BUDGETS, default=WorkloadConfig().budget)
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    cfg = WorkloadConfig(budget=args.budget)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    print(f"budget {args.budget}" + (f", first {args.limit} jobs" if args.limit else ""))
    print(f"{COLUMNS[0][0]:<{COLUMNS[0][1]}}" + "".join(f"{c:>{w}}" for c, w in COLUMNS[1:]))
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    t0 = time.perf_counter()
    for name, rel in TRACES.items():
        if args.only and name not in args.only:
            continue
        try:
            row = run_trace(name, rel, args.traces, cfg, args.limit)
        except ConfigError as exc:
            skipped[name] = str(exc)
            print(f"skip {name} ({rel}): {exc}", flush=True)
            continue
        rows.append(row)
        print(row_line(row), flush=True)
        if row["rejected"]:
            print(f"  {name}: {row['rejected']} jobs larger than the cluster rejected", flush=True)
    print(
        f"total {time.perf_counter() - t0:.1f} s wall, {len(rows)} traces, {len(skipped)} skipped"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"budget": args.budget, "limit": args.limit, "rows": rows, "skipped": skipped}
    (args.out / "rows.json").write_text(json.dumps(strict(doc), indent=2) + "\n")
    print(last_line(args.budget, rows, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
