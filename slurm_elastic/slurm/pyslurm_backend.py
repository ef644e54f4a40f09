"""Optional backend that uses pyslurm's in-process RPCs where they are a drop-in.

Chosen only by :func:`slurm_elastic.slurm.select.make_backend` when ``pyslurm``
imports and its version matches the running Slurm (pyslurm X.Y.* is built for
Slurm X.Y).  PyPI only has pyslurm 25.11, which cannot build against Debian's
22.05, so this module is never imported in CI; nothing imports it at package
import time.

Scope, on purpose: signals and cancellation go through pyslurm's
``Job(id).send_signal(sig, steps=...)`` / ``Job(id).cancel()`` (no process
spawn on the daemon's most latency-sensitive path: "tell the job first").
Everything else -- the batched reads, size changes, submission -- stays on the
CLI backend's parsers and commands, which every test exercises against the real
cluster; pyslurm's object model differs between its releases, and a second,
untestable translation of every field would be a liability.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import structlog

from slurm_elastic.errors import SlurmRejected
from slurm_elastic.slurm.cli import CliBackend

log = structlog.get_logger(__name__)


class PyslurmBackend(CliBackend):
    def __init__(self, pyslurm: ModuleType, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pyslurm = pyslurm

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        if self.runner.dry_run:
            super().signal(job_id, signal, batch_only=batch_only)
            return
        name = signal.strip().upper()
        if not name.startswith("SIG") and not name.isdigit():
            name = "SIG" + name
        # pyslurm: steps="batch" = the batch shell only; "children" = every step but it,
        # the same split as `scancel --batch` vs plain `scancel --signal`.
        steps = "batch" if batch_only else "children"
        try:
            self._pyslurm.Job(job_id).send_signal(name, steps=steps)
        except self._pyslurm.RPCError as exc:
            raise SlurmRejected(
                f"signal {name} to job {job_id} rejected: {exc}", slurm_message=str(exc)
            ) from exc
        log.info("slurm.signal", job_id=job_id, signal=name, batch_only=batch_only, via="pyslurm")

    def cancel(self, job_id: int) -> None:
        if self.runner.dry_run:
            super().cancel(job_id)
            return
        try:
            self._pyslurm.Job(job_id).cancel()
        except self._pyslurm.RPCError as exc:
            raise SlurmRejected(
                f"cancel job {job_id} rejected: {exc}", slurm_message=str(exc)
            ) from exc
        log.info("slurm.cancel", job_id=job_id, via="pyslurm")
