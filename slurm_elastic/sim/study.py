"""One comparison: a trace, a cluster, a workload mapping, several policies side by side.

Default cluster size (when ``--nodes`` is not given): the smallest power-of-two GPU count,
at least the largest job, at which the plain Slurm baseline (FIFO + EASY backfill, every
job rigid at its requested size) keeps the GPUs at most ``TARGET_UTIL`` busy over the
run.  It is measured once per trace with no policy in the loop, so it cannot favour one:
on ``itp_elasticflow/raw/cluster06.csv`` it gives 128 GPUs (baseline utilisation 0.67),
on the Philly week 256 GPUs (0.61).

A cluster of GPU types (``--cluster t4:16x4,a100:8x8``, ``sim.gputypes.parse_cluster``) is
one partition per type, named after it, of ``nodes × GPUs per node / unit`` allocation slots,
the unit being the workload's ``gpus_per_node`` (``typed_partitions``; ``sim.workload``
says why one unit for every partition).  Trace jobs naming none of them are submitted to
all of them in that order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError
from slurm_elastic.policy.registry import POLICIES, unknown_policy
from slurm_elastic.sim.engine import ClusterSpec, PartitionSpec
from slurm_elastic.sim.gputypes import NodeGroup, benchmark_speeds
from slurm_elastic.sim.metrics import summarize, util_by_type
from slurm_elastic.sim.runner import (
    ControllerDriver,
    Outcome,
    SimSettings,
    simulate,
)
from slurm_elastic.sim.traces import Trace
from slurm_elastic.sim.workload import Workload, WorkloadConfig, build_workload

TARGET_UTIL = 0.70
PARTITION = "gpu"
MAX_DEFAULT_GPUS = 1 << 14


@dataclass(frozen=True, slots=True)
class Study:
    """One trace on one simulated cluster with one workload configuration."""

    trace: Trace
    trace_path: str
    traces_dir: Path
    workload_cfg: WorkloadConfig
    settings: SimSettings
    nodes: int
    gpus_per_node: int
    # Named partitions (node counts add up to ``nodes``); empty: one partition "gpu".
    partitions: tuple[PartitionSpec, ...] = ()

    @property
    def cluster(self) -> ClusterSpec:
        parts = self.partitions or (PartitionSpec(PARTITION, self.nodes),)
        return ClusterSpec(parts, self.gpus_per_node)

    def workload(self) -> Workload:
        return build_workload(
            self.trace,
            self.workload_cfg,
            traces_dir=self.traces_dir,
            partition_nodes={p.name: p.nodes for p in self.cluster.partitions},
            default_partition=self.cluster.default_partition,
            partition_types=self.cluster.gpu_types,
        )


def typed_partitions(groups: Sequence[NodeGroup], unit: int) -> tuple[PartitionSpec, ...]:
    """One partition per GPU type, of ``nodes × gpus_per_node / unit`` slots of ``unit``
    GPUs (the module docstring; the simulator places no job on servers, only on slots).
    Raises ConfigError when a group's GPUs are not a whole number of slots: the rest would
    be GPUs that no job could be given."""
    parts = []
    for group in groups:
        slots, left = divmod(group.gpus, unit)
        if left:
            raise ConfigError(
                f"cluster group {group.gpu_type}:{group.nodes}x{group.gpus_per_node} has "
                f"{group.gpus} GPUs, not a multiple of --gpus-per-node {unit}"
            )
        parts.append(PartitionSpec(group.partition, slots, gpu_type=group.gpu_type))
    return tuple(parts)


def parse_partitions(text: str) -> tuple[PartitionSpec, ...]:
    """``"gpu:96,debug:32"`` -> partitions; trace jobs naming another partition go to the
    first one."""
    parts = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, count = item.partition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--partitions: {item!r} is not NAME:NODES (NODES >= 1)")
        parts.append(PartitionSpec(name, int(count)))
    if not parts or len({p.name for p in parts}) != len(parts):
        raise ConfigError(f"--partitions: {text!r} must name distinct partitions")
    return tuple(parts)


def parse_policies(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in POLICIES]
    if bad or not names:
        raise ConfigError(unknown_policy(", ".join(bad) or "(none)"))
    return names


def default_nodes(trace: Trace, cfg: WorkloadConfig, traces_dir: Path) -> int:
    """Nodes for the default cluster size (see the module docstring)."""
    g = cfg.gpus_per_node
    largest = max(j.gpus for j in trace.jobs)
    gpus = 1 << max(0, math.ceil(math.log2(largest)))
    rigid = replace(cfg, elastic_fraction=0.0)
    while gpus <= MAX_DEFAULT_GPUS:
        nodes = max(1, gpus // g)
        spec = ClusterSpec((PartitionSpec(PARTITION, nodes),), g)
        wl = build_workload(
            trace,
            rigid,
            traces_dir=traces_dir,
            partition_nodes={PARTITION: nodes},
            default_partition=PARTITION,
        )
        if not wl.rejected:
            util = summarize(simulate(wl, spec, SimSettings(policy="static")))["gpu_util"]
            if util <= TARGET_UTIL:
                return nodes
        gpus *= 2
    raise ConfigError(f"no cluster up to {MAX_DEFAULT_GPUS} GPUs fits trace {trace.name}")


def run_policy(
    study: Study,
    policy: str,
    workload: Workload,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """One policy on the study's cluster; on a cluster of GPU types the daemon is given
    ``benchmark_speeds`` as its ``cluster.gpu_speeds``."""
    settings = replace(study.settings, policy=policy, gpu_speeds=_daemon_speeds(study))
    return simulate(
        workload, study.cluster, settings, driver_factory=ControllerDriver, progress=progress
    )


def results_document(
    study: Study, workload: Workload, outcomes: dict[str, Outcome]
) -> dict[str, Any]:
    """``results.json``: ``{"policies": {...}, "trace": ..., "config": ...}``."""
    return {
        "policies": {name: _figures(o) for name, o in outcomes.items()},
        "trace": {
            "name": study.trace.name,
            "path": study.trace_path,
            "format": study.trace.format,
            "jobs": len(study.trace.jobs),
            "simulated": len(workload.jobs),
            "rejected": len(workload.rejected),
            "elastic": sum(1 for j in workload.jobs if j.elastic),
        },
        "config": {
            "nodes": study.nodes,
            "partitions": {p.name: p.nodes for p in study.cluster.partitions},
            "gpus_per_node": study.gpus_per_node,
            "gpus": study.nodes * study.gpus_per_node,
            **_typed_config(study),
            "workload": asdict(study.workload_cfg),
            "sim": {
                k: v for k, v in asdict(study.settings).items() if k not in ("policy", "gpu_speeds")
            },
        },
    }


def _figures(outcome: Outcome) -> dict[str, Any]:
    """One policy's figures; a typed cluster's add ``gpu_util_by_type`` (sim.metrics)."""
    by_type = util_by_type(outcome)
    return {**summarize(outcome), **({"gpu_util_by_type": by_type} if by_type else {})}


def _daemon_speeds(study: Study) -> tuple[tuple[str, float], ...]:
    """The daemon's configured GPU speeds on a typed cluster (none on an untyped one)."""
    if not study.cluster.typed:
        return ()
    types = [p.gpu_type for p in study.cluster.partitions if p.gpu_type]
    return tuple(benchmark_speeds(study.traces_dir, types).items())


