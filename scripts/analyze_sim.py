"""Where do two policies differ?  Per-job JCT and queueing by job length and size, and
what the guard rails did with each cycle's plan, on a prefix of a real trace.

    python scripts/analyze_sim.py [--trace cluster06|philly] [--jobs N]
                                  [--policies greedy,mip] [--seed S] [--option NAME=VALUE ...]
                                  [--out FILE]

Runs each policy over the first ``N`` jobs of the trace (untiled, the trace's own
arrivals) on the trace's default cluster (``bench_sim``'s sizes: 128 / 256 GPUs), with the
daemon's own Controller in the loop exactly as ``slurm-elastic simulate`` does; the driver
only counts the outcome of every proposed action (``ControllerDriver.observe``).  Prints,
per policy: mean JCT and queueing per bucket of the job's trace duration and requested
size, the action outcomes (applied / blocked by which guard / ...), and at how many cycles
pending jobs whose minimum fitted were left pending.  ``--option`` sets a ``PolicyOptions``
field for this run only (e.g. ``fair_floor=false``), to compare a policy variant before
changing a default.  Last line ``key=value``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sim import TRACES, make_study

from slurm_elastic.daemon.result import CycleResult
from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.sim import study
from slurm_elastic.sim.runner import ControllerDriver, SimSettings, simulate
from slurm_elastic.sim.traces import Trace, read_trace
from slurm_elastic.sim.workload import WorkloadConfig

LENGTH_EDGES = (0.0, 600.0, 3600.0, 4 * 3600.0, 24 * 3600.0, np.inf)
SIZE_EDGES = (1, 2, 4, 8, 16, 10**9)


class CountingDriver(ControllerDriver):
    """The daemon's own driver; additionally tallies every action's outcome."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.outcomes: Counter[str] = Counter()
        self.idle_pending = 0  # (cycle, job) pairs: planned 0 although free nodes >= min

    def observe(self, result: CycleResult) -> None:
        for rec in result.actions:
            # The guard's rule, without its figures ("payback: gain 3 <= cost 5 steps").
            why = rec.detail.split("(")[0].split(":")[0].strip() if rec.outcome == "blocked" else ""
            self.outcomes[f"{rec.action.kind}:{rec.outcome}{':' + why if why else ''}"] += 1
        plan = result.plan
        if plan is None:
            return
        c = self.cluster
        free = c.spec.total_nodes - c.busy_nodes()
        for d in plan.decisions:
            job = c.active.get(d.job_id)
            if job is None or job.spec is None or job.start is not None:
                continue
            if d.target_nodes == 0 and job.spec.min_nodes <= free:
                self.idle_pending += 1


def parse_option(text: str) -> tuple[str, object]:
    name, _, raw = text.partition("=")
    value: object = {"true": True, "false": False}.get(raw.lower(), raw)
    if isinstance(value, str):
        value = float(value) if "." in value or "e" in value else int(value)
    return name, value


def buckets(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges[1:-1], dtype=float), values, side="right")


def run(
    trace: Trace,
    name: str,
    policy: str,
    nodes: int,
    traces_dir: Path,
    seed: int,
    options: PolicyOptions | None,
) -> dict:
    st = make_study(trace, name, traces_dir, nodes=nodes, cfg=WorkloadConfig(seed=seed))
    wl = st.workload()
    holder: dict[str, CountingDriver] = {}

    def factory(backend, cluster, settings):  # type: ignore[no-untyped-def]
        holder["d"] = CountingDriver(backend, cluster, settings, options)
        return holder["d"]

    t0 = time.perf_counter()
    out = simulate(wl, st.cluster, SimSettings(policy=policy), driver_factory=factory)
    wall = time.perf_counter() - t0
    jobs = [j for j in out.jobs if j.state.value == "COMPLETED"]
    dur = np.array([j.spec.duration_at_request for j in jobs])
    req = np.array([j.spec.req_nodes for j in jobs])
    jct = np.array([j.end - j.submit for j in jobs])
    queue = np.array([j.start - j.submit for j in jobs])
    resizes = np.array([j.resizes for j in jobs])
    alone = np.array([j.spec.work / j.spec.rate_at(j.spec.max_nodes) for j in jobs])
    d = holder["d"]
    return {
        "policy": policy,
        "wall_s": wall,
        "n": len(jobs),
        "avg_jct": float(jct.mean()),
        "avg_queue": float(queue.mean()),
        "avg_at_request": float(dur.mean()),
        "avg_alone_at_max": float(alone.mean()),
        "resizes": int(resizes.sum()),
        "by_len": _table(jct, queue, dur, alone, resizes, buckets(dur, LENGTH_EDGES), LENGTH_EDGES),
        "by_size": _table(jct, queue, dur, alone, resizes, buckets(req, SIZE_EDGES), SIZE_EDGES),
        "outcomes": dict(sorted(d.outcomes.items())),
        "idle_pending": d.idle_pending,
        "per_job": [
            {
                "trace_id": j.spec.trace_id,
                "submit": j.submit,
                "start": j.start,
                "end": j.end,
                "req": j.spec.req_nodes,
                "min": j.spec.min_nodes,
                "max": j.spec.max_nodes,
                "at_request_s": float(a),
                "alone_at_max_s": float(b),
                "node_s": j.node_seconds,
                "resizes": j.resizes,
                "paused_s": sum(e - s for s, e in j.pauses if e > s),
            }
            for j, a, b in zip(jobs, dur, alone, strict=True)
        ],
        "cycles": out.cycles,
    }


