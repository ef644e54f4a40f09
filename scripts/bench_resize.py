#!/usr/bin/env python3
"""Resize latency on the real local cluster: shrink and grow vs requeue-at-new-size.

One elastic job (examples/train_mlp.py under ``slurm-elastic run``) starts on 2 nodes; it
is shrunk to 1 (graceful: instruction, checkpoint, ack, ``scontrol update NumNodes=1``)
and grown to 3 (companion job) by the daemon's control cycle running every 0.5 s with the
target size given instead of the policy's (``daemon.drill``).
A second job starts on 2 nodes and is moved to 1 node the way stock Slurm can: requeue
(``scontrol requeue``, ``NumNodes=1-1`` and ``StartTime=now``, the fastest requeue there
is) and restart from its last checkpoint.

Measured from the decision (when the target is set; the daemon's next cycle acts on it,
so a daemon with ``interval_s: 10`` adds up to 10 s more) to the first
training step at the new size, taken from the training's own per-step sample log.  Steps
lost: steps the old process group ran that the new one had to redo.

``--mode torchft`` runs the same job stop-free (``slurm-elastic run --mode torchft``) and
measures what its survivors feel: a *pause* is the largest gap between two consecutive steps
of the batch host's worker from the decision until the job trains at the new size;
``join_ready_s`` runs from the companion job's start (Slurm's StartTime, whole seconds) to
its first step (the first step one of its two replica groups took part in), and
``all_joined_s`` to the first step both took part in (the job at 3).  The same run then
measures the torchrun mode too, for comparison, unless ``--no-compare``.

``--end-to-end`` (issue 20, item 6) runs one whole job per mode instead, torchft and
torchrun, under the same schedule, set by training progress so both modes meet each change
at the same step (10 ms of work a sample): 2 nodes; at step 20 the daemon grows it to 3 (a
companion); at step 70 it shrinks it to 2 (the companion given back); at step 120 one of
its nodes is lost without warning (``scontrol update NumNodes=1`` with the daemon gone, as
a node failure leaves the job); then it trains to the end (200 steps).  Completion is
from Slurm's StartTime of the job to its last training step.

    python scripts/bench_resize.py [--instance 4] [--repeat 1] [--mode torchrun|torchft]
    python scripts/bench_resize.py --end-to-end [--repeat 3]

(``--mode torchrun``, the default, measures what it always did.)

Last line (medians over ``--repeat`` runs; steps lost: the worst single resize):
``--mode torchrun``: ``shrink_resume_s=... grow_resume_s=... requeue_resume_s=...
steps_lost=... requeue_steps_lost=...``; ``--mode torchft``: ``shrink_pause_s=...
grow_pause_s=... join_ready_s=... all_joined_s=... steps_lost=...`` then the torchrun
figures as ``torchrun_shrink_resume_s=...`` and so on.  ``--end-to-end``:
``e2e_torchft_s=... e2e_torchrun_s=... resizes=2 node_losses=1`` (medians), then each
mode's steps lost and its slowest change's stall.  ``load_avg``, the 5-minute load average
at the end, says how contended the machine was: every new worker process pays for Python
and ``import torch``, which is CPU-bound.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from cluster_env import add_cluster_arguments, use_cluster  # noqa: E402

EXAMPLE = REPO / "examples" / "train_mlp.py"
TRAIN = ["--samples", "2400", "--global-batch", "48", "--micro-batch", "16", "--epochs", "4"]
PACE = ["--sample-sleep", "0.004", "--report-every", "1", "--checkpoint-every", "20"]


def cluster_env(version: str, instance: int) -> None:
    use_cluster(version, instance)


def submit(work: Path, api: str, mode: str = "torchrun", pace: list[str] = PACE) -> int:
    from slurm_elastic.slurm.cli import CliBackend

    work.mkdir(parents=True, exist_ok=True)
    train = [str(EXAMPLE), *TRAIN, *pace, "--sample-log", str(work / "log")]
    script = (
        "#!/bin/bash\n#SBATCH --nodes=1-3\n#SBATCH --comment=elastic:min=1,max=3\n"
        f"#SBATCH --output={work}/job-%j.out\n#SBATCH --requeue\n"
        f"slurm-elastic run --mode {mode} -- python {' '.join(train)}\n"
    )
    (work / "job.sbatch").write_text(script)
    out = subprocess.run(
        ["sbatch", "--parsable", "--hold", f"--chdir={work}", str(work / "job.sbatch")],
        env={**os.environ, "SLURM_ELASTIC_API": api},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    job = int(out.strip().split(";")[0])
    CliBackend().pin_pending_size(job, 2)  # start at 2 nodes, as the daemon pins pending jobs
    subprocess.run(["scontrol", "release", str(job)], check=True, timeout=30)
    return job


def wait(predicate: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"bench_resize: timed out after {timeout:.0f}s waiting for {what}")


def steps_at(work: Path, world: int) -> int:
    from slurm_elastic.samplelog import read_records

    return max((r["step"] for r in read_records(work / "log") if r["world"] == world), default=-1)


def resumed_at(work: Path, world: int, after: float) -> float:
    from slurm_elastic.samplelog import first_time_at, read_records

    found = wait(
        lambda: first_time_at(read_records(work / "log"), world, after), 120, f"world {world}"
    )
    return float(found)  # type: ignore[arg-type]


def cancel(job: int) -> None:
    """The job and its companions (the daemon would cancel orphans; here nobody would)."""
    from slurm_elastic.marker import companion_parent

    queue = subprocess.run(
        ["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True, timeout=30
    ).stdout
    ids = [str(job)]
    for line in queue.splitlines():
        other, _, comment = line.partition("|")
        if companion_parent(comment) == job:
            ids.append(other.strip())
    subprocess.run(["scancel", *ids], check=False, timeout=30)
    wait(
        lambda: (
            not subprocess.run(
                ["squeue", "-h", "-t", "R,CG", "-o", "%i"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        ),
        60,
        "idle cluster",
    )
    # Slurm 22.05 on an exclusive partition stops placing jobs on nodes a shrunk job gave
    # back until slurmctld re-reads its configuration (found by the controller's tests).
    subprocess.run(["scontrol", "reconfigure"], check=False, timeout=60, capture_output=True)


def elastic_run(root: Path) -> tuple[float, float, list[int]]:
    """(shrink_resume_s, grow_resume_s, steps lost per resize) for one job."""
    from slurm_elastic.daemon.drill import ResizeDrill
    from slurm_elastic.samplelog import read_records, steps_lost
    from slurm_elastic.slurm.cli import CliBackend

    work = root / "elastic"
    with ResizeDrill(CliBackend(), root / "daemon-state") as drill:
        job = submit(work, drill.url)
        try:
            wait(lambda: steps_at(work, 2) >= 15, 120, "training at 2 nodes")
            shrink = drill.resize(job, 1)
            if shrink.outcome != "applied":
                raise SystemExit(f"bench_resize: shrink {shrink.outcome}: {shrink.detail}")
            shrink_s = resumed_at(work, 1, shrink.decided_at) - shrink.decided_at
            print(f"shrink 2->1: {shrink_s:.2f} s ({shrink.detail})", flush=True)
            wait(lambda: steps_at(work, 1) >= steps_at(work, 2) + 6, 60, "steps at 1 node")
            grow = drill.resize(job, 3)
            grow_s = resumed_at(work, 3, grow.decided_at) - grow.decided_at
            print(f"grow 1->3: {grow_s:.2f} s (companion {grow.companion_id})", flush=True)
            wait(lambda: steps_at(work, 3) >= 0, 60, "a step at 3 nodes")
        finally:
            cancel(job)
        return shrink_s, grow_s, steps_lost(read_records(work / "log"))


def largest_gap(records: list[dict], node: str, start: float, end: float) -> float:
    """The longest wait between two consecutive steps of ``node``'s worker that ends in
    [start, end]: what a survivor lost to the change."""
    times = sorted(r["t"] for r in records if r["node"] == node)
    gaps = [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
    return max(gaps, default=0.0)


def started_at(job: int) -> float:
    """Slurm's StartTime of ``job`` (whole seconds)."""
    from slurm_elastic.slurm.cli import CliBackend

    view = CliBackend().read_job(job)
    if view is None or view.start_time is None:
        raise SystemExit(f"bench_resize: job {job} has no start time")
    return float(view.start_time)


