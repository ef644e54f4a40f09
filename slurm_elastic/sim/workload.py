"""Workload mapping: trace jobs -> simulated jobs (model profile, work, elasticity, sizes).

Rules (all configurable through :class:`WorkloadConfig`, all seeded):

* **Allocation unit.**  A simulated Slurm node has ``gpus_per_node`` GPUs (default 1: one
  GPU slot per node, the way a site runs ``--gpus-per-node 1`` jobs on a shared GPU
  partition).  A job asking ``g`` GPUs requests ``ceil(g / G)`` whole nodes; at ``n`` nodes
  it uses ``g * n / req_nodes`` GPUs (so a 2-GPU job on 8-GPU nodes keeps using 2 GPUs per
  node: no packing of several jobs onto one node).  On a cluster of typed partitions
  (``sim.gputypes``: ``t4:16x4,a100:8x8``) the node stays this one slot of ``gpus_per_node``
  GPUs in every partition, whatever the servers' size: a Slurm job has one ``--nodes``
  whichever partition it starts in, so sizes must mean the same GPUs everywhere
  (``sim.study.typed_partitions`` turns each group into slots).
* **Partitions.**  A trace job naming one of the cluster's partitions is submitted there.
  Otherwise, on an untyped cluster it goes to the first (the default) partition; on a typed
  cluster it is submitted to every typed partition in the cluster's order, as
  ``sbatch -p t4,a100`` (``JobSpec.partitions``; ``JobSpec.partition`` is the first), and
  Slurm starts it in the first where it can start (``sim.scheduler``).  Its largest size is
  capped by the largest of its partitions, and it is rejected only when it fits none.
* **Model.**  The trace's model where it names one (ITP augmented: A100 table row at its
  batch size; Pollux workloads: the Pollux profile).  ITP raw: a model drawn uniformly
  from the augmented traces' six and a batch size drawn from that model's A100 rows (what
  ElasticFlow's augmentation did).  Canonical rows naming a model: the Pollux profile for
  a Pollux model, else the A100 table (batch = ``batch_size`` or the smallest row).
  Philly, sacct and canonical rows without a model: Pollux's GPU-time rule — < 1 GPU-h:
  cifar10 or ncf (coin flip), 1-10 GPU-h: deepspeech2 (half of them bert), 10-100 GPU-h:
  yolov3, >= 100 GPU-h: imagenet.
* **Work.**  Duration-preserving: ``W = duration × rate(req_gpus)`` steps, so a job kept at
  its requested size finishes in exactly its trace duration.  Pollux workloads have no
  duration: ``W`` is the whole validation curve (training to the final metric).  On a typed
  cluster the rate is the one on the GPU type of the job's *first* partition: kept at its
  size there it runs its trace duration, and faster or slower on another type.
* **Speed per GPU type.**  A profile was measured on one type (``Profile.gpu_type``: t4 for
  Pollux, a100 for ElasticFlow's A100 tables); on a partition of type ``T`` a job runs at
  ``profile rate(gpus) × gputypes.speed_ratio(traces, model, T, profile type, gpus)``
  (``JobSpec.rate_at``).  Untyped partitions run every job at its profile's rate.
* **Elasticity.**  Each job is elastic with probability ``elastic_fraction`` (seeded
  draw, independent of the model draw); min nodes = ``max(1, ceil(req × min_fraction))``,
  max nodes = ``min(partition size, max(req, floor(req × max_multiple)))``, step =
  ``gcd(min, req)`` so the requested size is always an allowed size.
* **Step budget.**  ``budget="declared"``: every job tells the daemon its step budget
  (``total_steps``, as an ElasticFlow-style job with a fixed number of epochs does) and
  trains through its whole validation curve.  ``"converge"``: no job declares one; each
  trains until its real curve meets the convergence criterion (``Curve.stop_fraction``)
  and reports its metric and epochs, so the daemon knows only what its fitted curve
  predicts.  ``"mix"`` (the default): each job draws one or the other, half and half
  (``MIX_CONVERGE_SHARE``, a seeded draw of its own stream).  A converge job's trace
  duration is its time to converge at the requested size (the curve is stretched so that
  its stop falls there); without a duration (Pollux workloads) it is the curve up to its
  stop, where a declared job runs the whole curve.
* **Resize cost** = measured restart overhead (``restart_s``, default 15 s: grow 12-19 s,
  shrink 9-13 s with tuned rendezvous timeouts in SLURM-FACTS) + the model's checkpoint
  time (``profiles.CHECKPOINT_S``, assumed).  With ``resize_mode="torchft"`` (stop-free,
  ``slurm-elastic run --mode torchft``) nothing restarts and no checkpoint is written: the
  cost is the survivors' pause, ``STOP_FREE_PAUSE_S`` by default, and the jobs' reports say
  so (the daemon prices them with ``model.stop_free_resize_cost_s`` until it measures).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim import gputypes, profiles
from slurm_elastic.sim.profiles import Profile
from slurm_elastic.sim.traces import Trace, TraceJob

RESIZE_MODES = ("torchrun", "torchft")
BUDGETS = ("declared", "converge", "mix")
# In the mixed workload, the share of jobs that train until converged: no measured figure
# exists for that share at a site, so an even split, where neither kind dominates.
MIX_CONVERGE_SHARE = 0.5
TORCHRUN_RESTART_S = 15.0  # SLURM-FACTS: grow 12-19 s, shrink 9-13 s (tuned rendezvous)
# The torchft mode's survivor pause per resize: scripts/bench_resize.py --mode torchft on
# the local cluster (docs/benchmarks.md: shrink 0.84 s, grow 0.21 s, medians of 3), the
# larger of the two.
STOP_FREE_PAUSE_S = 0.84


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """How trace jobs become simulated training jobs (elastic share, ranges, costs)."""

    gpus_per_node: int = 1
    elastic_fraction: float = 1.0
    min_fraction: float = 0.5
    max_multiple: float = 2.0
    restart_s: float | None = None  # None: the resize mode's measured figure
    checkpoint_s: float | None = None  # None: per-model table (torchft: none is written)
    seed: int = 0
    resize_mode: str = "torchrun"
    budget: str = "mix"  # "declared" | "converge" | "mix" (module docstring)

    @property
    def resize_restart_s(self) -> float:
        if self.restart_s is not None:
            return self.restart_s
        return STOP_FREE_PAUSE_S if self.resize_mode == "torchft" else TORCHRUN_RESTART_S

    def resize_checkpoint_s(self, profile: Profile) -> float:
        if self.resize_mode == "torchft":
            return 0.0  # the state moves from a peer; nothing is written for a resize
        return self.checkpoint_s if self.checkpoint_s is not None else profile.checkpoint_s

    def __post_init__(self) -> None:
        if self.resize_mode not in RESIZE_MODES:
            raise ConfigError(f"resize mode must be torchrun or torchft, got {self.resize_mode!r}")
        if self.budget not in BUDGETS:
            raise ConfigError(f"budget must be declared, converge or mix, got {self.budget!r}")
        if self.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if not 0.0 <= self.elastic_fraction <= 1.0:
            raise ConfigError(f"elastic fraction must be in [0, 1], got {self.elastic_fraction}")
        if not 0.0 < self.min_fraction <= 1.0:
            raise ConfigError(f"min fraction must be in (0, 1], got {self.min_fraction}")
        if self.max_multiple < 1.0:
            raise ConfigError(f"max multiple must be >= 1, got {self.max_multiple}")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A simulated job: everything fixed at submission."""

    sim_id: int
    trace_id: str
    submit_s: float
    user: str
    partition: str
    req_gpus: int
    req_nodes: int
    elastic: bool
    min_nodes: int
    max_nodes: int
    step: int
    profile: Profile
    work: float  # steps to finish
    restart_s: float  # relaunch of the workers at the new size (torchft: the survivors' pause)
    checkpoint_s: float  # write + read of one checkpoint
    stop_free: bool = False  # resizes through torchft replica groups (reported as such)
    declares_budget: bool = True  # reports total_steps; else trains until converged
    # Every partition it was submitted to, in its order (``-p t4,a100``); the first is
    # ``partition``.  Left empty, it is ``(partition,)``.
    partitions: tuple[str, ...] = ()
    # The GPU type of its first partition, on which its work is defined (module docstring);
    # "" on an untyped cluster.
    gpu_type: str = ""
    # The traces folder whose type speeds move its profile to other GPU types
    # (``gputypes.speed_ratio``); None on an untyped cluster.
    speeds_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.partitions:
            object.__setattr__(self, "partitions", (self.partition,))  # frozen: set once here
        elif self.partitions[0] != self.partition:
            raise ConfigError(
                f"job {self.trace_id}: partition {self.partition!r} is not the first of "
                f"{','.join(self.partitions)}"
            )

    @property
    def curve_span(self) -> float:
        """The fraction of its validation curve the job trains through (its stop, for a job
        that trains until converged)."""
        return 1.0 if self.declares_budget else self.profile.curve.stop_fraction

    @property
    def resize_cost_s(self) -> float:
        return self.restart_s + self.checkpoint_s

    def gpus_at(self, nodes: int) -> float:
        return self.req_gpus * nodes / self.req_nodes

    def rate_at(self, nodes: int, gpu_type: str | None = None) -> float:
        """Steps/s at ``nodes`` on GPUs of ``gpu_type`` (None: its first partition's type;
        "": untyped, its profile's own rate)."""
        gpus = self.gpus_at(nodes)
        rate = self.profile.rate_at(gpus)
        on = self.gpu_type if gpu_type is None else gpu_type
        if not on or on == self.profile.gpu_type:
            return rate
        if self.speeds_dir is None or not self.profile.gpu_type:
            raise ConfigError(
                f"job {self.trace_id}: no speed of {self.profile.model} on {on} "
                f"(profile {self.profile.source} names no GPU type or no traces folder)"
            )
        return rate * gputypes.speed_ratio(
            self.speeds_dir, self.profile.model, on, self.profile.gpu_type, gpus
        )

    @property
    def duration_at_request(self) -> float:
        """Run time at its requested size on its first partition's GPUs."""
        return self.work / self.rate_at(self.req_nodes)