def _typed_config(study: Study) -> dict[str, Any]:
    """A typed cluster's partition -> GPU type and the daemon's configured speeds (nothing
    for an untyped one)."""
    if not study.cluster.typed:
        return {}
    return {"gpu_types": study.cluster.gpu_types, "gpu_speeds": dict(_daemon_speeds(study))}


def run_stats(outcomes: dict[str, Outcome]) -> dict[str, dict[str, float]]:
    """Wall-clock cost per policy: total, controller cycles, mean ms per cycle."""
    return {
        name: {
            "wall_s": round(o.wall_s, 2),
            "cycles": o.cycles,
            "cycle_ms": round(1000.0 * o.cycle_wall_s / o.cycles, 2) if o.cycles else 0.0,
            **o.extra,
        }
        for name, o in outcomes.items()
    }


def table_rows(results: dict[str, Any], policies: Sequence[str]) -> list[list[str]]:
    """Rows (metric, value per policy) for the side-by-side table."""
    rows = []
    for field, first in next(iter(results["policies"].values())).items():
        if isinstance(first, dict):  # gpu_util_by_type: a row per type
            for key in first:
                by = [results["policies"][p][field][key] for p in policies]
                rows.append([f"gpu_util ({key})", *(f"{v:.4f}" for v in by)])
            continue
        row = [field]
        for p in policies:
            v = results["policies"][p][field]
            row.append(f"{v:.4f}" if isinstance(v, float) and field == "gpu_util" else f"{v:,}")
        rows.append(row)
    return rows
