#!/usr/bin/env python3
"""Per-job fingerprints of the simulator: did a change move any job?

Runs the cluster06 trace tiled to ``--jobs`` jobs (default 1,000; the tiling of
``bench_sim.py``) under each ``--policy`` (default mip and greedy) with default settings,
and writes one line per finished trace job -- its trace id, model name, submit, start,
end, resize count and every period (start, end, size) -- to ``<out>/<policy>.txt``.  A
refactor that claims to change no decision must leave those files identical; ``diff``
shows the first job that moved.  The last line is ``jobs=N <policy>=<sha256 prefix> ...``.

    python scripts/sim_fingerprint.py [--jobs 1000] [--policy mip --policy greedy]
                                      [--budget declared|converge|mix]
                                      [--out sim-out/fingerprint] [--traces DIR]

``--budget`` is the workload's (``WorkloadConfig.budget``; default the simulator's, mix).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench_sim import TRACES, make_study, tiled  # noqa: E402

from slurm_elastic.sim import study  # noqa: E402
from slurm_elastic.sim.engine import SimJob  # noqa: E402
from slurm_elastic.sim.traces import read_trace  # noqa: E402
from slurm_elastic.sim.workload import BUDGETS, WorkloadConfig  # noqa: E402


def job_line(job: SimJob) -> str:
    """Everything the simulation decided about one job, at full float precision."""
    periods = " ".join(
        f"{p.start!r}-{p.end!r}x{len(p.nodes)}" for p in job.periods
    )  # fmt: skip
    trace_id = job.spec.trace_id if job.spec is not None else "-"
    return (
        f"{trace_id} {job.name} submit={job.submit!r} start={job.start!r} end={job.end!r} "
        f"resizes={job.resizes} periods={periods}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--policy", action="append", dest="policies")
    parser.add_argument("--out", type=Path, default=Path("sim-out/fingerprint"))
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--budget", choices=BUDGETS, default=WorkloadConfig().budget)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    base = read_trace(args.traces / TRACES["cluster06"])
    cfg = WorkloadConfig(budget=args.budget)
    st = make_study(tiled(base, args.jobs), "cluster06 tiled", args.traces, cfg=cfg)
    workload = st.workload()
    args.out.mkdir(parents=True, exist_ok=True)
    figures = {"jobs": str(len(workload.jobs)), "budget": args.budget}
    for policy in args.policies or ["mip", "greedy"]:
        outcome = study.run_policy(st, policy, workload)
        lines = sorted(job_line(job) for job in outcome.jobs)
        text = "\n".join(lines) + "\n"
        (args.out / f"{policy}.txt").write_text(text)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        print(f"{policy}: {len(lines)} jobs, {outcome.cycles} cycles, sha256 {digest}", flush=True)
        figures[policy] = digest
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