def stop_free_run(root: Path) -> tuple[float, float, float, float, list[int]]:
    """(shrink_pause_s, grow_pause_s, join_ready_s, all_joined_s, steps lost per change) in
    the torchft mode."""
    from slurm_elastic.daemon.drill import ResizeDrill
    from slurm_elastic.samplelog import first_time_at, read_records, steps_lost
    from slurm_elastic.slurm.cli import CliBackend

    work = root / "torchft"
    with ResizeDrill(CliBackend(), root / "daemon-state-ft") as drill:
        job = submit(work, drill.url, mode="torchft")
        try:
            wait(lambda: steps_at(work, 2) >= 15, 120, "training at 2 nodes")
            survivor = min(r["node"] for r in read_records(work / "log"))  # the batch host
            shrink = drill.resize(job, 1)
            if shrink.outcome != "applied":
                raise SystemExit(f"bench_resize: shrink {shrink.outcome}: {shrink.detail}")
            at_one = resumed_at(work, 1, shrink.decided_at)
            wait(lambda: steps_at(work, 1) >= steps_at(work, 2) + 6, 60, "steps at 1 node")
            shrink_pause = largest_gap(
                read_records(work / "log"), survivor, shrink.decided_at, at_one + 1.0
            )
            print(f"shrink 2->1: pause {shrink_pause:.2f} s ({shrink.detail})", flush=True)
            grow = drill.resize(job, 3)
            if grow.outcome != "applied" or grow.companion_id is None:
                raise SystemExit(f"bench_resize: grow {grow.outcome}: {grow.detail}")
            at_three = resumed_at(work, 3, grow.decided_at)
            wait(lambda: steps_at(work, 3) >= steps_at(work, 1) + 6, 60, "steps at 3 nodes")
            records = read_records(work / "log")
            grow_pause = largest_gap(records, survivor, grow.decided_at, at_three + 1.0)
            joined = {r["node"] for r in records if r["world"] == 3} - {survivor}
            theirs = [r for r in records if r["node"] in joined and r["t"] >= grow.decided_at]
            started = started_at(grow.companion_id)
            join_ready = min(r["t"] for r in theirs) - started
            all_joined = (first_time_at(theirs, 3, grow.decided_at) or at_three) - started
            print(
                f"grow 1->3: pause {grow_pause:.2f} s, companion {grow.companion_id} "
                f"trained {join_ready:.2f} s after its start, all its groups "
                f"{all_joined:.2f} s after",
                flush=True,
            )
        finally:
            cancel(job)
        lost = steps_lost(read_records(work / "log"))
        return shrink_pause, grow_pause, join_ready, all_joined, lost


