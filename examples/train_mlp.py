"""A tiny, real elastic training job: an MLP regressing a fixed random teacher (CPU, gloo).

Run it under ``slurm-elastic run`` (see train_mlp.sbatch) or alone (one process).  The
daemon may shrink or grow the job at any time; the result does not depend on it: with the
default batch rule (fixed global batch via gradient accumulation) the final weights equal,
within float rounding, those of a run that never resized.

``--sample-log DIR`` writes, per rank, one JSON line per step with the sample indices the
rank trained on, so tests can check that each epoch saw every sample exactly once.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from slurm_elastic.agent.batching import BatchMode, BatchRule
from slurm_elastic.agent.torch import ElasticTrainer
from slurm_elastic.samplelog import SampleLog


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features))
    teacher = rng.standard_normal((features, 1))
    y = np.tanh(x @ teacher) + 0.05 * rng.standard_normal((samples, 1))
    return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=960)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--batch-mode", choices=[m.value for m in BatchMode], default="accumulate")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--report-every", type=float, default=5.0)
    parser.add_argument(
        "--sample-sleep",
        type=float,
        default=0.0,
        help="extra seconds per sample a rank trains on: paces the demo like real compute",
    )
    parser.add_argument("--sample-log", default=None)
    parser.add_argument("--out", default=None, help="write the final weights here (rank 0)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x, y = make_data(args.samples, args.features, args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.features, args.hidden),
        torch.nn.Tanh(),
        torch.nn.Linear(args.hidden, 1),
    ).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    rule = BatchRule(
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        mode=BatchMode(args.batch_mode),
    )
    trainer = ElasticTrainer(
        model,
        optimizer,
        num_samples=args.samples,
        rule=rule,
        epochs=args.epochs,
        seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        report_every_s=args.report_every,
    )
    log = SampleLog(args.sample_log, trainer.generation, trainer.rank) if args.sample_log else None

    for step in trainer:
        loss_sum = 0.0
        for idx in step.micro_batches:
            batch = torch.from_numpy(idx)
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch], reduction="sum")
            (loss * step.loss_scale).backward()
            loss_sum += loss.item() * step.loss_scale
        if log is not None:
            mine = [int(i) for idx in step.micro_batches for i in idx]
            log.write(
                step=step.index,
                epoch=step.epoch,
                world=step.world_size,
                nodes=trainer.nodes,
                indices=mine,
                generation=step.generation,
                rank=step.rank,
            )
        if args.sample_sleep:
            time.sleep(args.sample_sleep * sum(len(idx) for idx in step.micro_batches))
        trainer.optimizer_step(loss_sum)

    if trainer.rank == 0:
        # loss is None when a restart found the training already complete.
        print(f"done: steps={trainer.completed} loss={trainer.loss} pid={os.getpid()}")
        if args.out:
            torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
