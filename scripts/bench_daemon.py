#!/usr/bin/env python3
"""Bench: one control-loop cycle on the real local cluster at 20 and 200 jobs (or --jobs).

Submits a mixed queue (half elastic ``-N1-4 --comment=elastic``, half plain ``-N1``; all
held, so the queue stays the same while it is measured), runs ``Controller.run_once``
in shadow mode (everything but applying: read, estimate, decide with the default MIP,
diff, guards) several times, and prints per size the median cycle time and how many
Slurm read calls a cycle made.  The first cycle (start-up reconcile and the first sacct
read) is reported separately.

    python scripts/bench_daemon.py [--slurm V] [--instance K] [--cycles N] [--jobs 20,200]
                                   [--backend cli|pyslurm]

``--backend pyslurm``: the backend ``slurm.backend: auto`` picks where a pyslurm build for
the running Slurm exists (22.05 on the host; 24.11 only inside its root, ``cluster.sh
exec``).  The default, ``cli``, is the figure earlier notes quote.

Last line: ``key=value`` figures per queue size N: calls_per_cycle_N, cycle_s_N, solve_s_N
and first_cycle_s_N.  The jobs it submitted are cancelled at the end.  5,000 jobs take a
few minutes to submit (sbatch one by one, four at a time).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_elastic.logs import configure_logging  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from cluster_env import add_cluster_arguments, shadow_controller, use_cluster  # noqa: E402

NAME = "bench-daemon"


def cluster_env(version: str, instance: int) -> None:
    script = REPO / "scripts" / "cluster.sh"
    subprocess.run(
        ["bash", str(script), "up", "--slurm", version, "--instance", str(instance)], check=True
    )
    use_cluster(version, instance)


def submit(count: int, work_dir: str, first: int = 0) -> None:
    def one(i: int) -> None:
        shape = ("-N1-4", "--comment=elastic") if i % 2 == 0 else ("-N1",)
        subprocess.run(
            ["sbatch", "--hold", f"--job-name={NAME}", f"--chdir={work_dir}", "-o", "/dev/null",
             *shape, "--wrap", "sleep 600"],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, range(first, first + count)))


def measure(jobs: int, cycles: int, work_dir: str, backend: str) -> dict[str, float]:
    ctl = shadow_controller(work_dir, backend=backend)
    first = ctl.run_once(time.time())
    if not first.ok:
        raise SystemExit(f"bench_daemon: first cycle failed: {first.error}")
    seen = sum(1 for row in first.jobs if row.name == NAME)
    if seen != jobs:
        raise SystemExit(f"bench_daemon: expected {jobs} bench jobs in the queue, saw {seen}")
    durations: list[float] = []
    calls: set[int] = set()
    solve: list[float] = []
    for _ in range(cycles):
        result = ctl.run_once(time.time())
        if not result.ok or result.plan is None:
            raise SystemExit(f"bench_daemon: cycle failed: {result.error}")
        durations.append(result.duration_s)
        calls.add(result.slurm_calls + result.history_calls)
        solve.append(result.plan.solve_s)
    if len(calls) != 1:
        raise SystemExit(f"bench_daemon: Slurm calls per cycle varied: {sorted(calls)}")
    row = {
        "jobs": float(jobs),
        "first_cycle_s": first.duration_s,
        "first_calls": float(first.slurm_calls + first.history_calls),
        "cycle_s": statistics.median(durations),
        "cycle_max_s": max(durations),
        "solve_s": statistics.median(solve),
        "calls": float(calls.pop()),
    }
    print(
        f"{jobs:>4} jobs: cycle {row['cycle_s']:.3f}s median (max {row['cycle_max_s']:.3f}s,"
        f" solve {row['solve_s']:.3f}s), {row['calls']:.0f} Slurm calls per cycle;"
        f" first cycle {row['first_cycle_s']:.3f}s with {row['first_calls']:.0f} calls"
        " (incl. sacct)",
        flush=True,
    )
    return row


def cancel_bench_jobs() -> None:
    subprocess.run(["scancel", f"--name={NAME}"], check=False, timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument(
        "--jobs",
        default="20,200",
        help="comma-separated queue sizes, measured in increasing order (default 20,200)",
    )
    parser.add_argument("--backend", choices=("cli", "pyslurm"), default="cli")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.jobs.split(",") if n.strip()})
    if not sizes or sizes[0] < 2:
        parser.error("--jobs needs queue sizes of at least 2")
    configure_logging("warning")  # the figures, not one log line per cycle
    cluster_env(args.slurm, args.instance)
    rows: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as work_dir:
        cancel_bench_jobs()
        try:
            submitted = 0
            for jobs in sizes:
                submit(jobs - submitted, work_dir, first=submitted)
                submitted = jobs
                rows[jobs] = measure(jobs, args.cycles, work_dir, args.backend)
        finally:
            cancel_bench_jobs()
    figures = [f"calls_per_cycle_{n}={rows[n]['calls']:.0f}" for n in sizes]
    for key in ("cycle_s", "solve_s", "first_cycle_s"):
        figures += [f"{key}_{n}={rows[n][key]:.3f}" for n in sizes]
    tail = [f"cycles={args.cycles}", f"slurm={args.slurm}", f"backend={args.backend}"]
    print(" ".join([*figures, *tail]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
