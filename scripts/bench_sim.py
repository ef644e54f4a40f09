"""Benchmark of the trace-driven simulator: the four policies on two real traces, the
harm to each job against static on mixed workloads, and the wall time of simulating
10,000 jobs with the mip policy.

    python scripts/bench_sim.py [--traces DIR] [--out DIR] [--only cluster06|philly|harm|10k]
                                [--budget declared|converge|mix]

Prints, per trace, the side-by-side table (the same figures as ``slurm-elastic simulate``
with default settings) and each policy's wall time and per-cycle controller cost; then
the acceptance ratios; then ``harm``: each trace with a quarter, a half and all of its jobs
elastic (``WorkloadConfig.elastic_fraction`` 0.25, 0.5 and 1.0), under mip and under static,
and per class (rigid, elastic) the figures of ``slurm_elastic.sim.harm``
(``_ef25``/``_ef50``/``_ef100``, each the worse of the two traces; ``_ef100`` has no rigid
jobs), with a yardstick beside the rigid jobs' figures: ``static_shorter_*``, static against
itself when every elastic job finishes 0.1 % sooner (``harm.elastic_work_scaled``, no
daemon), what the queue alone does to each rigid job when nothing but that changes; the
last line is ``key=value`` pairs.  The 10,000-job run tiles
``itp_elasticflow/raw/cluster06.csv`` in time (copy k shifted by k × the trace's span, so
the offered load is the trace's own) on the cluster06 default cluster.  ``--budget`` is
every run's ``WorkloadConfig.budget`` (default the simulator's, mix: half the jobs declare
their step budget, half train until converged), printed first and in the last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import structlog

from slurm_elastic.policy.registry import POLICIES
from slurm_elastic.sim import study
from slurm_elastic.sim.harm import Harm, elastic_work_scaled, harm
from slurm_elastic.sim.runner import SimSettings
from slurm_elastic.sim.traces import Trace, read_trace
from slurm_elastic.sim.workload import BUDGETS, WorkloadConfig

TRACES = {
    "cluster06": "itp_elasticflow/raw/cluster06.csv",
    "philly": "philly/philly_jobs_2017-11-01_to_2017-11-07.csv",
}
TILED_JOBS = 10_000


def tiled(trace: Trace, count: int) -> Trace:
    span = trace.jobs[-1].submit_s - trace.jobs[0].submit_s + 1.0
    jobs = []
    k = 0
    while len(jobs) < count:
        for j in trace.jobs:
            if len(jobs) == count:
                break
            jobs.append(replace(j, job_id=f"{j.job_id}#{k}", submit_s=j.submit_s + k * span))
        k += 1
    return Trace(name=f"{trace.name}x{k}", format=trace.format, jobs=tuple(jobs))


def make_study(
    trace: Trace,
    path: str,
    traces_dir: Path,
    nodes: int | None = None,
    cfg: WorkloadConfig | None = None,
) -> study.Study:
    """Default settings on ``trace``; ``nodes`` None: the trace's default cluster size."""
    cfg = cfg or WorkloadConfig()
    return study.Study(
        trace=trace,
        trace_path=path,
        traces_dir=traces_dir,
        workload_cfg=cfg,
        settings=SimSettings(),
        nodes=nodes or study.default_nodes(trace, cfg, traces_dir),
        gpus_per_node=cfg.gpus_per_node,
    )


def compare(name: str, st: study.Study, out: Path) -> dict[str, dict[str, float]]:
    workload = st.workload()
    outcomes = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        outcomes[policy] = study.run_policy(st, policy, workload)
        print(f"  {name} {policy}: {time.perf_counter() - t0:.1f} s wall", flush=True)
    doc = study.results_document(st, workload, outcomes)
    stats = study.run_stats(outcomes)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / name / "runs.json").write_text(json.dumps(stats, indent=2) + "\n")
    from slurm_elastic.sim.plots import write_plots

    write_plots(outcomes, out / name, title=name)
    print(f"\n{name}: {len(workload.jobs)} jobs, {st.nodes} GPUs (1 GPU per node)")
    header = f"{'metric':<14}" + "".join(f"{p:>14}" for p in POLICIES)
    print(header)
    for row in study.table_rows(doc, POLICIES):
        print(f"{row[0]:<14}" + "".join(f"{v:>14}" for v in row[1:]))
    print(f"{'wall_s':<14}" + "".join(f"{stats[p]['wall_s']:>14.1f}" for p in POLICIES))
    print(f"{'cycles':<14}" + "".join(f"{stats[p]['cycles']:>14}" for p in POLICIES))
    print(f"{'ms_per_cycle':<14}" + "".join(f"{stats[p]['cycle_ms']:>14.2f}" for p in POLICIES))
    print(
        f"{'fallbacks':<14}"
        + "".join(f"{stats[p].get('fallback_cycles', 0):>14}" for p in POLICIES)
    )
    return doc["policies"]


HARM_FRACTIONS = {"ef25": 0.25, "ef50": 0.5, "ef100": 1.0}
# The yardstick's elastic jobs finish this much sooner (module docstring).
SHORTER = 0.999
# (class, figure) -> key stem; the keys are f"{stem}_{fraction}" (issue 22's acceptance).
HARM_KEYS = {
    ("rigid", "late_10min_share"): "rigid_late_10min_share",
    ("rigid", "late_1h_share"): "rigid_late_1h_share",
    ("rigid", "worst_extra_wait_h"): "rigid_worst_extra_wait_h",
    ("rigid", "avg_queue_over_static"): "rigid_avg_queue_over_static",
    ("elastic", "avg_jct_over_static"): "elastic_avg_jct_over_static",
}
# The yardstick's keys (rigid jobs only): f"static_shorter_{stem}_{fraction}".
YARDSTICK_KEYS = {
    "late_10min_share": "rigid_late_10min_share",
    "late_1h_share": "rigid_late_1h_share",
    "worst_extra_wait_h": "rigid_worst_extra_wait_h",
}


