"""Benchmark: the DDP port (examples/ddp_tutorial/train_elastic.py) resized on a GPU machine.

No Slurm: torchrun processes on one machine, driven through the job directory the way the
launcher drives them (``control.json`` hold, then resume with a restart).

1. ``nccl``: one rank on GPU 0 with the NCCL backend (NCCL needs a GPU per rank, and the
   machines lent here have one): hold at a step boundary, resume with a restart (torch
   elastic re-forms the group), finish.  Measured: hold -> held.json, resume -> first step
   of the new group (the pause), steps lost, equality with an unresized run.
2. ``resize``: 2 ranks hold, are stopped, 3 ranks continue from the checkpoint on the same
   job directory: exactly once per epoch, no step lost, the unresized weights.  NCCL with a
   GPU per rank, so only on a machine with 3 GPUs or more (``resize=skipped`` otherwise:
   rank ``r`` trains on ``cuda:r``, as in the tutorial); gloo with ``--cpu``.

``python scripts/bench_gpu_resize.py [--cpu]`` (``--cpu``: the same flow on CPU and gloo,
to check the script itself where there is no GPU).  Last line: key=value figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.agent.jobdir import Control, read_json, write_json
from slurm_elastic.samplelog import read_records, samples_per_epoch, steps_lost

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "ddp_tutorial" / "train_elastic.py"
SAMPLES = 960  # 20 steps an epoch at a global batch of 48
ARGS = ["2", "2", "--samples", str(SAMPLES), "--batch_size", "48"]


def env_for(job_dir: Path | None, log: Path | None) -> dict[str, str]:
    drop = ("SLURM", "RANK", "LOCAL_", "WORLD_SIZE", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env |= {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if job_dir is not None:
        env["SLURM_ELASTIC_JOB_DIR"] = str(job_dir)
    if log is not None:
        env["SLURM_ELASTIC_SAMPLE_LOG"] = str(log)
    return env


def torchrun(procs: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={procs}", "--max-restarts=2"]  # fmt: skip


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"bench_gpu_resize: timed out waiting for {what}")


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].cpu() - b[k].cpu()).abs().max()) for k in a)


def exactly_once(records: list[dict[str, Any]]) -> bool:
    return all(sorted(seen) == list(range(SAMPLES)) for seen in samples_per_epoch(records).values())


def reference(work: Path, device_args: list[str]) -> dict[str, torch.Tensor]:
    work.mkdir()
    subprocess.run(
        [sys.executable, str(SCRIPT), *ARGS, *device_args, "--out", str(work / "final.pt")],
        cwd=work, env=env_for(None, None), check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return torch.load(work / "final.pt")


def hold_and_restart(work: Path, device_args: list[str]) -> dict[str, float]:
    """One rank: hold, resume with a restart, finish (part 1)."""
    job_dir, log = work / "job", work / "log"
    job_dir.mkdir(parents=True)
    argv = [str(SCRIPT), *ARGS, *device_args, "--sample-sleep", "0.002"]
    argv += ["--out", str(work / "final.pt")]
    proc = subprocess.Popen(
        [*torchrun(1), *argv], cwd=work, env=env_for(job_dir, log),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(lambda: any(r["step"] >= 10 for r in read_records(log)), 300, "training")
    asked = time.time()
    write_json(job_dir / "control.json", Control(1, "hold", instruction_id="b").to_json())
    held = wait_for(lambda: read_json(job_dir / "held.json"), 120, "held.json")
    held_s = time.time() - asked
    resumed = time.time()
    write_json(job_dir / "control.json", Control(1, "resume", restart=True).to_json())
    if proc.wait(timeout=300) != 0:
        raise SystemExit(f"bench_gpu_resize: torchrun exited {proc.returncode}")
    records = read_records(log)
    gens = sorted({r["gen"] for r in records})
    first_new = min(r["t"] for r in records if r["gen"] == gens[-1])
    return {
        "held_s": held_s,
        "restart_pause_s": first_new - resumed,
        "held_step": float(held["step"]),
        "generations": float(len(gens)),
        "steps_lost": float(sum(steps_lost(records))),
        "exactly_once": float(exactly_once(records)),
    }


def two_then_three(work: Path, device_args: list[str]) -> dict[str, float]:
    """Two ranks hold and are stopped; three continue (part 2)."""
    job_dir, log = work / "job", work / "log"
    job_dir.mkdir(parents=True)
    argv = [str(SCRIPT), *ARGS, *device_args, "--sample-sleep", "0.004"]
    argv += ["--out", str(work / "final.pt")]
    env = env_for(job_dir, log)
    output = open(work / "torchrun-2.log", "wb")  # noqa: SIM115 (closed below)
    first = subprocess.Popen(
        [*torchrun(2), *argv], cwd=work, env=env, start_new_session=True,
        stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: any(r["step"] >= 8 for r in read_records(log)), 60, "training at 2")
    except SystemExit:
        os.killpg(first.pid, signal.SIGKILL)
        output.close()
        tail = (work / "torchrun-2.log").read_text(errors="replace")[-3000:]
        raise SystemExit(
            f"bench_gpu_resize: 2 ranks did not train; torchrun said:\n{tail}"
        ) from None
    write_json(job_dir / "control.json", Control(1, "hold", instruction_id="b").to_json())
    wait_for(lambda: read_json(job_dir / "held.json"), 120, "held.json")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    output.close()
    write_json(job_dir / "control.json", Control(1, "resume", restart=True).to_json())
    started = time.time()
    subprocess.run([*torchrun(3), *argv], cwd=work, env=env, check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    records = read_records(log)
    worlds = [w for _, w in sorted({(r["gen"], r["world"]) for r in records})]
    first_at_three = min(r["t"] for r in records if r["world"] == 3)
    return {
        "worlds_2_then_3": float(worlds == [2, 3]),
        "start_to_first_step_s": first_at_three - started,
        "steps_lost": float(sum(steps_lost(records))),
        "exactly_once": float(exactly_once(records)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the same flow on CPU and gloo")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("bench_gpu_resize: no CUDA device (use --cpu to check the script)")
    nccl = ["--backend", "gloo"] if args.cpu else ["--cuda", "--backend", "nccl"]
    gpus = 0 if args.cpu else torch.cuda.device_count()
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0).replace(" ", "_")
    figures: dict[str, float | str] = {"device": device}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        root = Path(tmp)
        ref = reference(root / "ref", nccl)
        part1 = hold_and_restart(root / "nccl", nccl)
        figures |= {f"nccl_{k}": round(v, 3) for k, v in part1.items()}
        figures["nccl_max_weight_diff"] = max_diff(torch.load(root / "nccl" / "final.pt"), ref)
        print(" ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
        if args.cpu or gpus >= 3:
            part2 = two_then_three(root / "resize", nccl)
            figures |= {f"resize_{k}": round(v, 3) for k, v in part2.items()}
            figures["resize_max_weight_diff"] = max_diff(
                torch.load(root / "resize" / "final.pt"), ref
            )
        else:
            figures["resize"] = f"skipped_gpus_{gpus}"
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
