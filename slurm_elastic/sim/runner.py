"""Run one policy over one workload: the event loop and the daemon in the loop.

``simulate`` replays the workload through :class:`engine.Cluster`; at control cycles a
driver runs the daemon's own ``Controller.run_once(now)`` against ``SimBackend``.  The
simulated jobs play the agents' part: before every cycle each running elastic job posts a
``ProgressReport`` (steps, samples/s at its current size, the metric of its model's real
validation curve at its progress) into the controller's report store, and a job that
finds a shrink instruction on the board checkpoints (its ``checkpoint_s``, no progress)
and acknowledges ``ready``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurm_elastic.policy.registry import DEFAULT_FALLBACK, POLICIES
from slurm_elastic.sim.backend import SimBackend
from slurm_elastic.sim.engine import (
    EV_ACK,
    EV_ARRIVE,
    EV_CYCLE,
    EV_END,
    Cluster,
    ClusterSpec,
    Driver,
    PartitionSpec,
    Sample,
    SimJob,
)
from slurm_elastic.sim.journal import MemoryJournal
from slurm_elastic.sim.workload import Workload
from slurm_elastic.types import AllocationProblem, JobState, Plan, ProgressReport, SolverStatus

if TYPE_CHECKING:
    from slurm_elastic.daemon.result import CycleResult
    from slurm_elastic.policy.options import PolicyOptions

#: Simulated clocks start here (2023-11-14 UTC) so that every time the daemon sees is a
#: plausible POSIX time; results are reported relative to the first submission.
ORIGIN = 1_700_000_000.0

__all__ = ["POLICIES", "ControllerDriver", "Outcome", "SimSettings", "simulate"]


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Which policy to simulate and the simulator's cadences."""

    policy: str = "mip"
    # Sim-time cadences.  The daemon cycles every 10 s on a live cluster; replaying months
    # of trace, the simulator runs the same cycle on a 60 s grid, only when something
    # happened (or ``refresh_s`` passed), and jobs report every ``report_every_s`` and
    # after each resize.  These bound the simulator's cost; they are not policy knobs.
    interval_s: float = 60.0
    refresh_s: float = 1800.0
    report_every_s: float = 1800.0
    sacct_interval_s: float = 3600.0  # the daemon's incremental history read
    # The daemon's ``cluster.gpu_speeds`` on a cluster of GPU types (type, relative speed),
    # as a site would configure them from one benchmark (``gputypes.benchmark_speeds``).
    gpu_speeds: tuple[tuple[str, float], ...] = ()
    # The daemon's ``policy.placement``: Slurm picks where a job of several partitions
    # starts, or the policy does and the daemon narrows the job to its choice.
    placement: str = "slurm"


@dataclass(slots=True)
class Outcome:
    """What one simulation produced: finished jobs, samples and run statistics."""

    policy: str
    jobs: list[SimJob]  # every finished trace job (companions excluded)
    all_jobs: list[SimJob]
    samples: list[Sample]
    total_nodes: int
    gpus_per_node: int
    cycles: int
    cycle_wall_s: float
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    # The cluster's partitions (their GPU types give per-type utilisation, sim.metrics).
    partitions: tuple[PartitionSpec, ...] = ()


DriverFactory = Callable[[SimBackend, Cluster, SimSettings], Driver]


