"""Small hand-written snapshots for the controller/actuation unit tests (data, not Slurm).

Field values follow what the CLI backend parses from real squeue/sinfo output
(/work/shared/slurm-samples/squeue-2jobs.json: job 18, ``elastic:min=1,max=4``, n[1-2]).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from slurm_elastic.errors import SlurmRejected, SlurmUnreachable
from slurm_elastic.policy.fixed import fixed_plan
from slurm_elastic.types import (
    AllocationProblem,
    Capabilities,
    ClusterSnapshot,
    JobState,
    JobView,
    NodeView,
    PartitionView,
    Plan,
)

NODES = ("n1", "n2", "n3", "n4")


def job(
    job_id: int,
    *,
    state: JobState = JobState.RUNNING,
    nodes: tuple[str, ...] = (),
    lo: int = 1,
    hi: int | None = 4,
    comment: str | None = None,
    user: str = "root",
    start: float | None = 0.0,
    **kw: object,
) -> JobView:
    running = state is JobState.RUNNING
    count = len(nodes) if running else lo
    if comment is None:
        # Slurm reports a running job's allocation, not its range: the marker carries it.
        comment = f"elastic:min={lo},max={hi}" if running else "elastic"
    return JobView(
        job_id=job_id,
        name=f"j{job_id}",
        user=user,
        user_id=0,
        account="root",
        partition="batch",
        qos="normal",
        state=state,
        state_reason="None" if running else "Resources",
        node_count=count,
        min_nodes=count if running else lo,
        max_nodes=None if running else hi,
        nodes=nodes,
        batch_host=nodes[0] if nodes else None,
        comment=comment,
        submit_time=0.0,
        start_time=start if running else None,
        work_dir="/tmp",
        **kw,  # type: ignore[arg-type]
    )


def snapshot(jobs: list[JobView], taken_at: float = 1000.0, calls: int = 3) -> ClusterSnapshot:
    used = {n for j in jobs if j.state is JobState.RUNNING for n in j.nodes}
    nodes = tuple(
        NodeView(
            name=n,
            state="allocated" if n in used else "idle",
            flags=(),
            cpus=4,
            alloc_cpus=4 if n in used else 0,
            gpus=4,
            alloc_gpus=0,
            partitions=("batch",),
        )
        for n in NODES
    )
    part = PartitionView(name="batch", nodes=NODES, is_default=True, exclusive=True, state="UP")
    return ClusterSnapshot(
        taken_at=taken_at, jobs=tuple(jobs), nodes=nodes, partitions=(part,), slurm_calls=calls
    )


def pending(job_id: int, lo: int = 1, hi: int = 4, **kw: object) -> JobView:
    return job(job_id, state=JobState.PENDING, lo=lo, hi=hi, **kw)


def with_state(view: JobView, state: JobState) -> JobView:
    return replace(view, state=state)


@dataclass
class RecordingBackend:
    """Hands out prepared snapshots and records every action call."""

    snap: ClusterSnapshot
    calls: list[tuple[str, object]] = field(default_factory=list)
    fail_reads: bool = False
    fail_history: bool = False
    fresh: bool = False
    next_job_id: int = 500
    leaks: bool = True  # probe: the Slurm 22.05 node leak after a shrink
    fail_probe: bool = False
    refuse_reconfigure: bool = False
    qos_nodes: dict[str, int] = field(default_factory=dict)  # per-job node limits of QOS
    # (account, user, partition) -> an association's per-job node limit
    assoc_nodes: dict[tuple[str, str, str], int] = field(default_factory=dict)
    fail_limits: bool = False  # sacctmgr fails

    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        if self.fail_reads:
            raise SlurmUnreachable("squeue: Unable to contact slurm controller")
        if self.fresh and now is not None:
            return replace(self.snap, taken_at=now)  # read now, as the CLI backend does
        return self.snap

    def read_history(self, since: float, until: float | None = None) -> tuple[()]:
        self.calls.append(("read_history", since))
        if self.fail_history:
            raise SlurmUnreachable("sacct: error: Problem talking to the database")
        return ()

    def read_qos_node_limits(self) -> dict[str, int]:
        self.calls.append(("read_qos", None))
        if self.fail_limits:
            raise SlurmUnreachable("sacctmgr: error: Problem talking to the database")
        return dict(self.qos_nodes)

    def read_assoc_node_limits(self) -> dict[tuple[str, str, str], int]:
        self.calls.append(("read_assoc", None))
        if self.fail_limits:
            raise SlurmUnreachable("sacctmgr: error: Problem talking to the database")
        return dict(self.assoc_nodes)

    def pin_pending_size(self, job_id: int, nodes: int) -> None:
        self.calls.append(("pin", (job_id, nodes)))

    def shrink(self, job_id: int, nodes: int) -> None:
        self.calls.append(("shrink", (job_id, nodes)))

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))

    def probe(self) -> Capabilities:
        self.calls.append(("probe", None))
        if self.fail_probe:
            raise SlurmUnreachable("scontrol: Unable to contact slurm controller")
        return Capabilities("22.05.8", "openapi/v0.0.38", False, True, self.leaks)

    def reconfigure(self) -> None:
        self.calls.append(("reconfigure", None))
        if self.refuse_reconfigure:
            raise SlurmRejected(
                "scontrol reconfigure rejected: Access/permission denied",
                slurm_message="Access/permission denied",
            )

    def submit(self, script: str, **kw: object) -> int:
        self.next_job_id += 1
        self.calls.append(("submit", kw))
        return self.next_job_id

    def actions(self) -> list[tuple[str, object]]:
        return [
            c for c in self.calls if c[0] not in ("read_history", "read_qos", "read_assoc", "probe")
        ]


def targets(mapping: dict[int, int]) -> Callable[[AllocationProblem, str], Plan]:
    """A fixed plan: the listed jobs go to the given size, every other keeps its own."""

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        return fixed_plan(problem, mapping, solver="test-plan")

    return allocate


def spying(seen: list[AllocationProblem]) -> Callable[[AllocationProblem, str], Plan]:
    """The daemon's own policy, keeping every problem it is given."""
    from slurm_elastic.daemon.controller import _policy_allocate

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        seen.append(problem)
        return _policy_allocate(problem, policy)

    return allocate
