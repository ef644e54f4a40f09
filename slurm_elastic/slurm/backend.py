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
one call per job.

Errors (the contract every implementation keeps; nothing else escapes a method):

* every method: ``SlurmUnreachable`` (slurmctld/slurmdbd down, a command missing),
  ``SlurmTimeout`` (a command ran past its timeout), ``SlurmRejected`` (Slurm said no;
  ``slurm_message`` is its text);
* reads also: ``SlurmParseError`` (output that could not be understood; nothing of it is
  returned);
* actions also: ``ActionRefused`` (an invalid request, refused before anything is sent).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from slurm_elastic.errors import ActionRefused
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
    """What the daemon asks of Slurm: batched reads and single-job actions.

    Raises (every method, see the module docstring): ``SlurmError`` subclasses only.
    """

    # ---------------------------------------------------------------- reads
    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        """Jobs + nodes + partitions in a fixed number of calls, whatever the job count.

        ``now`` stamps the snapshot (``taken_at``); None: the clock at the read.

        Raises:
            SlurmUnreachable, SlurmTimeout, SlurmRejected: a read failed (no snapshot).
            SlurmParseError: an answer could not be understood (no snapshot).
        """
        ...

    def read_jobs(self) -> tuple[JobView, ...]:
        """Every job Slurm knows, in one call.  Raises: as ``read_cluster``."""
        ...

    def read_nodes(self) -> tuple[NodeView, ...]:
        """Every node, in one call.  Raises: as ``read_cluster``."""
        ...

    def read_partitions(self) -> tuple[PartitionView, ...]:
        """Every partition, in one call.  Raises: as ``read_cluster``."""
        ...

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        """Accounting records of jobs active in [since, until], resize records collapsed.

        Raises:
            SlurmUnreachable, SlurmTimeout, SlurmRejected: sacct failed (slurmdbd down).
            SlurmParseError: its output could not be understood.
        """
        ...

    def read_qos_node_limits(self) -> Mapping[str, int]:
        """QOS name -> the most nodes one job of that QOS may hold (``MaxTRESPerJob``
        ``node=``), for the QOS that set one.

        Raises:
            SlurmError: sacctmgr failed or answered what could not be read.
        """
        ...

    def read_assoc_node_limits(self) -> Mapping[tuple[str, str, str], int]:
        """(account, user, partition) -> the most nodes one job of that user association
        may hold (``MaxNodes``, inherited from its accounts), for the associations of this
        cluster that have one; partition "" = the association of every partition.

        Raises:
            SlurmError: sacctmgr failed or answered what could not be read.
        """
        ...

    def probe(self) -> Capabilities:
        """The running Slurm's version and what it can do (JSON output, its quirks).

        Raises:
            SlurmError: Slurm could not be asked; the caller asks again later.
        """
        ...

    # ---------------------------------------------------------------- actions
    def pin_pending_size(
        self,
        job_id: int,
        nodes: int,
        partition: str | None = None,
        submitted: Collection[str] = (),
    ) -> None:
        """Pending job: ``NumNodes=n-n`` so it starts at exactly ``nodes``; with
        ``partition``, also ``Partition=P`` in the same update, so that a job submitted to
        several partitions (``-p a100,t4``) starts in that one.  ``partition`` may list
        several (``a100,t4``: a job the daemon narrowed given its list back).  Slurm lets
        root set any partition, one the user never asked for too: each named must be one of
        the job's own, as Slurm shows them now (``JobView.partitions``) or as it was
        submitted (``submitted``: the list the daemon journalled when it narrowed it).

        Raises:
            ActionRefused: ``nodes`` < 1, the job is not pending, or ``partition`` names one
                that is not the job's own (nothing sent).
            SlurmRejected: Slurm refused the update.
            SlurmUnreachable, SlurmTimeout: it may or may not have been applied.
        """
        ...

    def shrink(self, job_id: int, nodes: int) -> None:
        """Running job: ``NumNodes=n`` (Slurm keeps the first n nodes, incl. the batch host).

        Raises:
            ActionRefused: ``nodes`` < 1, or the job is not running (nothing sent).
            SlurmRejected: Slurm refused the update.
            SlurmUnreachable, SlurmTimeout: it may or may not have been applied.
        """
        ...

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        """``scancel --signal=SIG [--batch]``: batch shell only, or every step task.

        Raises:
            ActionRefused: not a signal name (nothing sent).
            SlurmRejected, SlurmUnreachable, SlurmTimeout: as ``shrink``.
        """
        ...

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """``AdminComment=text`` (one line), which ``squeue``/``scontrol`` show.

        Raises:
            ActionRefused: ``text`` is more than one line (nothing sent).
            SlurmRejected, SlurmUnreachable, SlurmTimeout: as ``shrink``.
        """
        ...

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: the job goes back to the queue.

        Raises:
            SlurmRejected, SlurmUnreachable, SlurmTimeout: as ``shrink``.
        """
        ...

    def cancel(self, job_id: int) -> None:
        """``scancel``: the job ends.

        Raises:
            SlurmRejected, SlurmUnreachable, SlurmTimeout: as ``shrink``.
        """
        ...

    def reconfigure(self) -> None:
        """``scontrol reconfigure``: slurmctld re-reads its configuration.

        The daemon calls it only to work around a Slurm version quirk
        (``Capabilities.leaks_nodes_after_shrink``, described in ``slurm.cli``).

        Raises:
            SlurmRejected: not allowed (the daemon does not run as SlurmUser or root).
            SlurmUnreachable, SlurmTimeout: slurmctld did not answer.
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
        """Submit ``script`` as ``user`` (never as root for user code); returns the job id.

        Raises:
            ActionRefused: no ``#!`` line, an unknown user, a bad count, or another user's
                job from a non-root daemon (nothing sent).
            SlurmRejected: sbatch refused the job (limits, partition, account).
            SlurmParseError: sbatch printed no job id.
            SlurmUnreachable, SlurmTimeout: the job may or may not exist.
        """
        ...


def check_own_partitions(
    job_id: int, named: str, own: Collection[str], submitted: Collection[str] = ()
) -> None:
    """``pin_pending_size``'s rule for ``Partition=``: every partition ``named`` (one, or
    several comma-separated) is one of the job's ``own`` (as Slurm shows them now) or of
    those it was ``submitted`` to.  Slurm would let root set any, so a backend checks this
    before it sends anything.

    Raises:
        ActionRefused: one named is neither.
    """
    allowed = set(own) | set(submitted)
    for name in named.split(","):
        if name not in allowed:
            raise ActionRefused(
                f"cannot start job {job_id} in partition {name!r}: it asked for "
                f"{','.join(submitted or own)!r}, and a placement only narrows a job to its "
                "own partitions"
            )
