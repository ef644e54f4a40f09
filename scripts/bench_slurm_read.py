#!/usr/bin/env python3
"""Benchmark: one full cluster read (jobs + nodes + partitions) at 20 and 200 jobs.

Submits held single-node jobs to the local cluster (``scripts/cluster.sh``) until one
``squeue --json`` read returns at least 20, then 200 jobs, times ``CliBackend.read_cluster``
(median and p90 of several reads) and counts the Slurm client calls per read, which must
not grow with the job count.  Also times the alternatives the backend chose against: the
``squeue -O`` text fast path, and ``sacct -P`` vs ``sacct --json`` for ``read_history``.
Every job it submitted is cancelled at the end, also on failure.

    python scripts/bench_slurm_read.py [--instance 2] [--fresh] [--reads 15]

``squeue --json`` also returns jobs that ended within MinJobAge (300 s here), so a busy
cluster may already show more than 20 jobs; ``--fresh`` restarts the instance with empty
state first (``cluster.sh up --fresh``: never on a cluster someone else is using).  The
job counts actually read are printed (``jobs_20=``, ``jobs_200=``).

The last line is ``key=value`` pairs (``calls_per_read_20=`` ... ``read_ms_200=`` ...).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_elastic.slurm.cli import CliBackend  # noqa: E402


def cluster_sh(*args: str) -> str:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "cluster.sh"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    ).stdout


def slurm_conf_for(instance: int, *, fresh: bool) -> str:
    if fresh:
        cluster_sh("up", "--instance", str(instance), "--fresh")
    out = cluster_sh("env", "--instance", str(instance))
    return out.strip().partition("SLURM_CONF=")[2]


def submit_held(backend: CliBackend, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        result = backend.runner.act(
            ("sbatch", "--parsable", "--hold", "-p", "shared", "-N1", "-J", "bench-read",
             "-o", "/dev/null", "--wrap", "sleep 60"),
        )  # fmt: skip
        ids.append(int(result.stdout.strip().split(";")[0]))
    return ids


def time_reads(backend: CliBackend, reads: int) -> tuple[list[float], int, int]:
    """Wall times (ms) of ``reads`` full reads; calls per read (all equal); jobs seen."""
    times, calls, jobs = [], set(), 0
    backend.read_cluster()  # warm the page cache / slurmctld RPC path
    for _ in range(reads):
        started = time.perf_counter()
        snapshot = backend.read_cluster()
        times.append((time.perf_counter() - started) * 1000)
        calls.add(snapshot.slurm_calls)
        jobs = len(snapshot.jobs)
    if len(calls) != 1:
        raise SystemExit(f"calls per read varied between reads: {sorted(calls)}")
    return times, calls.pop(), jobs


def time_call(function: object, reads: int) -> float:
    samples = []
    for _ in range(reads):
        started = time.perf_counter()
        function()  # type: ignore[operator]
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1] if len(samples) >= 2 else samples[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", type=int, default=0, help="cluster.sh instance (0..7)")
    parser.add_argument("--reads", type=int, default=15, help="timed reads per job count")
    parser.add_argument("--fresh", action="store_true", help="restart the instance empty first")
    args = parser.parse_args()

    conf = slurm_conf_for(args.instance, fresh=args.fresh)
    backend = CliBackend(slurm_conf=conf, timeout_s=60)
    text_backend = CliBackend(slurm_conf=conf, job_format="text")
    json_history = CliBackend(slurm_conf=conf, history_format="json")
    submitted: list[int] = []
    figures: dict[str, str] = {}
    try:
        for target in (20, 200):
            present = len(backend.read_jobs())
            submitted += submit_held(backend, max(0, target - present))
            times, calls, jobs = time_reads(backend, args.reads)
            figures[f"jobs_{target}"] = str(jobs)
            figures[f"calls_per_read_{target}"] = str(calls)
            figures[f"read_ms_{target}"] = f"{statistics.median(times):.1f}"
            figures[f"read_p90_ms_{target}"] = f"{p90(times):.1f}"
            print(
                f"{jobs} jobs: full read median {statistics.median(times):.1f} ms, "
                f"p90 {p90(times):.1f} ms, {calls} Slurm calls per read ({args.reads} reads)"
            )
        squeue_json = time_call(backend.read_jobs, args.reads)
        squeue_text = time_call(text_backend.read_jobs, args.reads)
        since = time.time() - 3600
        history_text = time_call(lambda: backend.read_history(since), 5)
        history_json = time_call(lambda: json_history.read_history(since), 5)
        figures["squeue_json_ms_200"] = f"{squeue_json:.1f}"
        figures["squeue_text_ms_200"] = f"{squeue_text:.1f}"
        figures["history_text_ms"] = f"{history_text:.1f}"
        figures["history_json_ms"] = f"{history_json:.1f}"
        print(
            f"at 200 jobs: squeue --json {squeue_json:.1f} ms vs squeue -O text "
            f"{squeue_text:.1f} ms; read_history (last hour): sacct -P {history_text:.1f} ms "
            f"vs sacct --json {history_json:.1f} ms"
        )
    finally:
        for start in range(0, len(submitted), 100):
            backend.runner.act(("scancel", *map(str, submitted[start : start + 100])))
    if figures["calls_per_read_20"] != figures["calls_per_read_200"]:
        print("FAIL: calls per read grew with the job count", file=sys.stderr)
        return 1
    print("note: machine shared with other engineers' test runs; timings are under contention")
    print(" ".join(f"{key}={value}" for key, value in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
