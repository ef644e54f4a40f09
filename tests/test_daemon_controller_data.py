"""Small hand-written snapshots for the controller/actuation unit tests (data, not Slurm).

Field values follow what the CLI backend parses from real squeue/sinfo output
(/work/shared/slurm-samples/squeue-2jobs.json: job 18, ``elastic:min=1,max=4``, n[1-2]).
"""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.types import (
    ClusterSnapshot,
    JobState,
    JobView,
    NodeView,
    PartitionView,
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