@dataclass(frozen=True, slots=True)
class Workload:
    """The simulated jobs of a trace, and the trace jobs that can never fit."""

    jobs: tuple[JobSpec, ...]
    rejected: tuple[str, ...]  # trace ids that can never fit their partition


_BUCKETS = ((1.0, ("cifar10", "ncf")), (10.0, ("deepspeech2", "bert")), (100.0, ("yolov3",)))


def pollux_bucket_model(gpu_hours: float, rng: random.Random) -> str:
    for limit, choices in _BUCKETS:
        if gpu_hours < limit:
            return choices[0] if len(choices) == 1 else rng.choice(choices)
    return "imagenet"


def _profile(job: TraceJob, fmt: str, traces_dir: Path, rng: random.Random) -> Profile:
    pollux_dir = traces_dir / "pollux" / "profiles"
    model = job.model
    if model is None and fmt == "itp-raw":
        model = rng.choice(profiles.a100_models(traces_dir))
        batches = sorted(profiles.a100_table(traces_dir / "elasticflow_throughputs", model))
        return profiles.a100_profile(traces_dir, model, rng.choice(batches))
    if model is None:
        gpu_hours = (job.duration_s or 0.0) * job.gpus / 3600.0
        return profiles.pollux_profile(pollux_dir, pollux_bucket_model(gpu_hours, rng))
    if fmt != "itp-augmented" and model in profiles.POLLUX_MODELS:
        return profiles.pollux_profile(pollux_dir, model)
    if model in profiles.CURVE_FOR_A100:
        table = profiles.a100_table(traces_dir / "elasticflow_throughputs", model)
        batch = job.batch_size if job.batch_size in table else min(table)
        return profiles.a100_profile(traces_dir, model, batch)
    raise ConfigError(f"job {job.job_id}: no throughput profile for model {model!r}")


