"""``SimBackend``: the simulated cluster behind the ``SlurmBackend`` protocol.

The daemon's Controller reads and acts through this exactly as through the CLI backend:
one batched ``read_cluster`` per cycle, and Slurm-like actions with Slurm's own refusals
(``SlurmRejected`` with Slurm's message) when an action is not possible.  Jobs appear as
Slurm shows them: an elastic job carries its marker in the comment and was submitted at
its requested size (``-N req``); a pinned pending job shows ``NumNodes=n-n``; a companion
carries ``slurm-elastic:companion-of=<PARENT>``.  A job submitted to several partitions
shows them as squeue does, comma-separated in its order while pending ("t4,a100") and the
one it runs in once started; a node shows its partition's GPU type (``NodeView.gpu_type``),
as the gres of a typed node does (``gpu:a100:8``).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Collection
from operator import getitem
from typing import NamedTuple

from slurm_elastic.errors import SlurmRejected
from slurm_elastic.marker import companion_parent, format_marker
from slurm_elastic.sim.engine import Cluster, SimJob
from slurm_elastic.slurm.backend import check_own_partitions
from slurm_elastic.types import (
    Allocation,
    Capabilities,
    ClusterSnapshot,
    ElasticSpec,
    JobHistory,
    JobState,
    JobView,
    NodeView,
    PartitionView,
)

SIM_ACCOUNT = "sim"
SIM_WORK_DIR = "/sim"
CPUS_PER_NODE = 4  # as the local test cluster's nodes; the daemon does not size by CPUs


# Pure, and asked for every view and accounting record of every elastic job: formatted once
# per distinct range.
@functools.lru_cache(maxsize=1024)
def elastic_comment(min_nodes: int, max_nodes: int, step: int) -> str:
    """The elastic marker a user would put in ``--comment`` (see ``slurm_elastic.marker``)."""
    return format_marker(ElasticSpec(min_nodes=min_nodes, max_nodes=max_nodes, step=step))


class _Shown(NamedTuple):
    """A job's view and the changing fields of the job it was built from."""

    state: JobState
    nodes: list[int]  # a copy
    request: int
    admin_comment: str
    start: float | None
    partitions: tuple[str, ...]  # the job's tuple itself: a placement replaces it
    view: JobView


