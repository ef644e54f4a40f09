"""The demo's job mix: who arrives when, how big, and the batch script each one runs.

The mix is designed so that the daemon's own policy (not a script) makes the three kinds
of change happen on a 4-node cluster:

* ``mlp-wide`` arrives to an almost empty cluster and Slurm starts it at its maximum;
* ``mlp-narrow`` arrives when every node is taken: it pends, the daemon pins it to the
  size that fits (start-at-size) and shrinks ``mlp-wide`` to make that room (shrink);
* when the rigid ``sleep-a`` ends, its node is free and no rigid job waits, so a running
  elastic job grows onto it with a companion job (grow);
* ``sleep-b`` (rigid) arrives later and holds the FIFO line, which the daemon respects.

Elastic jobs run the real ``examples/train_mlp.py`` under ``slurm-elastic run``.  Their
``--sample-sleep`` makes a step's time mostly per-sample work, which the ranks split, so
speed grows with nodes even on this 2-core machine; ``mlp-narrow`` has a larger share of
fixed per-step cost (bigger micro-batches, less sleep per sample) and scales less.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DemoJob:
    name: str
    arrive_s: float  # seconds after the demo's start
    min_nodes: int
    max_nodes: int  # equal to min_nodes for a rigid job
    elastic: bool
    train_args: tuple[str, ...] = ()  # examples/train_mlp.py arguments (elastic jobs)
    sleep_s: float = 0.0  # what a rigid job does
    role: str = ""  # what it is there to show (printed in the plan of the demo)

    @property
    def nodes_option(self) -> str:
        lo, hi = self.min_nodes, self.max_nodes
        return str(lo) if lo == hi else f"{lo}-{hi}"

    @property
    def total_steps(self) -> int | None:
        """Optimizer steps of the whole training (fixed global batch), None for rigid jobs."""
        if not self.elastic:
            return None
        args = dict(zip(self.train_args[::2], self.train_args[1::2], strict=False))
        samples = int(args.get("--samples", 960))
        batch = int(args.get("--global-batch", 48))
        epochs = int(args.get("--epochs", 3))
        return epochs * -(-samples // batch)


def _train(samples: int, epochs: int, sleep: float, micro: int, seed: int) -> tuple[str, ...]:
    return (
        "--samples",
        str(samples),
        "--epochs",
        str(epochs),
        "--global-batch",
        "48",
        "--micro-batch",
        str(micro),
        "--sample-sleep",
        str(sleep),
        "--seed",
        str(seed),
        "--report-every",
        "2",
        "--checkpoint-every",
        "25",
    )


# Full demo, about 5-6 minutes on the shared 2-core machine.
FULL: tuple[DemoJob, ...] = (
    DemoJob("sleep-a", 0, 1, 1, False, sleep_s=100, role="rigid; its end frees a node (grow)"),
    DemoJob(
        "mlp-wide",
        3,
        1,
        3,
        True,
        _train(4800, 11, 0.010, 16, 1),
        role="elastic, scales well; started at the size that is free",
    ),
    DemoJob(
        "mlp-narrow",
        40,
        1,
        3,
        True,
        _train(4800, 8, 0.006, 8, 2),
        role="elastic; arrives to a full cluster (start-at-size + shrink)",
    ),
    DemoJob(
        "mlp-small",
        150,
        1,
        2,
        True,
        _train(2400, 6, 0.008, 16, 3),
        role="elastic 1-2; arrives to a full cluster again",
    ),
    DemoJob("sleep-b", 170, 2, 2, False, sleep_s=45, role="rigid; waits its FIFO turn"),
)

# --quick (the smoke test): the same story, shorter.
QUICK: tuple[DemoJob, ...] = (
    DemoJob("sleep-a", 0, 1, 1, False, sleep_s=50, role="rigid; its end frees a node (grow)"),
    DemoJob(
        "mlp-wide",
        2,
        1,
        3,
        True,
        _train(2400, 10, 0.010, 16, 1),
        role="elastic, scales well; started at the size that is free",
    ),
    DemoJob(
        "mlp-narrow",
        20,
        1,
        3,
        True,
        _train(2400, 6, 0.006, 8, 2),
        role="elastic; arrives to a full cluster (start-at-size + shrink)",
    ),
)


def batch_script(job: DemoJob, *, python: str, example: Path, work_dir: Path) -> str:
    """The sbatch script a user would write: the elastic flag is ``--comment=elastic``."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes_option}",
        f"#SBATCH --output={work_dir}/slurm-%j.out",
    ]
    if job.elastic:
        lines.append("#SBATCH --comment=elastic")
        train = shlex.join([python, str(example), *job.train_args])
        lines.append(f"slurm-elastic run -- {train}")
    else:
        lines.append(f"sleep {job.sleep_s:g}")
    return "\n".join(lines) + "\n"