def _table(jct, queue, dur, alone, resizes, ix, edges):  # type: ignore[no-untyped-def]
    """Per bucket: jobs, mean JCT, queueing, run time at the requested size and alone at
    the maximum size (no policy can beat the latter), share of the overall mean JCT."""
    rows = []
    for b in range(len(edges) - 1):
        m = ix == b
        means = [float(x[m].mean()) if m.any() else 0.0 for x in (jct, queue, dur, alone)]
        share = float(jct[m].sum()) / max(len(jct), 1)
        rows.append((int(m.sum()), *means, share, int(resizes[m].sum())))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", choices=sorted(TRACES), default="cluster06")
    ap.add_argument("--jobs", type=int, default=800)
    ap.add_argument("--policies", default="greedy,mip")
    ap.add_argument(
        "--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared/traces"
    )
    ap.add_argument("--seed", type=int, default=0, help="workload seed (model/elastic draws)")
    ap.add_argument("--option", action="append", default=[], help="PolicyOptions NAME=VALUE")
    ap.add_argument("--out", type=Path, default=None, help="figures and per-job rows, JSON")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    options = PolicyOptions(**dict(parse_option(o) for o in args.option))  # type: ignore[arg-type]
    full = read_trace(args.traces / TRACES[args.trace])
    trace = Trace(full.name, full.format, full.jobs[: args.jobs])
    # The whole trace's default cluster (bench_sim's), whatever prefix is replayed.
    nodes = study.default_nodes(full, WorkloadConfig(), args.traces)
    res = {}
    for p in args.policies.split(","):
        res[p] = r = run(trace, args.trace, p, nodes, args.traces, args.seed, options)
        print(
            f"{p}: {r['n']} jobs, avg_jct {r['avg_jct']:.0f} s, avg_queue {r['avg_queue']:.0f} s,"
            f" resizes {r['resizes']}, cycles {r['cycles']}, wall {r['wall_s']:.0f} s,"
            f" idle pending (job-cycles) {r['idle_pending']}; mean run time at the requested"
            f" size {r['avg_at_request']:.0f} s, alone at the maximum size"
            f" {r['avg_alone_at_max']:.0f} s (a lower bound on any policy's avg_jct)",
            flush=True,
        )
        for title, key, edges in (
            ("trace length (s)", "by_len", LENGTH_EDGES),
            ("requested nodes", "by_size", SIZE_EDGES),
        ):
            print(
                f"  {title:<18}{'jobs':>6}{'jct':>10}{'queue':>9}{'at_req':>9}{'alone':>9}"
                f"{'share':>9}{'resizes':>9}"
            )
            for lo, hi, row in zip(edges[:-1], edges[1:], r[key], strict=True):
                label = f"[{lo:g},{hi:g})"
                print(
                    f"  {label:<18}{row[0]:>6}"
                    + "".join(f"{v:>9.0f}" for v in row[1:6])
                    + f"{row[6]:>9}"
                )
        print("  actions:", json.dumps(r["outcomes"]))
    if args.out:
        args.out.write_text(json.dumps(res) + "\n")
    print(
        " ".join(
            f"{p}_avg_jct={r['avg_jct']:.0f} {p}_avg_queue={r['avg_queue']:.0f}"
            for p, r in res.items()
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