def requeue_run(root: Path) -> tuple[float, int]:
    """(requeue_resume_s, steps lost) for the stock-Slurm baseline, 2 -> 1 nodes."""
    from slurm_elastic.samplelog import read_records, steps_lost

    work = root / "requeue"
    job = submit(work, "http://127.0.0.1:9")  # no daemon: the job must not care
    try:
        wait(lambda: steps_at(work, 2) >= 15, 120, "training at 2 nodes")
        decided = time.time()
        for args in (
            ["scontrol", "requeue", str(job)],
            ["scontrol", "update", f"JobId={job}", "NumNodes=1-1"],
            ["scontrol", "update", f"JobId={job}", "StartTime=now"],
        ):
            subprocess.run(args, check=True, timeout=30, capture_output=True)
        requeue_s = resumed_at(work, 1, decided) - decided
        print(f"requeue 2->1: {requeue_s:.2f} s", flush=True)
    finally:
        cancel(job)
    return requeue_s, sum(steps_lost(read_records(work / "log")))


# --end-to-end: the schedule, by the training's own step count (one epoch is 50 steps).
E2E_GROW_AT, E2E_SHRINK_AT, E2E_LOSS_AT = 20, 70, 120
E2E_STEPS = 200  # the TRAIN job: 2400 samples, 48 a step, 4 epochs
# 10 ms a sample: about 0.25 s a step at 2 nodes, so each size lasts 10-30 s of training.
E2E_PACE = ["--sample-sleep", "0.01", *PACE[2:]]


