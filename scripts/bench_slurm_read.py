#!/usr/bin/env python3
"""Benchmark: one full cluster read (jobs + nodes + partitions) at several queue sizes.

Submits held single-node jobs to the local cluster (``scripts/cluster.sh``) until one read
returns at least each ``--jobs`` count (default 20 and 200), times ``read_cluster`` of the
chosen backend (median and p90 of several reads) and counts its Slurm calls per read, which
must not grow with the job count: client processes for the CLI backend, RPC batches for the
pyslurm backend (its module doc lists them).  With the CLI backend it also times the
alternatives that backend chose against: the ``squeue -O`` text fast path, and ``sacct -P``
vs ``sacct --json`` for ``read_history``.  Every job it submitted is cancelled at the end,
also on failure.

    python scripts/bench_slurm_read.py [--slurm V] [--instance 2] [--backend cli|pyslurm]
                                       [--jobs 200,5000] [--reads 15] [--fresh]

``--backend pyslurm`` loads the pyslurm build for the running Slurm the way the daemon does
(``/var/lib/slurm-elastic/pyslurm/<major.minor>``, ``scripts/build-pyslurm.sh``).  The
24.11 build lives in that version's root, so run it there::

    bash scripts/cluster.sh up --slurm 24.11 --instance 2 --fresh
    bash scripts/cluster.sh exec --slurm 24.11 --instance 2 -- \
        python3 scripts/bench_slurm_read.py --slurm 24.11 --instance 2 --backend pyslurm

Before timing, it waits (up to 300 s, ``settle_s_N=`` in the details) until slurmctld,
slurmdbd and MariaDB have digested the submissions (together under 5% of a core over 2 s):
what is timed is the read, not the backlog of thousands of sbatch calls.

``squeue --json`` also returns jobs that ended within MinJobAge (300 s here), so a busy
cluster may already show more jobs than asked for; ``--fresh`` restarts the instance with
empty state first (``cluster.sh up --fresh``: never on a cluster someone else is using).
The job counts actually read are printed (``jobs_200=``, ...).  Cancelled jobs stay in the
queue listing for MinJobAge after the run.

The last line is ``calls_per_read_N=`` for each count, then ``read_ms_N=`` (medians); the
line before it has the details (``jobs_N=``, ``read_p90_ms_N=``, the CLI alternatives).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_elastic.slurm.cli import CliBackend  # noqa: E402
from slurm_elastic.slurm.select import make_backend  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from cluster_env import VERSIONS, use_cluster  # noqa: E402


def cluster_sh(*args: str) -> str:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "cluster.sh"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    ).stdout


def slurm_conf_for(version: str, instance: int, *, fresh: bool) -> str:
    """Bring the cluster up (empty with --fresh) and apply its exports to this process
    (SLURM_CONF, and PATH with that version's clients first).

    Inside a version's root (``cluster.sh exec``, where the 24.11 pyslurm build lives) the
    cluster is the one ``exec`` named: it is up already and its exports are set."""
    inside = os.environ.get("SLURM_ELASTIC_IN_ROOT")
    if inside:
        if inside != version or fresh:
            sys.exit(
                f"bench_slurm_read: inside the {inside} root: --slurm must be {inside} and "
                "--fresh is for the host (cluster.sh up --fresh, then exec)"
            )
        return os.environ["SLURM_CONF"]
    cluster_sh("up", "--slurm", version, "--instance", str(instance), *(["--fresh"] * fresh))
    return use_cluster(version, instance)["SLURM_CONF"]


def submit_held(backend: CliBackend, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        result = backend.runner.act(
            ("sbatch", "--parsable", "--hold", "-p", "shared", "-N1", "-J", "bench-read",
             "-o", "/dev/null", "--wrap", "sleep 60"),
        )  # fmt: skip
        ids.append(int(result.stdout.strip().split(";")[0]))
    return ids


def daemon_pids(conf: str) -> list[int]:
    """This instance's slurmctld (started with ``-f <conf>``), every slurmdbd and mariadbd."""
    pids = []
    for pattern in (f"slurmctld -f {conf}", "slurmdbd", "mariadbd"):
        out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
        pids += [int(pid) for pid in out.split()]
    return pids


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # exited: it is idle now
        fields = stat.rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def settle(
    conf: str, *, idle_share: float = 0.05, window_s: float = 2.0, limit_s: float = 300
) -> float:
    """Wait until Slurm's daemons have digested the submissions: slurmctld, slurmdbd and
    MariaDB together use under ``idle_share`` of a core over ``window_s`` (thousands of
    submissions keep slurmdbd and MariaDB busy for a while after sbatch returns, and the
    reads would be timed against that backlog on a 2-core machine).  Returns the wait."""
    started = time.monotonic()
    pids = daemon_pids(conf)
    while time.monotonic() - started < limit_s:
        before = cpu_seconds(pids)
        time.sleep(window_s)
        if cpu_seconds(pids) - before < idle_share * window_s:
            break
    return time.monotonic() - started


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


def job_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of job counts: {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"job counts must be positive: {text!r}")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", type=int, default=0, help="cluster.sh instance (0..7)")
    parser.add_argument("--slurm", choices=VERSIONS, default="22.05", help="cluster version")
    parser.add_argument("--backend", choices=("cli", "pyslurm"), default="cli")
    parser.add_argument("--jobs", type=job_counts, default=[20, 200], help="e.g. 200,5000")
    parser.add_argument("--reads", type=int, default=15, help="timed reads per job count")
    parser.add_argument("--fresh", action="store_true", help="restart the instance empty first")
    args = parser.parse_args()
    # One debug line per Slurm command would bury the figures (thousands of sbatch calls).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

    conf = slurm_conf_for(args.slurm, args.instance, fresh=args.fresh)
    backend: CliBackend = CliBackend(slurm_conf=conf, timeout_s=60)
    if args.backend == "pyslurm":
        chosen = make_backend("pyslurm", slurm_conf=conf, timeout_s=60)
        assert isinstance(chosen, CliBackend)  # PyslurmBackend is one
        backend = chosen
    submitted: list[int] = []
    figures: dict[str, str] = {}
    try:
        for target in args.jobs:
            present = len(backend.read_jobs())
            submitted += submit_held(backend, max(0, target - present))
            waited = settle(conf)
            figures[f"settle_s_{target}"] = f"{waited:.0f}"
            times, calls, jobs = time_reads(backend, args.reads)
            figures[f"jobs_{target}"] = str(jobs)
            figures[f"calls_per_read_{target}"] = str(calls)
            figures[f"read_ms_{target}"] = f"{statistics.median(times):.1f}"
            figures[f"read_p90_ms_{target}"] = f"{p90(times):.1f}"
            print(
                f"{args.backend}, {jobs} jobs: full read median {statistics.median(times):.1f} "
                f"ms, p90 {p90(times):.1f} ms, {calls} Slurm calls per read ({args.reads} reads)"
            )
        if args.backend == "cli":
            figures.update(cli_alternatives(conf, backend, args.jobs[-1], args.reads))
    finally:
        for start in range(0, len(submitted), 100):
            backend.runner.act(("scancel", *map(str, submitted[start : start + 100])))
    calls = {figures[f"calls_per_read_{n}"] for n in args.jobs}
    if len(calls) != 1:
        print("FAIL: calls per read grew with the job count", file=sys.stderr)
        return 1
    print("note: machine shared with other engineers' test runs; timings are under contention")
    last = [f"calls_per_read_{n}" for n in args.jobs] + [f"read_ms_{n}" for n in args.jobs]
    print("details: " + " ".join(f"{k}={v}" for k, v in figures.items() if k not in last))
    print(" ".join(f"{key}={figures[key]}" for key in last))
    return 0


def cli_alternatives(conf: str, backend: CliBackend, jobs: int, reads: int) -> dict[str, str]:
    """What the CLI backend chose against: squeue -O text vs --json, sacct -P vs --json."""
    text_backend = CliBackend(slurm_conf=conf, job_format="text")
    json_history = CliBackend(slurm_conf=conf, history_format="json")
    squeue_json = time_call(backend.read_jobs, reads)
    squeue_text = time_call(text_backend.read_jobs, reads)
    since = time.time() - 3600
    history_text = time_call(lambda: backend.read_history(since), 5)
    history_json = time_call(lambda: json_history.read_history(since), 5)
    print(
        f"at {jobs} jobs: squeue --json {squeue_json:.1f} ms vs squeue -O text "
        f"{squeue_text:.1f} ms; read_history (last hour): sacct -P {history_text:.1f} ms "
        f"vs sacct --json {history_json:.1f} ms"
    )
    return {
        f"squeue_json_ms_{jobs}": f"{squeue_json:.1f}",
        f"squeue_text_ms_{jobs}": f"{squeue_text:.1f}",
        "history_text_ms": f"{history_text:.1f}",
        "history_json_ms": f"{history_json:.1f}",
    }


if __name__ == "__main__":
    sys.exit(main())
