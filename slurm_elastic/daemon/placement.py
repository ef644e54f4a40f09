"""Where an elastic job may train, and how fast its GPUs are there (pure).

A site with several GPU generations puts each in a partition of its own, and a user may
submit to several (``sbatch -p a100,t4``): Slurm starts the job in whichever has room first,
and how fast it then trains depends on which.  This module prices that choice:

* **Speeds.**  ``cluster.gpu_speeds`` says how fast one GPU of each type trains relative to
  the others (``a100: 2.2, t4: 1.0``; any scale).  A partition's speed is its type's
  (``cluster_state.partition_gpu_types``); an untyped or mixed partition, or a type the
  config does not list, counts 1.0, so a site that configures nothing sees every partition
  alike and every outlook unchanged.
* **Basis.**  An outlook is in the units of where its numbers come from: a job's own reports
  are measured where it ran; a prior from finished jobs is brought to speed 1.0
  (``model.priors.prior_from_similar``'s ``speed``).  ``at_speed`` moves an outlook to another
  speed: every size's throughput times the ratio, its remaining seconds divided by it; the
  work left and the resize cost are the job's whatever the GPUs.
* **Options.**  A pending job gets one ``PlacementOption`` per partition of its own list that
  the daemon may place it in (``usable``: UP, known, and one its user may run in), each with
  the sizes that partition can hold for it and the outlook at its speed.  The policy picks
  one (``ElasticDemand.options``); a running job is where it is (moving it is a requeue,
  never planned).

The daemon never learns a job's speed on a type from this module alone: the measured rate of
a job that reported decides over the configured speed of where it ran (it is its basis).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from slurm_elastic.types import JobView, Outlook, PlacementOption, SizeEstimate

#: The speed of a partition whose GPUs the config does not price (or that has none).
REFERENCE_SPEED = 1.0


def partition_speeds(
    gpu_types: Mapping[str, str], gpu_speeds: Mapping[str, float]
) -> dict[str, float]:
    """Partition -> the relative speed of its GPUs (``REFERENCE_SPEED`` when its type is
    untyped, mixed or not priced)."""
    return {part: gpu_speeds.get(gpu_type, REFERENCE_SPEED) for part, gpu_type in gpu_types.items()}


def speed_of(speeds: Mapping[str, float], partition: str) -> float:
    """A partition's speed; a comma list (a pending job's) has its first partition's."""
    return speeds.get(partition.split(",", 1)[0], REFERENCE_SPEED)


def at_speed(outlook: Outlook, factor: float) -> Outlook:
    """``outlook`` on GPUs ``factor`` times as fast (the same object when ``factor`` is 1)."""
    if factor == 1.0:
        return outlook
    sizes = tuple(
        SizeEstimate(s.nodes, s.throughput * factor, s.remaining_s / factor) for s in outlook.sizes
    )
    return dataclasses.replace(outlook, sizes=sizes)


def own_partition(job: JobView) -> str:
    """The partition a job's outlook is priced in: where it runs, or (pending) the first of
    its list, the one Slurm tries first."""
    return job.partitions[0] if job.partitions else job.partition


def placement_options(
    job: JobView,
    sizes: Sequence[int],
    outlook: Outlook,
    speeds: Mapping[str, float],
    usable: Callable[[str], bool],
    capacity_in: Callable[[str], int],
) -> tuple[PlacementOption, ...]:
    """One option per partition of a pending job's own list that is ``usable``, with the
    ``sizes`` that partition can hold for it (``capacity_in``) and ``outlook`` (priced in
    ``own_partition``) moved to its speed; partitions that hold none of the sizes are left
    out.  In the job's order: greedy and Slurm's own start take the first that fits."""
    base = speed_of(speeds, own_partition(job))
    options: list[PlacementOption] = []
    for partition in job.partitions:
        if not usable(partition):
            continue
        most = capacity_in(partition)
        fitting = tuple(n for n in sizes if n <= most)
        if fitting:
            factor = speed_of(speeds, partition) / base
            options.append(PlacementOption(partition, fitting, at_speed(outlook, factor)))
    return tuple(options)