def last_step(work: Path) -> int:
    from slurm_elastic.samplelog import read_records

    return max((r["step"] for r in read_records(work / "log")), default=-1)


def end_to_end_run(root: Path, mode: str) -> tuple[float, int, float]:
    """(completion_s, steps lost, the slowest change's stall) of one job in ``mode`` under
    the --end-to-end schedule.  A change's stall: the longest wait between two consecutive
    steps of the job (any node) from the change to its first step at the new size."""
    from slurm_elastic.daemon.drill import ResizeDrill
    from slurm_elastic.samplelog import first_time_at, read_records, steps_lost
    from slurm_elastic.slurm.cli import CliBackend

    work = root / f"e2e-{mode}"
    backend = CliBackend()
    changes: list[tuple[float, int]] = []  # (when, the step it came at)
    job = 0
    try:
        with ResizeDrill(backend, root / f"daemon-state-e2e-{mode}") as drill:
            job = submit(work, drill.url, mode=mode, pace=E2E_PACE)
            for at, size in ((E2E_GROW_AT, 3), (E2E_SHRINK_AT, 2)):
                wait(lambda at=at: last_step(work) >= at, 300, f"step {at}")
                changes.append((time.time(), last_step(work)))
                done = drill.resize(job, size)
                if done.outcome != "applied":
                    raise SystemExit(
                        f"bench_resize: resize to {size} {done.outcome}: {done.detail}"
                    )
                print(f"{mode}: step {changes[-1][1]}: resized to {size}", flush=True)
        # The daemon is gone (it would grow the job back): the node is lost unannounced.
        wait(lambda: last_step(work) >= E2E_LOSS_AT, 300, f"step {E2E_LOSS_AT}")
        changes.append((time.time(), last_step(work)))
        subprocess.run(
            ["scontrol", "update", f"JobId={job}", "NumNodes=1"],
            check=True,
            timeout=30,
            capture_output=True,
        )
        print(f"{mode}: step {changes[-1][1]}: a node lost", flush=True)

        def ended() -> bool:
            view = backend.read_job(job)
            return view is None or not (view.is_running or view.is_pending)

        wait(ended, 600, "the job's end")
        started = started_at(job)
    finally:
        if job:
            cancel(job)
    records = read_records(work / "log")
    if max(r["step"] for r in records) < E2E_STEPS - 1:
        raise SystemExit(f"bench_resize: the {mode} job ended before its last step")
    completion = max(r["t"] for r in records) - started
    times = sorted(r["t"] for r in records)
    stalls = []
    for (when, _step), world in zip(changes, (3, 2, 1), strict=True):
        # From the last step before the change to the first at the new size.
        at_new = first_time_at(records, world, when) or max(times)
        window = [t for t in times if t < when][-1:] + [t for t in times if when <= t <= at_new]
        stalls.append(max((b - a for a, b in itertools.pairwise(window)), default=0.0))
    print(f"{mode}: completed in {completion:.1f} s; stalls {[round(x, 2) for x in stalls]}")
    return completion, max(steps_lost(records), default=0), max(stalls)


