"""The demo's job mix: who arrives when, how big, and the batch script each one runs.

The mix is designed so that the daemon's own policy (not a script) makes the three kinds
of change happen on a 4-node cluster:

* ``mlp-wide`` arrives to an almost empty cluster and Slurm starts it at its maximum;
* ``mlp-narrow`` arrives when every node is taken: it pends, the daemon pins it to the
  size that fits (start-at-size) and shrinks ``mlp-wide`` to make that room (shrink).  A
  new job has no history, so the policy values it by the site prior (hours of work); over
  the default one-hour horizon starting it is worth more than what ``mlp-wide`` loses;
* once both report their speed, and when the rigid ``sleep-a`` ends and frees a node, a
  running elastic job grows with a companion job (grow);
* ``mlp-small`` arrives to a full cluster again (start-at-size, shrinks), and ``sleep-b``
  (rigid) holds the FIFO line, which the daemon respects.

Elastic jobs run the real ``examples/train_mlp.py`` under ``slurm-elastic run``, stop-free
(``--mode torchft``: the nodes that stay keep their processes) unless the demo is run with
``--mode torchrun`` (every resize restarts the workers from a checkpoint).  Each writes a
sample log (``jobs/<name>/samples``), from which the summary reads what its surviving
workers felt at each resize.  Their
``--sample-sleep`` makes a step's time mostly per-sample work, which the ranks split, so
speed grows with nodes even on this 2-core machine; ``mlp-narrow`` has a larger share of
fixed per-step cost (smaller micro-batches, less sleep per sample), so it gains less from
more nodes when the machine is busy.  Their measured speeds per size are in summary.json.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

MODES = ("torchft", "torchrun")
DEFAULT_MODE = "torchft"


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job of the demo's workload: when it arrives, its range, what it runs."""

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


def _mlp(
    name: str,
    arrive_s: float,
    nodes: tuple[int, int],
    *,
    samples: int,
    epochs: int,
    sleep: float,
    micro: int,
    seed: int,
    role: str,
) -> DemoJob:
    """An elastic job training the example MLP (global batch 48, fixed by accumulation)."""
    args = {
        "--samples": samples,
        "--epochs": epochs,
        "--global-batch": 48,
        "--micro-batch": micro,
        "--sample-sleep": sleep,
        "--seed": seed,
        "--report-every": 2,
        "--checkpoint-every": 25,
    }
    train = tuple(item for key, value in args.items() for item in (key, str(value)))
    return DemoJob(name, arrive_s, nodes[0], nodes[1], True, train, role=role)


def _sleep(name: str, arrive_s: float, nodes: int, sleep_s: float, role: str) -> DemoJob:
    return DemoJob(name, arrive_s, nodes, nodes, False, sleep_s=sleep_s, role=role)


_WIDE = "elastic, long, per-sample cost dominates (scales ~linearly)"
_NARROW = "elastic, more per-step overhead; arrives to a full cluster (start-at-size + shrink)"
_FREES = "rigid; its end frees a node (grow)"

# Full demo, about 5-6 minutes on the shared 2-core machine.
FULL: tuple[DemoJob, ...] = (
    _sleep("sleep-a", 0, 1, 100, _FREES),
    _mlp("mlp-wide", 3, (1, 3), samples=4800, epochs=8, sleep=0.010, micro=16, seed=1, role=_WIDE),
    _mlp(
        "mlp-narrow", 40, (1, 3), samples=4800, epochs=6, sleep=0.006, micro=8, seed=2, role=_NARROW
    ),
    _mlp(
        "mlp-small",
        150,
        (1, 2),
        samples=2400,
        epochs=5,
        sleep=0.008,
        micro=16,
        seed=3,
        role="elastic 1-2; arrives to a full cluster again",
    ),
    _sleep("sleep-b", 170, 2, 45, "rigid; waits its FIFO turn"),
)

# --quick (the smoke test): the same story, shorter.
QUICK: tuple[DemoJob, ...] = (
    _sleep("sleep-a", 0, 1, 40, _FREES),
    _mlp("mlp-wide", 2, (1, 3), samples=2400, epochs=6, sleep=0.010, micro=16, seed=1, role=_WIDE),
    _mlp(
        "mlp-narrow", 18, (1, 3), samples=2400, epochs=4, sleep=0.006, micro=8, seed=2, role=_NARROW
    ),
)


def sample_log_dir(work_dir: Path) -> Path:
    return work_dir / "samples"


def batch_script(
    job: DemoJob, *, python: str, example: Path, work_dir: Path, mode: str = DEFAULT_MODE
) -> str:
    """The sbatch script a user would write: the elastic flag is ``--elastic`` (the SPANK
    option, etc/spank/elastic.c; the range is the job's ``--nodes``); ``mode`` is how its
    training resizes (``slurm-elastic run --mode``)."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes_option}",
        f"#SBATCH --output={work_dir}/slurm-%j.out",
    ]
    if job.elastic:
        lines.append("#SBATCH --elastic")
        samples = ["--sample-log", str(sample_log_dir(work_dir))]
        train = shlex.join([python, str(example), *job.train_args, *samples])
        lines.append(f"slurm-elastic run --mode {mode} -- {train}")
    else:
        lines.append(f"sleep {job.sleep_s:g}")
    return "\n".join(lines) + "\n"
