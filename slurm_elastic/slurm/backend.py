"""The interface every Slurm backend implements.

Three implementations exist:

* ``slurm.cli.CliBackend`` — the default; runs Slurm's own client commands
  (``squeue --json``, ``sinfo --json``, ``scontrol``, ``sacct``, ``sbatch``,
  ``scancel``) with timeouts and typed errors.  Every test exercises it.
* ``slurm.pyslurm_backend`` — optional, chosen only when a ``pyslurm`` built for
  the running Slurm's release imports: the batched reads, signals and cancels as
  in-process RPCs, the rest through the CLI backend it extends.
* ``sim.backend.SimBackend`` — the simulator's in-memory cluster; used only by
  the simulator and by pure decision-logic tests.

Reads are batched: one call returns every job (or node, or partition), never
one call per job.  Actions raise ``errors.SlurmError`` subclasses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from slurm_elastic.types import (
    Capabilities,
    ClusterSnapshot,
    JobHistory,
    JobView,
    NodeView,
    PartitionView,
)


@runtime_checkable
class SlurmBackend(Protocol):
    # ---------------------------------------------------------------- reads
    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        """Jobs + nodes + partitions in a fixed number of calls, whatever the job count."""
        ...

    def read_jobs(self) -> tuple[JobView, ...]: ...

    def read_nodes(self) -> tuple[NodeView, ...]: ...

    def read_partitions(self) -> tuple[PartitionView, ...]: ...

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        """Accounting records of jobs active in [since, until], resize records collapsed."""
        ...

    def read_qos_node_limits(self) -> Mapping[str, int]:
        """QOS name -> the most nodes one job of that QOS may hold (``MaxTRESPerJob``
        ``node=``), for the QOS that set one."""
        ...

    def read_assoc_node_limits(self) -> Mapping[tuple[str, str, str], int]:
        """(account, user, partition) -> the most nodes one job of that user association
        may hold (``MaxNodes``, inherited from its accounts), for the associations of this
        cluster that have one; partition "" = the association of every partition."""
        ...

    def probe(self) -> Capabilities: ...

    # ---------------------------------------------------------------- actions
    def pin_pending_size(self, job_id: int, nodes: int) -> None:
        """Pending job: ``NumNodes=n-n`` so it starts at exactly ``nodes``."""
        ...

    def shrink(self, job_id: int, nodes: int) -> None:
        """Running job: ``NumNodes=n`` (Slurm keeps the first n nodes, incl. the batch host)."""
        ...

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        """``scancel --signal=SIG [--batch]``: batch shell only, or every step task."""
        ...

    def set_admin_comment(self, job_id: int, text: str) -> None: ...

    def requeue(self, job_id: int) -> None: ...

    def cancel(self, job_id: int) -> None: ...

    def reconfigure(self) -> None:
        """``scontrol reconfigure``: slurmctld re-reads its configuration.

        The daemon calls it only to work around a Slurm version quirk
        (``Capabilities.leaks_nodes_after_shrink``, described in ``slurm.cli``).
        """
        ...

    def submit(
        self,
        script: str,
        *,
        user: str,
        nodes: int,
        partition: str,
        account: str | None = None,
        qos: str | None = None,
        name: str | None = None,
        comment: str | None = None,
        work_dir: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> int:
        """Submit ``script`` as ``user`` (never as root for user code); returns the job id."""
        ...
