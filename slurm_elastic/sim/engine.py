"""The event-driven cluster: jobs, nodes, FIFO + EASY backfill, progress and resizes.

Everything that happens is an event at a simulated time: arrivals, completions, the end
of a shrink checkpoint (the job's acknowledgement) and control cycles.  Between events
each running job progresses linearly at its profile's rate for its current world size;
after every resize it pays its resize cost (checkpoint + restart) with no progress.

Elastic decisions are not made here: a *driver* (``sim.runner.ControllerDriver``, the
daemon's own Controller) is called at control cycles and acts through
``sim.backend.SimBackend``, which calls the mutators below exactly as Slurm would
apply ``scontrol``/``sbatch``/``scancel``.  With no driver the cluster is plain Slurm.

**GPU types.**  A partition may have a GPU type (``PartitionSpec.gpu_type``, from
``simulate --cluster t4:16x4,a100:8x8``); untyped partitions behave as they always did.  A
node is one allocation slot of ``ClusterSpec.gpus_per_node`` GPUs in every partition (the
unit of ``sim.workload``), so a job's size means the same GPUs wherever it starts.  A
running job progresses at the speed of its partition's type (``JobSpec.rate_at``), and a
job submitted to several partitions waits in all of them and starts in the first where it
can start now (``scheduler.first_fit_easy_backfill``); until it starts it shows all of
them, as squeue does, and from then on the one it runs in (``SimJob.partition``).

Control cycles run on the daemon's interval grid, but only when something happened
since the last cycle (an arrival, an end, a start, an acknowledgement, or an action
taken by the previous cycle) or when ``refresh_s`` has passed while elastic jobs run:
a cycle over an unchanged cluster that took no action would repeat itself.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from slurm_elastic.errors import ActionRefused, SlurmRejected
from slurm_elastic.sim.scheduler import (
    Candidate,
    Holding,
    Waiting,
    fifo_easy_backfill,
    first_fit_easy_backfill,
    read_by_backfill,
    read_by_first_fit,
)
from slurm_elastic.sim.workload import JobSpec
from slurm_elastic.types import JobState

# Event kinds, ordered: at equal times ends are handled before arrivals (nodes freed
# at t are usable at t), acknowledgements before the control cycle that reads them.
EV_END, EV_ARRIVE, EV_ACK, EV_CYCLE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One simulated partition: its name, node count (allocation slots of the cluster's
    ``gpus_per_node`` GPUs) and the type of its GPUs ("": untyped, every job at its
    profile's speed)."""

    name: str
    nodes: int
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The simulated cluster: its partitions (the first is the default) and GPUs per node."""

    partitions: tuple[PartitionSpec, ...]
    gpus_per_node: int = 1

    @property
    def total_nodes(self) -> int:
        return sum(p.nodes for p in self.partitions)

    @property
    def default_partition(self) -> str:
        return self.partitions[0].name

    @property
    def gpu_types(self) -> dict[str, str]:
        """Partition -> GPU type ("" where untyped), in the partitions' order."""
        return {p.name: p.gpu_type for p in self.partitions}

    @property
    def typed(self) -> bool:
        return any(p.gpu_type for p in self.partitions)


@dataclass(slots=True)
class Period:
    """One stretch of a job at one size (becomes a sacct-like Allocation)."""

    start: float
    end: float | None
    nodes: tuple[int, ...]


@dataclass(slots=True)
class SimJob:
    """One job in the simulated cluster (a trace job or a companion), with its history."""

    job_id: int
    spec: JobSpec | None  # None for companion jobs
    name: str
    user: str
    partition: str  # where it runs once started; while pending, the first it may start in
    comment: str
    submit: float
    request: int  # nodes asked for (pending) — changed by pin_pending_size
    state: JobState = JobState.PENDING
    parent: int | None = None  # companion: the job it grows
    companions: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # own allocation, batch host first
    start: float | None = None
    end: float | None = None
    done: float = 0.0  # steps
    last: float = 0.0  # progress accounted up to here
    paused_until: float = 0.0  # restarting / holding a checkpoint until then (inf: hold)
    held_since: float | None = None  # start of the current checkpoint hold
    pauses: list[tuple[float, float]] = field(default_factory=list)  # no-progress intervals
    world: int = 0  # nodes training together (own + joined companions)
    version: int = 0  # invalidates stale end events
    resizes: int = 0
    resized_at: float = -math.inf
    node_seconds: float = 0.0
    periods: list[Period] = field(default_factory=list)
    admin_comment: str = ""
    # Every partition it may start in, in its order (``-p t4,a100``); narrowed to one by a
    # placement (``Cluster.pin``).  Left empty, it is ``(partition,)``.
    partitions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.partitions:
            self.partitions = (self.partition,)

    @property
    def is_companion(self) -> bool:
        return self.parent is not None


