"""Drop-ins that make a standard DDP training script elastic (the ``agent`` extra).

For scripts written the PyTorch tutorial's way -- ``init_process_group``, a ``DataLoader``
over a ``DistributedSampler``, the model wrapped in ``DistributedDataParallel``, snapshots
-- and run under ``slurm-elastic run``.  Three calls and a sampler join what it has::

    from slurm_elastic.agent import elastic

    init_process_group(backend="nccl")    # the script's own, kept (or elastic.init_process_group())
    loader = DataLoader(dataset, batch_sampler=elastic.BatchSampler(dataset, global_batch=64),
                        num_workers=2)    # for batch_size=..., sampler=DistributedSampler(...)
    state = elastic.restore(model, optimizer)   # before (or after) DDP(model)
    for epoch in range(state.epoch, epochs):
        for x, y in loader:
            ...                           # forward, backward, optimizer.step() as before
            elastic.step_done(state)

What the library owns, and what stays the script's:

* **The process group**: the script's own ``init_process_group`` call works as before, and
  under plain ``python`` too (importing this module gives a one-process job torchrun's
  variables, :func:`single_process_defaults`).  :func:`init_process_group` is the same with
  the backend chosen from the hardware (NCCL with CUDA, else gloo;
  ``$SLURM_ELASTIC_BACKEND`` overrides).  At a resize torchrun starts the script again, so
  its ``DDP(model)`` is simply made anew.
* **The data order** (:class:`BatchSampler`): a fixed *global* batch, split among the ranks
  there are now; every sample once per epoch across any number of resizes, in a
  ``DataLoader`` with workers, prefetching and transforms.
* **The step boundary** (:func:`step_done`, on :class:`~slurm_elastic.agent.boundary.
  StepBoundary`): after each optimizer step the ranks agree (one small all-reduce) on the
  launcher's hold, a SIGTERM or a checkpoint request; a resize saves that boundary and
  exits with the resize code, so nothing is redone.  Checkpoints every
  ``checkpoint_every`` steps too, and once more when the script ends.
* **The script** keeps its model, loss, optimizer, DDP wrapper, dataset and transforms,
  and may keep its own snapshots: :func:`restore` loads the newer of the library's
  checkpoints over them.

The drop-ins resize by restarting the workers (``slurm-elastic run``'s default ``--mode
torchrun``).  Under ``--mode torchft`` every node would be a replica group on its own, and
DDP would average gradients only inside it: each node would train alone.  So they refuse
that mode (:class:`~slurm_elastic.errors.AgentError`); stop-free training is
``slurm_elastic.agent.torch.ElasticTrainer``'s.

One DataLoader batch is one optimizer step.  The update equals an unresized run's (up to
float rounding) when every rank's share is the same size: the dataset a multiple of the
global batch, the global batch a multiple of every world size.  Otherwise the samples are
still seen exactly once, but DDP's mean of per-rank means weighs the ragged steps
differently, as with ``DistributedSampler``.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import os
import socket
import sys
from collections import deque
from collections.abc import Callable, Iterator, MutableMapping, Sized
from pathlib import Path
from typing import Any

import structlog

from slurm_elastic.agent.modes import stop_free
from slurm_elastic.errors import AgentError, MissingExtra

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError:
    raise MissingExtra("slurm_elastic.agent.elastic", "torch", "agent") from None

from slurm_elastic.agent import boundary as _boundary
from slurm_elastic.agent.boundary import Progress, StepBoundary
from slurm_elastic.agent.sampler import ElasticSampler, SamplerState, rank_share
from slurm_elastic.samplelog import SampleLog

__all__ = ["BatchSampler", "Progress", "init_process_group", "restore", "step_done"]

log = structlog.get_logger("slurm_elastic.agent")

SAMPLE_LOG_ENV = "SLURM_ELASTIC_SAMPLE_LOG"  # a directory: per-rank records of each step
MAX_WORLD_ENV = "SLURM_ELASTIC_MAX_WORLD"  # the job's largest world size (the node agent's)


def single_process_defaults(env: MutableMapping[str, str]) -> None:
    """Outside torchrun, the variables torchrun gives its workers, for a one-process job.

    Run at import: a script written for torchrun reads ``LOCAL_RANK`` and calls
    ``init_process_group(backend=...)`` (env://), and with these it also runs under plain
    ``python``.  Under torchrun (``RANK`` set) nothing changes.
    """
    if "RANK" in env:
        return
    with socket.socket() as probe:  # a free loopback port for the one-process store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    defaults |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in defaults.items():
        env.setdefault(name, value)


def refuse_stop_free() -> None:
    """The drop-ins under ``--mode torchft`` would let every node train alone (module doc)."""
    if stop_free():
        raise AgentError(
            "slurm_elastic.agent.elastic resizes by restarting the workers: run this script "
            "with slurm-elastic run --mode torchrun (the default); the stop-free --mode "
            "torchft needs slurm_elastic.agent.torch.ElasticTrainer"
        )


def init_process_group(backend: str | None = None, timeout_s: float = 120.0) -> None:
    """Join torchrun's process group (a one-process one under plain ``python``), with the
    backend named or else the one the hardware calls for (module doc)."""
    refuse_stop_free()
    _boundary.init_process_group(backend, timeout_s)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share_temp_dir() -> str:
    """Make this process's multiprocessing temp dir now, before a DataLoader forks its
    workers, so that they share it instead of each making its own.

    A worker that passed a batch's tensors by file descriptor keeps a listening socket in
    that directory; when it exits (every epoch, every restart) its own removal of the
    directory can race the socket's and print ``OSError: [Errno 39] Directory not empty:
    '/tmp/pymp-...'`` with a traceback (CPython's ``multiprocessing.util._remove_temp_dir``;
    seen in CI at a grow's restart, and in mlcommons/storage#499), which reads like a crash.
    A forked worker that finds the directory made removes nothing (its socket it does).
    This process removes it at its normal end; a resize's ``os._exit`` leaves it, empty once
    the workers are gone: removing it then would race the workers' own ends the same way."""
    return multiprocessing.util.get_temp_dir()


class BatchSampler:
    """This rank's share of each global batch, in an order that survives resizes.

    A ``batch_sampler`` for ``DataLoader``: each item is the list of dataset indices this rank
    trains on in one step.  Epoch ``e``'s order depends only on ``(seed, e)``; each step takes
    the next ``global_batch`` of it and splits them among the current ranks (sizes differ by
    at most one).  At the end of an epoch a remainder that could leave a rank of the largest
    world the job may reach without a sample joins the step before it; the steps therefore
    do not depend on the sizes the job passes through.  That largest world is
    ``max_world_size``, else ``$SLURM_ELASTIC_MAX_WORLD`` (which ``slurm-elastic run`` sets:
    max nodes times processes per node), else the world of the moment.  Where the job is
    comes from :func:`restore`'s state, so after a restart at another size the next
    iteration begins exactly after the last step trained.
    """

    def __init__(
        self,
        data: Sized | int,
        global_batch: int,
        *,
        seed: int = 0,
        max_world_size: int | None = None,
    ) -> None:
        refuse_stop_free()
        num_samples = data if isinstance(data, int) else len(data)
        self.sampler = ElasticSampler(num_samples, seed)
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        self.global_batch = global_batch
        from_env = os.environ.get(MAX_WORLD_ENV, "")
        self.max_world_size = max_world_size or (int(from_env) if from_env.isdigit() else 1)
        self._position = SamplerState()  # used until restore() hands the job's position over
        self._yielded: deque[list[int]] = deque()  # this iteration's batches not yet trained
        share_temp_dir()
        _session.sampler = self

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples

    def set_epoch(self, epoch: int) -> None:
        """``DistributedSampler``'s call, accepted: the epoch comes from the job's state
        under :func:`restore`, so only a script without it moves the epoch this way."""
        if _session.boundary is None:
            self._position = SamplerState(epoch=epoch)

    def position(self) -> SamplerState:
        boundary = _session.boundary
        return boundary.progress.data if boundary is not None else self._position

    def step_size(self, offset: int, world_size: int) -> int:
        """Samples of the step that starts at ``offset`` (class doc: the tail rule)."""
        rest = self.num_samples - offset
        if rest - self.global_batch < max(self.max_world_size, world_size):
            return rest
        return self.global_batch

    def steps_left(self, offset: int, world_size: int) -> int:
        steps = 0
        while offset < self.num_samples:
            offset += self.step_size(offset, world_size)
            steps += 1
        return steps

    def __len__(self) -> int:
        return self.steps_left(self.position().offset, _world()[1])

    def __iter__(self) -> Iterator[list[int]]:
        rank, world_size = _world()
        start = self.position()
        yielded: deque[list[int]] = deque()
        self._yielded = yielded  # a new iteration supersedes what an abandoned one handed out
        for share in self.batches(start, world_size, rank):
            yielded.append(share)
            yield share
        if _session.boundary is None:  # no job state: the next iteration is the next epoch
            self._position = SamplerState(epoch=start.epoch + 1)

    def batches(self, start: SamplerState, world_size: int, rank: int) -> Iterator[list[int]]:
        """Rank ``rank``'s shares of the steps from ``start`` to the end of its epoch."""
        if self.global_batch < world_size or self.num_samples < world_size:
            raise ValueError(
                f"a global batch of {self.global_batch} over {self.num_samples} samples cannot "
                f"give each of {world_size} ranks a sample"
            )
        position = start
        while True:
            yield self.expected(position, world_size, rank)
            size = self.step_size(position.offset, world_size)
            if position.offset + size >= self.num_samples:
                return
            position = SamplerState(epoch=position.epoch, offset=position.offset + size)

    def expected(self, position: SamplerState, world_size: int, rank: int) -> list[int]:
        """This rank's share of the step that starts at ``position``."""
        size = self.step_size(position.offset, world_size)
        step = self.sampler.permutation(position.epoch)[position.offset : position.offset + size]
        return [int(i) for i in rank_share(step, world_size, rank)]

    def take_trained(self) -> list[int] | None:
        """The oldest batch handed out and not yet reported trained (None: none)."""
        return self._yielded.popleft() if self._yielded else None


class _Session:
    """The process's one elastic training: its boundary and its sampler."""

    def __init__(self) -> None:
        self.boundary: StepBoundary | None = None
        self.sampler: BatchSampler | None = None
        self.sample_log: SampleLog | None = None


_session = _Session()


def restore(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    epoch: int = 0,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 50,
    keep_checkpoints: int = 2,
    report_every_s: float = 5.0,
    hold_timeout_s: float = 300.0,
    extra_state: Callable[[], dict[str, Any]] | None = None,
) -> Progress:
    """Load the job's newest checkpoint into ``model`` and ``optimizer``; the job's state.

    Call it once, after the model and optimizer exist.  ``epoch``: where to start when there
    is no checkpoint (the script's own snapshot may have said).  ``state.epoch`` is the epoch
    to continue; the :class:`BatchSampler` continues inside it.  ``model`` may be wrapped in
    DDP already; the checkpoint holds the inner module's weights.
    """
    refuse_stop_free()
    if _session.boundary is not None:
        raise RuntimeError("elastic.restore() was already called in this process")
    if not dist.is_initialized():
        init_process_group()
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    boundary = StepBoundary(
        inner,
        optimizer,
        checkpoint_dir=checkpoint_dir,
        keep_checkpoints=keep_checkpoints,
        checkpoint_every=checkpoint_every,
        hold_timeout_s=hold_timeout_s,
        report_every_s=report_every_s,
        extra_state=extra_state,
    )
    boundary.progress.data = SamplerState(epoch=epoch)
    progress = boundary.restore()
    _session.boundary = boundary
    sample_log = os.environ.get(SAMPLE_LOG_ENV)
    if sample_log:
        _session.sample_log = SampleLog(sample_log, boundary.generation, boundary.rank)
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_leave_process_group)
    boundary.announce()
    return progress


def step_done(state: Progress, loss: float | torch.Tensor | None = None) -> None:
    """One optimizer step is complete on this rank: advance, agree, and act (module doc).

    Every rank calls it after every step, with the state :func:`restore` returned; ``loss``
    (this rank's, optional) is reported to the daemon from rank 0.
    """
    boundary, sampler = _session.boundary, _session.sampler
    if boundary is None or state is not boundary.progress:
        raise RuntimeError("elastic.step_done() needs the state that elastic.restore() returned")
    if sampler is None:
        raise RuntimeError("elastic.step_done() needs an elastic.BatchSampler in the DataLoader")
    world = boundary.world_size
    size = sampler.step_size(state.offset, world)
    trained = sampler.take_trained()
    if trained is not None and trained != sampler.expected(state.data, world, boundary.rank):
        # One DataLoader batch per step is the contract: anything else would silently train
        # on other samples than the checkpoint will say.
        raise RuntimeError(
            f"elastic.step_done(): the DataLoader's batch is not step {state.step}'s; "
            "call step_done() once per batch of the elastic.BatchSampler's DataLoader"
        )
    if _session.sample_log is not None and trained is not None:
        _session.sample_log.write(
            step=state.step, epoch=state.epoch, world=world, nodes=boundary.nodes, indices=trained
        )
    state.step += 1
    state.data = sampler.sampler.advance(state.data, size)
    boundary.report(
        size,
        samples_per_epoch=sampler.num_samples,
        global_batch=sampler.global_batch,
        total_steps=None,  # the script's epoch count is its own: the daemon fits the curve
        loss=float(loss) if loss is not None else None,
    )
    hold, term, ckpt = boundary.agree()
    boundary.act(hold=hold, term=term, ckpt=ckpt)


def _leave_process_group() -> None:
    # torch elastic stops the workers with killpg(SIGTERM) when it re-forms the group (a
    # grow).  The rank finishes its step and saves on that signal, but a DataLoader worker
    # forked from it dies of it (torch's worker handler re-raises a SIGTERM not sent by its
    # parent), and the rank's SIGCHLD handler then fails the training loop before the step
    # boundary.  So forked children leave the rank's process group; a DataLoader worker
    # still ends with its rank (torch's watchdog of the parent process).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _at_exit() -> None:
    # The script ended: a clean end is the end of training (the launcher reads done.json);
    # after an unhandled exception the last checkpoint stands and nothing more is written.
    boundary = _session.boundary
    if boundary is None or getattr(sys, "last_value", None) is not None:
        return
    boundary.finish()


single_process_defaults(os.environ)
