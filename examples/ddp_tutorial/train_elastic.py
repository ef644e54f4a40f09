"""A DDP training script written the way PyTorch's DDP tutorial writes one, on CPU/gloo.

The structure of ``distributed/ddp-tutorial-series/multigpu_torchrun.py`` in pytorch/examples
(DDP, a DataLoader over a DistributedSampler, a Trainer with snapshots, launched by
torchrun), written for this repository: gloo on CPU, a regression loss (the tutorial's
one-class cross-entropy learns nothing), float64, and options for tests: the final
weights (``--out``), a per-sample cost in the dataset (``--sample-sleep``, paid in the
DataLoader's workers) and GPUs (``--cuda --backend nccl``).

``train_elastic.py`` beside it is the same script made elastic; ``docs/porting.md`` shows
the diff.  Run: ``torchrun --nproc-per-node=2 train.py 3 1``.
"""

import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from slurm_elastic.agent import elastic


class MyTrainDataset(Dataset):
    def __init__(self, size: int, sample_sleep: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = [
            (torch.rand(20, generator=generator, dtype=torch.float64),
             torch.rand(1, generator=generator, dtype=torch.float64))
            for _ in range(size)
        ]  # fmt: skip
        self.sample_sleep = sample_sleep

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sample_sleep)  # stands for decoding and augmentation
        return self.data[index]


def ddp_setup(backend: str) -> None:
    init_process_group(backend=backend)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        cuda: bool = False,
    ) -> None:
        self.rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.rank) if cuda else torch.device("cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.state = elastic.restore(self.model, self.optimizer, epoch=self.epochs_run)
        self.epochs_run = self.state.epoch
        self.model = DDP(self.model, device_ids=[self.rank] if cuda else None)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        elastic.step_done(self.state)

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[rank {self.rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}"
        )
        for source, targets in self.train_data:
            self._run_batch(source.to(self.device), targets.to(self.device))

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs(size: int, sample_sleep: float):
    train_set = MyTrainDataset(size, sample_sleep)
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int) -> DataLoader:
    return DataLoader(
        dataset,
        shuffle=False,
        num_workers=2,
        batch_sampler=elastic.BatchSampler(dataset, global_batch=batch_size),
    )


def main(save_every: int, total_epochs: int, batch_size: int, args) -> None:
    ddp_setup(args.backend)
    torch.set_num_threads(1)
    dataset, model, optimizer = load_train_objs(args.samples, args.sample_sleep)
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, args.snapshot, args.cuda)
    trainer.train(total_epochs)
    if args.out and int(os.environ["RANK"]) == 0:
        torch.save(trainer.model.module.state_dict(), args.out)
    destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=48, type=int, help="Input batch size")
    parser.add_argument("--samples", default=2400, type=int, help="Dataset size")
    parser.add_argument("--sample-sleep", default=0.0, type=float, help="Seconds per sample")
    parser.add_argument("--snapshot", default="snapshot.pt", help="Snapshot file")
    parser.add_argument("--out", default=None, help="Write the final weights here")
    parser.add_argument("--backend", default="gloo", help="gloo, or nccl for GPUs")
    parser.add_argument("--cuda", action="store_true", help="Train on the rank's GPU")
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size, args)