class Driver(Protocol):
    """What drives elastic jobs at control cycles (the daemon's Controller, in the sim)."""

    def cycle(self, now: float) -> None: ...

    def acknowledge(self, job_id: int, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """Busy nodes and queued trace jobs at one moment (the utilisation timeline)."""

    time: float
    busy_nodes: int
    queued: int


class Cluster:
    """State + Slurm-like mutators.  Not thread-safe; one simulation per instance."""

    def __init__(self, spec: ClusterSpec, jobs: tuple[JobSpec, ...]) -> None:
        self.spec = spec
        self.now = 0.0
        self.jobs: dict[int, SimJob] = {}
        self.node_names: list[str] = []
        self.node_partition: list[str] = []
        self.owner: list[int] = []  # job id per node, 0 = idle
        self.free: dict[str, list[int]] = {}
        for part in spec.partitions:
            ids = list(range(len(self.node_names), len(self.node_names) + part.nodes))
            self.free[part.name] = ids
            self.node_names.extend(f"{part.name}-n{i + 1}" for i in range(part.nodes))
            self.node_partition.extend([part.name] * part.nodes)
            self.owner.extend([0] * part.nodes)
        self.specs = jobs
        self.active: dict[int, SimJob] = {}  # pending + running, insertion = submit order
        # The same jobs by state, for the passes at every event that read one state only
        # (a busy cluster has thousands pending and tens running): pending in submit order,
        # running in start order.
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.finished: list[SimJob] = []
        self.next_id = (max((j.sim_id for j in jobs), default=0)) + 1
        self.changed = True  # something happened since the last control cycle
        self.actions = 0  # mutations applied through the backend (resizes, pins, submits)
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.on_hold: Callable[[SimJob], None] | None = None
        self.gpu_type = spec.gpu_types  # partition -> its GPUs' type ("" untyped)
        # Jobs listing several partitions need the pass over all partitions at once; a
        # workload without any keeps the per-partition pass (and its exact decisions).
        self.first_fit = any(len(j.partitions) > 1 for j in jobs)
        # Speed per (job, nodes, GPU type): the profile interpolation is asked for the same
        # few sizes of each job at every event (ends, backfill reservations, reports).
        self._rates: dict[tuple[int, int, str], float] = {}

    # ------------------------------------------------------------ event queue
    def push(self, time: float, kind: int, job_id: int = 0, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time, kind, self._seq, job_id, version))

    # ------------------------------------------------------------ progress
    def rate(self, job: SimJob) -> float:
        """Steps/s of a running job: its world size, on its partition's GPUs."""
        assert job.spec is not None
        if not job.world:
            return 0.0
        return self._rate_at(job.spec, job.world, self.gpu_type[job.partition])

    def _rate_at(self, spec: JobSpec, nodes: int, gpu_type: str) -> float:
        key = (spec.sim_id, nodes, gpu_type)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = spec.rate_at(nodes, gpu_type)
        return rate

    def advance(self, job: SimJob, t: float) -> None:
        """Account progress up to ``t`` at the current world size."""
        if job.spec is None or job.state is not JobState.RUNNING:
            return
        begin = max(job.last, job.paused_until)
        if t > begin:
            job.done = min(job.spec.work, job.done + self.rate(job) * (t - begin))
        job.last = max(job.last, t)

    def expected_end(self, job: SimJob) -> float:
        if job.parent is not None:
            return self.expected_end(self.jobs[job.parent])
        assert job.spec is not None
        if job.state is JobState.PENDING:
            return math.inf
        if math.isinf(job.paused_until):
            return math.inf
        remaining = max(0.0, job.spec.work - job.done)
        return max(job.last, job.paused_until) + remaining / self.rate(job)

    def _reschedule(self, job: SimJob) -> None:
        job.version += 1
        end = self.expected_end(job)
        if math.isfinite(end):
            self.push(end, EV_END, job.job_id, job.version)

    # ------------------------------------------------------------ allocation
    def _take(self, job: SimJob, count: int) -> None:
        pool = self.free[job.partition]
        pool.sort()
        taken, self.free[job.partition] = pool[:count], pool[count:]
        for n in taken:
            self.owner[n] = job.job_id
        job.nodes.extend(taken)

    def _release(self, job: SimJob, nodes: list[int]) -> None:
        gone = set(nodes)
        for n in gone:
            self.owner[n] = 0
        self.free[job.partition].extend(nodes)
        job.nodes = [n for n in job.nodes if n not in gone]

    def _close_period(self, job: SimJob, t: float) -> None:
        if job.periods and job.periods[-1].end is None:
            p = job.periods[-1]
            p.end = t
            job.node_seconds += (t - p.start) * len(p.nodes)

    def _open_period(self, job: SimJob, t: float) -> None:
        self._close_period(job, t)
        if job.nodes:
            job.periods.append(Period(start=t, end=None, nodes=tuple(job.nodes)))

    def _set_world(self, parent: SimJob, t: float, *, resize: bool) -> None:
        """Recompute the parent's training world; a change costs one resize."""
        self.advance(parent, t)
        world = len(parent.nodes) + sum(
            len(self.jobs[c].nodes)
            for c in parent.companions
            if self.jobs[c].state is JobState.RUNNING
        )
        if world != parent.world:
            parent.world = world
            if resize and parent.resized_at == t:
                pass  # one restart covers every change applied at the same instant
            elif resize:
                parent.resized_at = t
                assert parent.spec is not None
                parent.resizes += 1
                # A job that checkpointed while holding for this shrink only restarts.
                cost = parent.spec.restart_s
                if not math.isinf(parent.paused_until):
                    cost += parent.spec.checkpoint_s
                self._end_hold(parent, t)
                parent.paused_until = t + cost
                parent.pauses.append((t, t + cost))
        parent.last = max(parent.last, t)
        self._reschedule(parent)

    # ------------------------------------------------------------ lifecycle
    def arrive(self, spec: JobSpec) -> None:
        job = SimJob(
            job_id=spec.sim_id,
            spec=spec,
            # Same name for the same model: a site's priors match "same user + job name".
            name=spec.profile.model,
            user=spec.user,
            partition=spec.partition,
            comment="",
            submit=self.now,
            request=spec.req_nodes,
            partitions=spec.partitions,
        )
        self.jobs[job.job_id] = job
        self.active[job.job_id] = job
        self.pending[job.job_id] = job
        self.changed = True

    def start(self, job: SimJob, partition: str | None = None) -> None:
        """Start a pending job now, in ``partition`` (one of its own; None: its first)."""
        t = self.now
        if partition is not None and partition != job.partition:
            assert partition in job.partitions, (job.job_id, partition, job.partitions)
            job.partition = partition
        self._take(job, job.request)
        job.state = JobState.RUNNING
        del self.pending[job.job_id]
        self.running[job.job_id] = job
        job.start = t
        job.last = t
        self._open_period(job, t)
        self.changed = True
        if job.parent is not None:
            parent = self.jobs[job.parent]
            self._set_world(parent, t, resize=True)
        else:
            job.world = len(job.nodes)
            self._reschedule(job)

    def finish(self, job: SimJob, state: JobState = JobState.COMPLETED) -> None:
        t = self.now
        self.advance(job, t)
        if job.state is JobState.RUNNING:
            self._close_period(job, t)
            self._release(job, list(job.nodes))
        job.state = state
        job.end = t
        job.version += 1
        self.active.pop(job.job_id, None)
        self.pending.pop(job.job_id, None)
        self.running.pop(job.job_id, None)
        self.finished.append(job)
        self.changed = True
        for cid in list(job.companions):
            companion = self.jobs[cid]
            if companion.state.is_active:
                self.finish(companion, JobState.CANCELLED)
        if job.parent is not None:
            parent = self.jobs[job.parent]
            if job.job_id in parent.companions:
                parent.companions.remove(job.job_id)
            if parent.state is JobState.RUNNING and state is not JobState.COMPLETED:
                self._set_world(parent, t, resize=True)

    # ------------------------------------------------------------ Slurm actions
    def pin(self, job_id: int, nodes: int, partition: str | None = None) -> None:
        """``NumNodes=n-n`` on a pending job; with ``partition`` (one, or several
        comma-separated) also ``Partition=`` in the same update, the job's list from then on.
        As Slurm for root, any partition of the cluster is accepted: the backend checks
        that it is one of the job's own."""
        # As the CLI backend: what it checks before calling Slurm is ActionRefused (nothing
        # sent); what Slurm itself refuses is SlurmRejected with Slurm's message.
        job = self.get_active(job_id)
        if job.state is not JobState.PENDING:
            raise ActionRefused(f"cannot pin the size of job {job_id}: it is {job.state}")
        if nodes < 1:
            raise ActionRefused(f"node count must be a positive integer, got {nodes}")
        places = job.partitions if partition is None else tuple(partition.split(","))
        if any(self._partition_size(p) == 0 for p in places):
            raise SlurmRejected(
                f"job {job_id}: Partition={partition}",
                slurm_message="Invalid partition name specified",
            )
        if nodes > max(self._partition_size(p) for p in places):
            raise SlurmRejected(
                f"job {job_id}: {nodes} nodes",
                slurm_message="Requested node configuration is not available",
            )
        changed = nodes != job.request
        if job.partitions != places:
            job.partitions, job.partition = places, places[0]
            changed = True
        job.request = nodes
        if changed:
            self.actions += 1  # one scontrol update, whatever it changed

    def shrink(self, job_id: int, nodes: int) -> None:
        job = self.get_active(job_id)
        if job.state is not JobState.RUNNING:
            raise ActionRefused(f"cannot shrink job {job_id}: it is {job.state}")
        if nodes < 1:
            raise ActionRefused(f"node count must be a positive integer, got {nodes}")
        if nodes > len(job.nodes):
            raise ActionRefused(
                f"job {job_id} holds {len(job.nodes)} node(s); shrinking to {nodes} is not a shrink"
            )
        if nodes == len(job.nodes):
            return
        t = self.now
        if job.parent is None:
            self.advance(job, t)
        self._release(job, job.nodes[nodes:])
        self._open_period(job, t)
        self.actions += 1
        self.changed = True
        target = job if job.parent is None else self.jobs[job.parent]
        self._set_world(target, t, resize=True)

    def cancel(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is None or not job.state.is_active:
            raise SlurmRejected(
                f"job {job_id} is not active", slurm_message="Invalid job id specified"
            )
        self.actions += 1
        self.finish(job, JobState.CANCELLED)

    def submit(
        self, *, user: str, nodes: int, partition: str, name: str, comment: str, parent: int | None
    ) -> int:
        if partition not in self.free:
            raise SlurmRejected(
                f"no partition {partition!r}", slurm_message="Invalid partition name specified"
            )
        if nodes < 1 or nodes > self._partition_size(partition):
            raise SlurmRejected(
                f"{nodes} nodes", slurm_message="Requested node configuration is not available"
            )
        job = SimJob(
            job_id=self.next_id,
            spec=None,
            name=name,
            user=user,
            partition=partition,
            comment=comment,
            submit=self.now,
            request=nodes,
            parent=parent,
        )
        self.next_id += 1
        self.jobs[job.job_id] = job
        self.active[job.job_id] = job
        self.pending[job.job_id] = job
        if parent is not None:
            self.jobs[parent].companions.append(job.job_id)
        self.actions += 1
        self.changed = True
        return job.job_id

    def hold_for_checkpoint(self, job_id: int, ack_after_s: float) -> None:
        """A shrink instruction reached the job: it checkpoints and holds until resized."""
        job = self.get_active(job_id)
        self.advance(job, self.now)
        job.paused_until = math.inf
        job.held_since = self.now
        job.version += 1  # no end while holding
        self.push(self.now + ack_after_s, EV_ACK, job_id, 0)

    def resume(self, job_id: int) -> None:
        """The shrink a job held for was dropped (timeout, rollback): it trains on."""
        job = self.active.get(job_id)
        if job is not None and math.isinf(job.paused_until):
            self._end_hold(job, self.now)
            job.paused_until = self.now
            job.last = self.now
            self._reschedule(job)

    @staticmethod
    def _end_hold(job: SimJob, t: float) -> None:
        if job.held_since is not None:
            job.pauses.append((job.held_since, t))
            job.held_since = None

    def get_active(self, job_id: int) -> SimJob:
        job = self.active.get(job_id)
        if job is None:
            raise SlurmRejected(
                f"job {job_id} is not active", slurm_message="Invalid job id specified"
            )
        return job

    def _partition_size(self, partition: str) -> int:
        return sum(p.nodes for p in self.spec.partitions if p.name == partition)

    # ------------------------------------------------------------ scheduling
    def schedule(self) -> None:
        """One FIFO + EASY backfill pass per partition at ``now`` (all partitions at once
        when jobs may list several)."""
        if not any(self.free.values()):
            return  # every job asks for a node at least: none can start (a busy cluster)
        if self.first_fit:
            self._schedule_first_fit()
            return
        by_part: dict[str, list[SimJob]] = {}
        for job in self.pending.values():
            by_part.setdefault(job.partition, []).append(job)
        for part, pending in by_part.items():
            free = len(self.free[part])
            if all(j.request > free for j in pending):
                # fifo_easy_backfill starts only jobs that fit in the free nodes: none
                # does, so skip building its inputs (an expected end per running job;
                # most passes on a busy cluster end here).
                continue
            pending.sort(key=lambda j: (j.submit, j.job_id))
            # A job asking more than is free now never starts in this pass: the backfill
            # reads only the first such job, and its nodes only (fifo_easy_backfill's
            # contract), and on a busy cluster most pending jobs are such jobs.
            read = [pending[i] for i in read_by_backfill([j.request for j in pending], free)]
            waiting = [
                Waiting(
                    j.job_id, j.request, self._runtime(j, part) if j.request <= free else math.inf
                )
                for j in read
            ]
            holding = [
                Holding(len(j.nodes), self.expected_end(j))
                for j in self.running.values()
                if j.partition == part
            ]
            for job_id in fifo_easy_backfill(self.now, free, waiting, holding):
                self.start(self.jobs[job_id])

    def _schedule_first_fit(self) -> None:
        """The pass over every partition at once (``scheduler.first_fit_easy_backfill``),
        given only what it reads, as the per-partition pass is."""
        free = {part: len(ids) for part, ids in self.free.items()}
        if not any(j.request <= free[p] for j in self.pending.values() for p in j.partitions):
            return  # nothing fits anywhere now: nothing starts (most passes when busy)
        pending = sorted(self.pending.values(), key=lambda j: (j.submit, j.job_id))
        size = {p.name: p.nodes for p in self.spec.partitions}
        asks = [(j.request, j.partitions) for j in pending]
        read = [pending[i] for i in read_by_first_fit(asks, free, size)]
        waiting = [
            Candidate(
                j.job_id,
                j.request,
                j.partitions,
                tuple(
                    self._runtime(j, p) if j.request <= free[p] else math.inf for p in j.partitions
                ),
            )
            for j in read
        ]
        holding: dict[str, list[Holding]] = {}
        for j in self.running.values():
            holding.setdefault(j.partition, []).append(Holding(len(j.nodes), self.expected_end(j)))
        for job_id, part in first_fit_easy_backfill(self.now, free, waiting, holding):
            self.start(self.jobs[job_id], part)

    def _runtime(self, job: SimJob, partition: str | None = None) -> float:
        """Expected run time of a pending job started now in ``partition`` (its first when
        None): a companion runs as long as its parent, a trace job its work at its
        requested size on that partition's GPUs."""
        if job.parent is not None:
            return max(0.0, self.expected_end(self.jobs[job.parent]) - self.now)
        assert job.spec is not None
        gpu_type = self.gpu_type[job.partition if partition is None else partition]
        return job.spec.work / self._rate_at(job.spec, job.request, gpu_type)

    # ------------------------------------------------------------ invariants
    def busy_nodes(self) -> int:
        return len(self.owner) - self.owner.count(0)  # asked at every event: one C pass

    def check_capacity(self) -> None:
        """Every node has at most one owner and every job holds what it thinks it holds."""
        held = sum(len(j.nodes) for j in self.active.values())
        free = sum(len(f) for f in self.free.values())
        if held != self.busy_nodes() or held + free != len(self.owner):
            raise AssertionError(f"capacity broken at t={self.now}: held={held} free={free}")
        pending = [i for i, j in self.active.items() if j.state is JobState.PENDING]
        running = {i for i, j in self.active.items() if j.state is JobState.RUNNING}
        if list(self.pending) != pending or set(self.running) != running:
            raise AssertionError(f"pending/running index broken at t={self.now}")