def end_to_end(repeat: int, keep: Path | None) -> int:
    results: dict[str, list[tuple[float, int, float]]] = {"torchft": [], "torchrun": []}
    holder = contextlib.nullcontext(str(keep)) if keep else None
    with holder or tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        for i in range(repeat):
            # Alternate which mode goes first: the machine's state drifts over a run.
            order = ("torchft", "torchrun") if i % 2 == 0 else ("torchrun", "torchft")
            for mode in order:
                results[mode].append(end_to_end_run(Path(tmp) / f"run{i}", mode))
    figures = [f"runs={repeat}"]
    for mode in ("torchft", "torchrun"):
        figures.append(f"e2e_{mode}_s={statistics.median(r[0] for r in results[mode]):.1f}")
    figures += ["resizes=2", "node_losses=1"]
    for mode in ("torchft", "torchrun"):
        figures.append(f"{mode}_steps_lost={max(r[1] for r in results[mode])}")
        figures.append(f"{mode}_worst_stall_s={statistics.median(r[2] for r in results[mode]):.2f}")
    figures += [f"cores={os.cpu_count()}", f"load_avg={os.getloadavg()[1]:.1f}"]
    print(" ".join(figures))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--mode", choices=["torchrun", "torchft"], default="torchrun")
    parser.add_argument(
        "--no-compare", action="store_true", help="--mode torchft without the torchrun runs"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the job logs in this dir")
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="one whole job per mode under the same schedule: completion times",
    )
    args = parser.parse_args()
    if shutil.which("slurm-elastic") is None:
        print("bench_resize: slurm-elastic is not on PATH (pip install -e .)", file=sys.stderr)
        return 2
    up = ["up", "--slurm", args.slurm, "--instance", str(args.instance)]
    subprocess.run(
        ["bash", str(REPO / "scripts" / "cluster.sh"), *up],
        check=True,
        timeout=300,
        capture_output=True,
    )
    cluster_env(args.slurm, args.instance)
    if args.end_to_end:
        return end_to_end(args.repeat, args.keep)
    torchft = args.mode == "torchft"
    torchrun = not torchft or not args.no_compare
    shrinks: list[float] = []
    grows: list[float] = []
    requeues: list[float] = []
    lost: list[int] = []
    requeue_lost: list[int] = []
    pauses: dict[str, list[float]] = {"shrink": [], "grow": [], "join": [], "all": []}
    ft_lost: list[int] = []
    keep = contextlib.nullcontext(str(args.keep)) if args.keep else None
    with keep or tempfile.TemporaryDirectory(prefix="bench-resize-") as tmp:
        for i in range(args.repeat):
            if torchrun:
                shrink_s, grow_s, lost_each = elastic_run(Path(tmp) / f"run{i}")
                shrinks.append(shrink_s)
                grows.append(grow_s)
                lost += lost_each
                requeue_s, requeue_steps = requeue_run(Path(tmp) / f"run{i}")
                requeues.append(requeue_s)
                requeue_lost.append(requeue_steps)
            if torchft:
                shrink_pause, grow_pause, join, all_joined, lost_ft = stop_free_run(
                    Path(tmp) / f"run{i}"
                )
                pauses["shrink"].append(shrink_pause)
                pauses["grow"].append(grow_pause)
                pauses["join"].append(join)
                pauses["all"].append(all_joined)
                ft_lost += lost_ft
    figures = [f"runs={args.repeat}"]
    if torchft:
        figures += [
            f"shrink_pause_s={statistics.median(pauses['shrink']):.2f}",
            f"grow_pause_s={statistics.median(pauses['grow']):.2f}",
            f"join_ready_s={statistics.median(pauses['join']):.2f}",
            f"all_joined_s={statistics.median(pauses['all']):.2f}",
            f"steps_lost={max(ft_lost, default=0)}",
        ]
    if torchrun:
        prefix = "torchrun_" if torchft else ""
        figures += [
            f"{prefix}shrink_resume_s={statistics.median(shrinks):.2f}",
            f"{prefix}grow_resume_s={statistics.median(grows):.2f}",
            f"{prefix}requeue_resume_s={statistics.median(requeues):.2f}",
            f"{prefix}steps_lost={max(lost, default=0)}",
            f"{prefix}requeue_steps_lost={max(requeue_lost, default=0)}",
        ]
    figures += [f"cores={os.cpu_count()}", f"load_avg={os.getloadavg()[1]:.1f}"]
    print(" ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