class SimBackend:
    """Implements ``slurm_elastic.slurm.backend.SlurmBackend`` over a :class:`Cluster`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.calls = 0
        self._nodes_cache: tuple[NodeView, ...] | None = None
        self._nodes_owner: list[int] | None = None
        self._node_views: list[tuple[NodeView, ...]] | None = None
        # Job views by id with the state they show: rebuilt only when that state changed.
        self._views: dict[int, _Shown] = {}
        self._partitions = tuple(
            PartitionView(
                name=p.name,
                nodes=tuple(
                    n
                    for n, part in zip(cluster.node_names, cluster.node_partition, strict=True)
                    if part == p.name
                ),
                is_default=i == 0,
                exclusive=True,
                state="UP",
            )
            for i, p in enumerate(cluster.spec.partitions)
        )

    # ---------------------------------------------------------------- reads
    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        self.calls += 1
        return ClusterSnapshot(
            taken_at=self.cluster.now if now is None else now,
            jobs=self.read_jobs(),
            nodes=self.read_nodes(),
            partitions=self._partitions,
            slurm_calls=3,
        )

    def read_jobs(self) -> tuple[JobView, ...]:
        views: dict[int, _Shown] = {}
        for job in self.cluster.active.values():
            shown = self._views.get(job.job_id)
            # Field by field, without building a key per job per read (half the read's cost).
            if (
                shown is None
                or shown.state is not job.state
                or shown.request != job.request
                or shown.start != job.start
                or shown.admin_comment != job.admin_comment
                or shown.nodes != job.nodes
                or shown.partitions is not job.partitions
            ):
                shown = _Shown(
                    job.state,
                    list(job.nodes),
                    job.request,
                    job.admin_comment,
                    job.start,
                    job.partitions,
                    self._job_view(job),
                )
            views[job.job_id] = shown
        self._views = views  # ended jobs drop out
        return tuple(shown.view for shown in views.values())

    @staticmethod
    def _comment(job: SimJob) -> str:
        if job.spec is not None and job.spec.elastic:
            return elastic_comment(job.spec.min_nodes, job.spec.max_nodes, job.spec.step)
        return job.comment

    def _job_view(self, job: SimJob) -> JobView:
        c = self.cluster
        running = job.state is JobState.RUNNING
        names = tuple(c.node_names[n] for n in job.nodes)
        comment = self._comment(job)
        return JobView(
            job_id=job.job_id,
            name=job.name,
            user=job.user,
            user_id=1000,
            account=SIM_ACCOUNT,
            partition=job.partition if running else ",".join(job.partitions),
            qos="normal",
            state=job.state,
            state_reason="None" if running else "Resources",
            node_count=len(job.nodes) if running else job.request,
            min_nodes=len(job.nodes) if running else job.request,
            max_nodes=None if running else job.request,
            nodes=names,
            batch_host=names[0] if names else None,
            comment=comment,
            admin_comment=job.admin_comment,
            submit_time=job.submit,
            start_time=job.start,
            time_limit_s=None,
            gpus_per_node=c.spec.gpus_per_node,
            work_dir=SIM_WORK_DIR,
        )

    def read_nodes(self) -> tuple[NodeView, ...]:
        c = self.cluster
        if self._nodes_cache is not None and self._nodes_owner == c.owner:
            return self._nodes_cache
        if self._node_views is None:
            # A node shows one of two views (idle, allocated): built once, picked per read.
            g = c.spec.gpus_per_node
            self._node_views = [
                tuple(
                    NodeView(
                        name=name,
                        state="allocated" if busy else "idle",
                        flags=(),
                        cpus=CPUS_PER_NODE,
                        alloc_cpus=CPUS_PER_NODE if busy else 0,
                        gpus=g,
                        alloc_gpus=g if busy else 0,
                        partitions=(part,),
                        gpu_type=c.gpu_type[part],
                    )
                    for busy in (False, True)
                )
                for name, part in zip(c.node_names, c.node_partition, strict=True)
            ]
        # Each node's (idle, allocated) view, picked by whether it has an owner (0: none).
        self._nodes_cache = tuple(map(getitem, self._node_views, map(bool, c.owner)))
        self._nodes_owner = list(c.owner)
        return self._nodes_cache

    def read_partitions(self) -> tuple[PartitionView, ...]:
        return self._partitions

    def read_qos_node_limits(self) -> dict[str, int]:
        return {}  # the simulated cluster has no QOS limits

    def read_assoc_node_limits(self) -> dict[tuple[str, str, str], int]:
        return {}  # nor association limits

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        """Finished jobs that were active in [since, until] (ends are appended in order)."""
        done = self.cluster.finished
        first = bisect.bisect_left(done, since, key=lambda j: j.end or 0.0)
        out = []
        for job in done[first:]:
            if until is not None and job.submit > until:
                continue
            out.append(self._history(job))
        return tuple(out)

    def _history(self, job: SimJob) -> JobHistory:
        names = self.cluster.node_names
        return JobHistory(
            job_id=job.job_id,
            name=job.name,
            user=job.user,
            account=SIM_ACCOUNT,
            partition=job.partition,
            state=job.state,
            submit_time=job.submit,
            start_time=job.start,
            end_time=job.end,
            comment=self._comment(job),
            allocations=tuple(
                Allocation(
                    start=p.start,
                    end=p.end,
                    node_count=len(p.nodes),
                    nodes=tuple(names[n] for n in p.nodes),
                )
                for p in job.periods
            ),
            work_dir=SIM_WORK_DIR,
        )

    def probe(self) -> Capabilities:
        return Capabilities(version="22.05.8-sim", json_plugin=None, permit_job_expansion=False)

    # ---------------------------------------------------------------- actions
    def pin_pending_size(
        self,
        job_id: int,
        nodes: int,
        partition: str | None = None,
        submitted: Collection[str] = (),
    ) -> None:
        # Only to the job's own partitions, as the CLI backend.
        if partition is not None:
            check_own_partitions(
                job_id, partition, self.cluster.get_active(job_id).partitions, submitted
            )
        self.cluster.pin(job_id, nodes, partition)

    def shrink(self, job_id: int, nodes: int) -> None:
        self.cluster.shrink(job_id, nodes)

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        # Signals reach the simulated job; shrink instructions travel through the
        # instruction board (see sim.runner), so a signal changes nothing here.
        self.cluster.get_active(job_id)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self.cluster.get_active(job_id).admin_comment = text

    def requeue(self, job_id: int) -> None:
        raise SlurmRejected(
            f"job {job_id}: requeue is not simulated",
            slurm_message="Requeue of the simulated cluster is disabled",
        )

    def cancel(self, job_id: int) -> None:
        self.cluster.cancel(job_id)

    def reconfigure(self) -> None:
        """No-op: the simulated scheduler has no configuration to re-read and no node leak
        after a shrink to clear (``probe`` does not report Slurm 22.05's, so the daemon's
        default ``reconfigure_after_shrink: auto`` never calls this)."""

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
        parent = companion_parent(comment or "")
        owner = self.cluster.active.get(parent) if parent is not None else None
        if owner is None or owner.user != user or owner.is_companion:
            # Trace jobs arrive by themselves; the only job anyone submits into the
            # simulation is a companion of a live job of the same user.
            raise SlurmRejected(
                f"simulated sbatch accepts only companions of live jobs, got comment {comment!r}",
                slurm_message="Invalid job specification",
            )
        return self.cluster.submit(
            user=user,
            nodes=nodes,
            partition=partition,
            name=name or "sbatch",
            comment=comment or "",
            parent=parent,
        )
