"""Companion jobs: how a running elastic job grows on stock Slurm.

Stock Slurm cannot add nodes to a running job that holds GPUs, so growth is an ordinary
job of the same owner, account, QOS and partition whose workers join the parent's torch
rendezvous (``<agent_command> --join <PARENT>`` in the parent's working directory).
Slurm schedules it with all its priorities and limits.  The link that counts is the
journal's (``link_companion``, written when ``sbatch`` returns): which jobs are companions
and whose is never read back from a field their owner can change (``cluster_state.classify``
takes the links).  The job comment ``slurm-elastic:companion-of=<PARENT>`` labels the job
for people and for the job side, and lets recovery adopt a companion whose ``sbatch`` ran
just before a crash (``actuate.reconcile``).

This module submits companions; ``cluster_state`` (``classify``, ``orphan_reason``) reads
them, for decide and estimate alike.
"""

from __future__ import annotations

import shlex

from slurm_elastic.marker import format_companion
from slurm_elastic.types import JobView

companion_comment = format_companion


def companion_name(parent: JobView) -> str:
    return f"{parent.name[:40]}+grow"


def companion_script(parent: JobView, agent_command: str) -> str:
    """Batch script of a companion: join the parent's rendezvous from the parent's work dir."""
    work_dir = parent.work_dir or "."
    return (
        "#!/bin/bash\n"
        f"# slurm-elastic companion of job {parent.job_id}: joins its torch rendezvous.\n"
        # Submitted with --export=NONE (slurm.owner): without this, the agent's job steps
        # would inherit NONE and start without the job's own environment.
        "export SLURM_EXPORT_ENV=ALL\n"
        f"cd {shlex.quote(work_dir)} || exit 1\n"
        f"exec {agent_command} --join {parent.job_id}\n"
    )


def companion_extra_args(parent: JobView, now: float) -> tuple[str, ...]:
    """sbatch options that keep the companion inside the parent's envelope.

    Same GPUs per node, and a time limit no longer than what the parent has left: a
    companion outliving its parent would only be cancelled.
    """
    args: list[str] = []
    if parent.gpus_per_node > 0:
        args.append(f"--gpus-per-node={parent.gpus_per_node}")
    if parent.time_limit_s is not None and parent.start_time is not None:
        left_s = parent.start_time + parent.time_limit_s - now
        args.append(f"--time={max(1, int(left_s // 60))}")
    return tuple(args)