def harm_figures(
    traces_dir: Path, names: list[str], out: Path, base: WorkloadConfig
) -> dict[str, str]:
    """Mixed workloads, mip against static, per class; each key the worse of the traces."""
    worst: dict[str, float] = {}
    rows: dict[str, dict[str, dict[str, float | int]]] = {}
    for name in names:
        trace = read_trace(traces_dir / TRACES[name])
        for suffix, fraction in HARM_FRACTIONS.items():
            cfg = replace(base, elastic_fraction=fraction)
            st = make_study(trace, TRACES[name], traces_dir, cfg=cfg)
            workload = st.workload()
            t0 = time.perf_counter()
            mip, static = (study.run_policy(st, p, workload) for p in ("mip", "static"))
            found: dict[str, Harm | None] = {
                cls: harm(mip, static, elastic=cls == "elastic") for cls in ("rigid", "elastic")
            }
            if fraction < 1.0:
                shorter = study.run_policy(st, "static", elastic_work_scaled(workload, SHORTER))
                found["static shorter rigid"] = harm(shorter, static, elastic=False)
            print(f"  harm {name} {suffix}: {time.perf_counter() - t0:.1f} s wall", flush=True)
            for cls, figures in found.items():
                rows[f"{name} {suffix} {cls}"] = figures.to_json() if figures else {}
            keys = [(cls, field, f"{stem}_{suffix}") for (cls, field), stem in HARM_KEYS.items()]
            keys += [
                ("static shorter rigid", field, f"static_shorter_{stem}_{suffix}")
                for field, stem in YARDSTICK_KEYS.items()
            ]
            for cls, field, key in keys:
                figures = found.get(cls)
                if figures is not None:
                    worst[key] = max(worst.get(key, -math.inf), getattr(figures, field))
    (out / "harm.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "harm.json").write_text(json.dumps(rows, indent=2) + "\n")
    columns = list(Harm.__dataclass_fields__)
    print(f"\nharm against static (mip): {', '.join(columns)}")
    for label, figures in rows.items():
        print(f"{label:<34}" + "".join(f"{figures.get(c, '-')!s:>12}" for c in columns))
    print()
    return {key: f"{value:.4g}" for key, value in sorted(worst.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared/traces"
    )
    ap.add_argument("--out", type=Path, default=Path("sim-out/bench"))
    ap.add_argument("--only", choices=["cluster06", "philly", "harm", "10k"], action="append")
    ap.add_argument("--budget", choices=BUDGETS, default=WorkloadConfig().budget)
    args = ap.parse_args()
    cfg = WorkloadConfig(budget=args.budget)
    print(f"budget {args.budget}", flush=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    only = set(args.only or ["cluster06", "philly", "harm", "10k"])
    figures: dict[str, str] = {"budget": args.budget}
    for name, rel in TRACES.items():
        if name not in only:
            continue
        trace = read_trace(args.traces / rel)
        res = compare(name, make_study(trace, rel, args.traces, cfg=cfg), args.out)
        mip, static, greedy = res["mip"], res["static"], res["greedy"]
        r1 = mip["avg_jct_s"] / static["avg_jct_s"]
        r2 = mip["avg_jct_s"] / greedy["avg_jct_s"]
        r3 = mip["avg_queue_s"] / greedy["avg_queue_s"] if greedy["avg_queue_s"] else float("nan")
        print(
            f"{name}: mip/static avg_jct {r1:.3f} (goal <= 0.5), mip/greedy avg_jct {r2:.3f} "
            f"(goal <= 0.75), mip/greedy avg_queue {r3:.3f} (goal <= 0.68)\n",
            flush=True,
        )
        figures |= {
            f"{name}_mip_over_static_jct": f"{r1:.3f}",
            f"{name}_mip_over_greedy_jct": f"{r2:.3f}",
            f"{name}_mip_over_greedy_queue": f"{r3:.3f}",
        }
    if "harm" in only:
        figures |= harm_figures(args.traces, list(TRACES), args.out, cfg)
    if "10k" in only:
        base = read_trace(args.traces / TRACES["cluster06"])
        st = make_study(tiled(base, TILED_JOBS), "cluster06 tiled", args.traces, cfg=cfg)
        workload = st.workload()
        t0, c0 = time.perf_counter(), time.process_time()
        outcome = study.run_policy(st, "mip", workload)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        stats = study.run_stats({"mip": outcome})["mip"]
        # CPU time too: on a shared machine the wall time also counts other processes.
        print(
            f"10k: {len(workload.jobs)} jobs, mip, {st.nodes} GPUs: {wall:.1f} s wall "
            f"(goal <= 150 s), {cpu:.1f} s CPU, {stats['cycles']} cycles, "
            f"{stats['cycle_ms']:.2f} ms/cycle"
        )
        figures |= {
            "jobs_10k": str(len(workload.jobs)),
            "wall_10k_mip_s": f"{wall:.1f}",
            "cpu_10k_mip_s": f"{cpu:.1f}",
        }
        figures |= {
            "cycles_10k": str(stats["cycles"]),
            "ms_per_cycle_10k": f"{stats['cycle_ms']:.2f}",
        }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