def _partitions_for(
    job: TraceJob, partition_nodes: Mapping[str, int], typed: tuple[str, ...], default: str
) -> tuple[str, ...]:
    """Where a trace job is submitted (module docstring: Partitions)."""
    if job.partition in partition_nodes:
        return (job.partition,)
    return typed or (default,)


def build_workload(
    trace: Trace,
    cfg: WorkloadConfig,
    *,
    traces_dir: Path,
    partition_nodes: dict[str, int],
    default_partition: str,
    partition_types: Mapping[str, str] | None = None,
) -> Workload:
    """Map every trace job; jobs larger than their partitions are rejected (as Slurm would).

    ``partition_types``: partition -> GPU type, for a cluster with typed partitions (those
    with a type are the ones a job naming none of the cluster's partitions is submitted to,
    in ``partition_nodes`` order); None or all "": untyped, today's mapping."""
    types = dict(partition_types or {})
    typed = tuple(p for p in partition_nodes if types.get(p))
    model_rng = random.Random(f"model-{cfg.seed}")
    elastic_rng = random.Random(f"elastic-{cfg.seed}")
    budget_rng = random.Random(f"budget-{cfg.seed}")
    jobs: list[JobSpec] = []
    rejected: list[str] = []
    for job in trace.jobs:
        # Draw from both streams for every job so that one job's outcome never shifts
        # another job's draws.
        profile = _profile(job, trace.format, traces_dir, model_rng)
        draw = elastic_rng.random()
        converges = budget_rng.random() < MIX_CONVERGE_SHARE
        declares = cfg.budget == "declared" or (cfg.budget == "mix" and not converges)
        partitions = _partitions_for(job, partition_nodes, typed, default_partition)
        gpu_type = types.get(partitions[0], "")
        if gpu_type and not profile.gpu_type:
            raise ConfigError(
                f"job {job.job_id}: profile {profile.source} names no GPU type, so it cannot "
                f"run on typed partitions"
            )
        cap = max(partition_nodes[p] for p in partitions)
        req_nodes = math.ceil(job.gpus / cfg.gpus_per_node)
        if req_nodes > cap:
            rejected.append(job.job_id)
            continue
        elastic = job.elastic if job.elastic is not None else draw < cfg.elastic_fraction
        lo = math.ceil((job.min_gpus or job.gpus * cfg.min_fraction) / cfg.gpus_per_node)
        hi = math.floor((job.max_gpus or job.gpus * cfg.max_multiple) / cfg.gpus_per_node)
        min_nodes = max(1, min(lo, req_nodes))
        step = math.gcd(min_nodes, req_nodes)
        max_nodes = min(cap, max(req_nodes, hi))
        max_nodes -= (max_nodes - min_nodes) % step  # the marker wants step | max - min
        probe = JobSpec(
            sim_id=len(jobs) + 1,
            trace_id=job.job_id,
            submit_s=job.submit_s,
            user=job.user,
            partition=partitions[0],
            req_gpus=job.gpus,
            req_nodes=req_nodes,
            elastic=elastic,
            min_nodes=min_nodes if elastic else req_nodes,
            max_nodes=max_nodes if elastic else req_nodes,
            step=step if elastic else 1,
            profile=profile,
            work=0.0,
            restart_s=cfg.resize_restart_s,
            checkpoint_s=cfg.resize_checkpoint_s(profile),
            stop_free=cfg.resize_mode == "torchft",
            declares_budget=declares,
            partitions=partitions,
            gpu_type=gpu_type,
            speeds_dir=traces_dir if typed else None,
        )
        if job.duration_s is not None:
            work = job.duration_s * probe.rate_at(req_nodes)
        else:
            work = profile.full_run_steps * probe.curve_span
        jobs.append(replace(probe, work=work))
    return Workload(jobs=tuple(jobs), rejected=tuple(rejected))
