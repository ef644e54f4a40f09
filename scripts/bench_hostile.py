#!/usr/bin/env python3
"""Bench: the daemon's cycle time and peak memory with and without hostile elastic jobs.

On a real local cluster (issue 19, class 2): a rigid job of root's holds every node, so the
elastic jobs below stay pending and eligible (Reason=Resources/Priority: the policy plans
them).  se-alice submits honest elastic jobs (``-N1-2 --comment=elastic``) and the daemon's
cycle is measured; then se-bob adds hostile ones the way no submission check sees them --
``scontrol update`` of his own pending jobs to ``Comment=elastic:min=1,max=999999``, and
``Comment=elastic NumNodes=1-999999`` -- and the cycle is measured again.

Each measurement runs in a fresh child process (spawned, so nothing is shared with the
parent's heap): a first cycle (start-up reconcile), then ``--cycles`` timed cycles in
shadow mode (read, estimate, decide with the default MIP, diff, guards), then one more
cycle under ``tracemalloc``.  The child reports its median cycle time, its peak resident
size (``ru_maxrss``: imports included, as for the daemon) and the cycle's peak Python
allocation, and how many sizes the cycle offered the solver in all.

    python scripts/bench_hostile.py [--slurm V] [--instance K] [--cycles N]
                                    [--honest A] [--hostile H]

Needs root and the test users se-alice and se-bob (``make setup``).  Last line:
``key=value`` figures for ``clean`` and ``hostile``: cycle_s, maxrss_mb, alloc_peak_mb, sizes.
Every job it submitted is cancelled at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from cluster_env import add_cluster_arguments, use_cluster  # noqa: E402

NAME = "bench-hostile"
ALICE, BOB = "se-alice", "se-bob"


def slurm(*argv: str, user: str | None = None) -> str:
    prefix = ("runuser", "-u", user, "--") if user else ()
    proc = subprocess.run(
        [*prefix, *argv], check=True, capture_output=True, text=True, timeout=60, cwd="/tmp"
    )
    return proc.stdout


def sbatch(*args: str, user: str | None = None) -> int:
    out = slurm(
        "sbatch", "--parsable", f"--job-name={NAME}", "--chdir=/tmp", "-o", "/dev/null", *args,
        "--wrap", "sleep 600", user=user,
    )  # fmt: skip
    return int(out.strip().split(";")[0])


def wait_running(job_id: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if slurm("squeue", "-h", "-j", str(job_id), "-o", "%T").strip() == "RUNNING":
            return
        time.sleep(0.5)
    raise SystemExit(f"bench_hostile: job {job_id} did not start within {timeout_s:.0f}s")


def child(cycles: int, state_dir: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Runs in a spawned process: the cycles, and this process's own figures."""
    from cluster_env import shadow_controller

    from slurm_elastic.daemon.controller import _policy_allocate
    from slurm_elastic.logs import configure_logging
    from slurm_elastic.types import AllocationProblem, Plan

    configure_logging("warning")
    sizes: list[int] = []

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        sizes.append(sum(len(d.allowed_sizes) for d in problem.elastic))
        return _policy_allocate(problem, policy)

    ctl = shadow_controller(state_dir, allocate)
    durations = []
    for i in range(cycles + 1):
        result = ctl.run_once(time.time())
        if not result.ok:
            out.put({"error": result.error})
            return
        if i:  # the first cycle reconciles and reads sacct: not a steady cycle
            durations.append(result.duration_s)
    tracemalloc.start()
    result = ctl.run_once(time.time())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out.put(
        {
            "cycle_s": statistics.median(durations),
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "alloc_peak_mb": peak / 2**20,
            "sizes": float(sizes[-1]),
            "ok": float(result.ok),
        }
    )


def measure(label: str, cycles: int, state_dir: str) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=child, args=(cycles, state_dir, queue))
    proc.start()
    row = queue.get(timeout=600)
    proc.join(timeout=60)
    if "error" in row:
        raise SystemExit(f"bench_hostile: {label} cycle failed: {row['error']}")
    print(
        f"{label:>7}: cycle {row['cycle_s']:.3f}s median, peak RSS {row['maxrss_mb']:.0f} MB,"
        f" cycle allocations peak {row['alloc_peak_mb']:.1f} MB,"
        f" {row['sizes']:.0f} sizes offered to the solver",
        flush=True,
    )
    return row


def cancel() -> None:
    subprocess.run(["scancel", f"--name={NAME}"], check=False, timeout=60, capture_output=True)
    for user in (ALICE, BOB):
        subprocess.run(
            ["scancel", f"--name={NAME}", f"--user={user}"],
            check=False,
            timeout=60,
            capture_output=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--honest", type=int, default=4, help="se-alice's elastic jobs")
    parser.add_argument("--hostile", type=int, default=2, help="se-bob's hostile jobs")
    args = parser.parse_args()
    if args.cycles < 1 or args.honest < 1 or args.hostile < 1:
        parser.error("--cycles, --honest and --hostile must be at least 1")
    subprocess.run(
        ["bash", str(REPO / "scripts" / "cluster.sh"), "up", "--slurm", args.slurm,
         "--instance", str(args.instance)],
        check=True,
    )  # fmt: skip
    use_cluster(args.slurm, args.instance)
    # The spawned children import this checkout, as this process does.
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    nodes = len(set(slurm("sinfo", "-h", "-N", "-o", "%N").split()))  # a line per partition
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as state_dir:
        cancel()
        try:
            wait_running(sbatch(f"--nodes={nodes}"))  # root's rigid job holds every node
            for _ in range(args.honest):
                sbatch("--nodes=1-2", "--comment=elastic", user=ALICE)
            rows["clean"] = measure("clean", args.cycles, state_dir)
            for i in range(args.hostile):
                job_id = sbatch("--nodes=1", "--comment=plain", user=BOB)
                change = (
                    ("Comment=elastic:min=1,max=999999",)
                    if i % 2 == 0
                    else ("Comment=elastic", "NumNodes=1-999999")
                )
                slurm("scontrol", "update", f"JobId={job_id}", *change, user=BOB)
            rows["hostile"] = measure("hostile", args.cycles, state_dir)
        finally:
            cancel()
    figures = [
        f"{key}_{label}={rows[label][key]:.{digits}f}"
        for key, digits in (("cycle_s", 3), ("maxrss_mb", 0), ("alloc_peak_mb", 1), ("sizes", 0))
        for label in ("clean", "hostile")
    ]
    print(
        " ".join(
            [*figures, f"nodes={nodes}", f"honest={args.honest}", f"hostile={args.hostile}",
             f"cycles={args.cycles}", f"slurm={args.slurm}"]
        )
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