def simulate(
    workload: Workload,
    spec: ClusterSpec,
    settings: SimSettings,
    *,
    driver_factory: DriverFactory | None = None,
    on_step: Callable[[Cluster], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Replay ``workload``; ``driver_factory`` None is plain Slurm (FIFO + backfill only)."""
    wall0 = time.perf_counter()
    cluster = Cluster(spec, workload.jobs)
    backend = SimBackend(cluster)
    driver = driver_factory(backend, cluster, settings) if driver_factory else None
    interval = settings.interval_s
    by_id = {s.sim_id: s for s in workload.jobs}
    for s in workload.jobs:
        cluster.push(ORIGIN + s.submit_s, EV_ARRIVE, s.sim_id)
    samples: list[Sample] = []
    last_cycle = -math.inf
    next_cycle = math.inf
    cycles = 0
    reasons = {"event": 0, "acted": 0, "refresh": 0}  # what triggered each cycle
    acted = False
    why = "event"
    cycle_wall = 0.0
    total = len(workload.jobs)
    finished_trace = 0
    events = cluster.events
    while events:
        t = events[0][0]
        cluster.now = t
        run_cycle = False
        while events and events[0][0] == t:
            _, kind, _, job_id, version = heapq.heappop(events)
            if kind == EV_END:
                job = cluster.jobs[job_id]
                if job.version == version and job.state is JobState.RUNNING:
                    cluster.finish(job)
                    finished_trace += 1
            elif kind == EV_ARRIVE:
                cluster.arrive(by_id[job_id])
            elif kind == EV_ACK and driver is not None:
                driver.acknowledge(job_id, t)
                cluster.changed = True
            elif kind == EV_CYCLE:
                next_cycle = math.inf
                run_cycle = cluster.changed or t - last_cycle >= settings.refresh_s
                why = "acted" if acted else "event" if cluster.changed else "refresh"
        if run_cycle and driver is not None:
            before = cluster.actions
            cluster.changed = False
            c0 = time.perf_counter()
            driver.cycle(t)
            cycle_wall += time.perf_counter() - c0
            cycles += 1
            reasons[why] += 1
            last_cycle = t
            acted = cluster.actions != before
            if acted:
                cluster.changed = True  # the controller acted: look again next cycle
        cluster.schedule()
        if on_step is not None:
            on_step(cluster)
        samples.append(Sample(t, cluster.busy_nodes(), _queued(cluster)))
        if driver is not None and cluster.active:
            if cluster.changed:
                due = (math.floor(t / interval) + 1) * interval
            elif any(j.spec is not None and j.spec.elastic for j in cluster.active.values()):
                due = max(t, last_cycle + settings.refresh_s)
                due = math.ceil(due / interval) * interval
                due = due if due > t else due + interval
            else:
                due = math.inf
            if due < next_cycle:
                next_cycle = due
                cluster.push(due, EV_CYCLE)
        if progress is not None:
            progress(finished_trace, total)
    trace_jobs = [j for j in cluster.finished if j.spec is not None]
    return Outcome(
        policy=settings.policy if driver is not None else "slurm",
        jobs=trace_jobs,
        all_jobs=list(cluster.finished),
        samples=samples,
        total_nodes=spec.total_nodes,
        gpus_per_node=spec.gpus_per_node,
        cycles=cycles,
        cycle_wall_s=cycle_wall,
        wall_s=time.perf_counter() - wall0,
        extra={
            "rejected": len(workload.rejected),
            **{f"cycles_{k}": v for k, v in reasons.items()},
            **_driver_stats(driver),
        },
        partitions=spec.partitions,
    )


def _driver_stats(driver: Driver | None) -> dict[str, Any]:
    if not isinstance(driver, ControllerDriver):
        return {}
    solve = sorted(driver.solve_s)
    return {
        "failed_cycles": driver.errors,
        "fallback_cycles": driver.fallbacks,
        "solve_ms_p50": round(1000 * solve[len(solve) // 2], 2) if solve else 0.0,
        "solve_ms_max": round(1000 * solve[-1], 2) if solve else 0.0,
    }


def _queued(cluster: Cluster) -> int:
    return sum(1 for j in cluster.pending.values() if j.spec is not None)


def report_for(job: SimJob, cluster: Cluster, now: float) -> ProgressReport:
    """What the job's agent would report now: its step budget if it declares one, else its
    epochs (the daemon's convergence window is in epochs), and its metric either way."""
    assert job.spec is not None
    spec = job.spec
    rate = cluster.rate(job)
    curve = spec.profile.curve
    at = (job.done / spec.work if spec.work else 1.0) * spec.curve_span
    return ProgressReport(
        job_id=job.job_id,
        time=now,
        step=int(job.done),
        nodes=job.world,
        epoch=None if spec.declares_budget else curve.epoch_at(at),
        loss=curve.at(at),
        metric_higher_is_better=curve.higher_is_better,
        samples_per_s=rate * spec.profile.batch,
        global_batch=spec.profile.batch,
        total_steps=math.ceil(spec.work) if spec.declares_budget else None,
        mode="torchft" if spec.stop_free else None,
    )


def _in_process_allocate(
    problem: AllocationProblem,
    policy: str,
    options: PolicyOptions | None = None,
    *,
    fallback: str = DEFAULT_FALLBACK,
) -> Plan:
    """``policy.allocate`` with ``options`` (default: the daemon's), the MIP solved in this
    process.

    The daemon forks a child per solve so that a hung solver cannot stall the service
    (``PolicyOptions.isolate``); the simulator is a batch run where a fork per cycle would
    cost more than the solve, and HiGHS still stops at the same time limit.
    """
    from dataclasses import replace

    from slurm_elastic.policy import allocate
    from slurm_elastic.policy.options import PolicyOptions

    return allocate(
        problem,
        policy,
        fallback=fallback,
        options=replace(options or PolicyOptions(), isolate=False),
    )


class ControllerDriver:
    """The daemon's own Controller, in enforce mode, driving the simulated cluster.

    ``options``: policy options other than the daemon's defaults (to study a variant, as
    ``scripts/analyze_sim.py --option`` does).  ``observe`` sees every cycle's result.
    """

    def __init__(
        self,
        backend: SimBackend,
        cluster: Cluster,
        settings: SimSettings,
        options: PolicyOptions | None = None,
    ) -> None:
        from slurm_elastic.actuate.instructions import InstructionBoard
        from slurm_elastic.config import Config
        from slurm_elastic.daemon.controller import Controller
        from slurm_elastic.daemon.reports import ReportStore

        config = Config.model_validate(
            {
                "mode": "enforce",
                "policy": {"name": settings.policy, "placement": settings.placement},
                "interval_s": settings.interval_s,
                "slurm": {"sacct_interval_s": settings.sacct_interval_s},
                "cluster": {"gpu_speeds": dict(settings.gpu_speeds)},
            }
        )
        self.cluster = cluster
        self.settings = settings
        self.reports = ReportStore()
        self.board = InstructionBoard()
        self.controller = Controller(
            backend,
            config,
            reports=self.reports,
            journal=MemoryJournal(),
            agents=self.board,
            allocate=lambda problem, policy: _in_process_allocate(
                problem, policy, options, fallback=self.controller.config.policy.fallback
            ),
        )
        self._held: dict[int, str] = {}  # job id -> instruction id being checkpointed for
        self._reported: dict[int, tuple[float, int]] = {}  # job id -> (time, world) last sent
        self.solve_s: list[float] = []
        self.errors = 0
        self.fallbacks = 0  # cycles whose plan came from a fallback policy

    def cycle(self, now: float) -> None:
        c = self.cluster
        every = self.settings.report_every_s
        for job in c.active.values():
            if job.spec is None or not job.spec.elastic or job.state is not JobState.RUNNING:
                continue
            if now < job.paused_until:
                continue  # restarting or holding a checkpoint: the agent has nothing new
            last = self._reported.get(job.job_id)
            if last is None or last[1] != job.world or now - last[0] >= every:
                c.advance(job, now)
                self.reports.add(report_for(job, c, now))
                self._reported[job.job_id] = (now, job.world)
        result = self.controller.run_once(now)
        self.observe(result)
        if not result.ok:
            self.errors += 1
        if result.plan is not None:
            self.solve_s.append(result.plan.solve_s)
            if result.plan.status in (SolverStatus.FALLBACK, SolverStatus.NO_CHANGE):
                self.fallbacks += 1
        self._follow_instructions(now)

    def observe(self, result: CycleResult) -> None:
        """Each cycle's result, as the controller returned it (nothing to do here)."""

    def _follow_instructions(self, now: float) -> None:
        """Agents: checkpoint for a new shrink instruction; resume when one is withdrawn."""
        open_jobs = set(self.board.open_jobs())
        for job_id in list(self._held):
            if job_id not in open_jobs:
                del self._held[job_id]
                self.cluster.resume(job_id)
        for job_id in open_jobs:
            instruction = self.board.pending_for(job_id)
            if instruction is None or self._held.get(job_id) == instruction.id:
                continue
            job = self.cluster.active.get(job_id)
            if job is None or job.spec is None or job.state is not JobState.RUNNING:
                continue
            self._held[job_id] = instruction.id
            self.cluster.hold_for_checkpoint(job_id, job.spec.checkpoint_s)

    def acknowledge(self, job_id: int, now: float) -> None:
        from slurm_elastic.actuate.instructions import Ack
        from slurm_elastic.protocol import AckStatus

        instruction_id = self._held.get(job_id)
        job = self.cluster.jobs.get(job_id)
        if instruction_id is None or job is None:
            return
        self.board.ack(
            Ack(
                instruction_id=instruction_id,
                job_id=job_id,
                status=AckStatus.READY,
                step=int(job.done),
                detail="simulated checkpoint written",
                received_at=now,
            )
        )
