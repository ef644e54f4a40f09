"""The job's own allocation, read from Slurm, and the environment a new ``srun`` needs.

After ``scontrol update NumNodes=`` the batch shell's ``SLURM_*`` variables still describe
the old allocation, and an ``srun`` started with them asks for nodes the job no longer has.
SLURM-FACTS.md lists what to reset (node count and list, CPUs per node) and what to unset
(task counts, which Slurm would otherwise re-derive from the stale values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import hostlist

from slurm_elastic.errors import AgentError, SlurmElasticError
from slurm_elastic.marker import companion_parent
from slurm_elastic.slurm.parse_text import new_separator, parse_scontrol_jobs, split_rows
from slurm_elastic.slurm.runner import SlurmRunner
from slurm_elastic.types import JobView

RESET = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
UNSET = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE")
_CPUS = re.compile(r"^(\d+)")


def read_job(job_id: int, runner: SlurmRunner | None = None) -> JobView:
    """This job as ``scontrol -o show job`` sees it now (one ~5 ms call)."""
    run = runner or SlurmRunner(timeout_s=15.0)
    try:
        out = run.read(["scontrol", "-o", "show", "job", str(job_id)]).stdout
        views = [v for v in parse_scontrol_jobs(out) if v.job_id == job_id]
    except SlurmElasticError as exc:
        raise AgentError(f"cannot read job {job_id} from Slurm: {exc}") from None
    if not views:
        raise AgentError(f"Slurm does not know job {job_id}")
    return views[0]


def effective_nodes(job_id: int, runner: SlurmRunner | None = None) -> int:
    """Nodes the training runs on: the job's own plus its running companions' (one call).

    Only this user's jobs are read (``--me``: a companion has its parent's owner, and
    another user's job naming this one as its parent must not count), split at a separator
    made for the call, so that no comment's newline can add a row."""
    run = runner or SlurmRunner(timeout_s=15.0)
    separator = new_separator()
    fields = ("%i", "%D", "%k")
    argv = ["squeue", "-h", "--me", "-t", "RUNNING", "-o", "".join(f + separator for f in fields)]
    try:
        out = run.read(argv, label="squeue --me").stdout
        rows = split_rows(out, separator, len(fields), "squeue --me")
    except SlurmElasticError as exc:
        raise AgentError(f"cannot read the queue: {exc}") from None
    total = 0
    for job, count, comment in rows:
        if not count.strip().isdigit():
            continue
        if job.strip() == str(job_id) or companion_parent(comment) == job_id:
            total += int(count)
    return total


def still_running(job_ids: tuple[int, ...], runner: SlurmRunner | None = None) -> set[int]:
    """Which of this user's ``job_ids`` Slurm still shows running (completing counts)."""
    if not job_ids:
        return set()
    run = runner or SlurmRunner(timeout_s=15.0)
    ids = ",".join(map(str, job_ids))
    argv = ["squeue", "-h", "--me", "-t", "RUNNING,COMPLETING", "-j", ids, "-o", "%i"]
    try:
        out = run.read(argv, label="squeue --me -j").stdout
    except SlurmElasticError as exc:
        raise AgentError(f"cannot read the queue: {exc}") from None
    listed = {line.strip() for line in out.splitlines()}
    return {j for j in job_ids if str(j) in listed}


def running_steps(job_id: int, runner: SlurmRunner | None = None) -> list[str]:
    """The job's steps other than ``batch`` and ``extern`` (``"80.0"``), as squeue lists them."""
    run = runner or SlurmRunner(timeout_s=15.0)
    try:
        out = run.read(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i"]).stdout
    except SlurmElasticError as exc:
        raise AgentError(f"cannot list the steps of job {job_id}: {exc}") from None
    steps = [line.strip() for line in out.splitlines()]
    return [s for s in steps if s.startswith(f"{job_id}.") and s.split(".")[1].isdigit()]


def cpus_per_node(value: str) -> int | None:
    """First count of ``SLURM_JOB_CPUS_PER_NODE`` (``4(x3)`` or ``4,2``); None if absent."""
    match = _CPUS.match(value.strip())
    return int(match.group(1)) if match else None


def srun_env(env: Mapping[str, str], nodes: tuple[str, ...]) -> dict[str, str]:
    """``env`` corrected to describe an allocation of exactly ``nodes``."""
    if not nodes:
        raise AgentError("the job holds no nodes: nothing to launch on")
    out = dict(env)
    compressed = hostlist.collect_hostlist(list(nodes))
    count = str(len(nodes))
    out.update(
        {
            "SLURM_NNODES": count,
            "SLURM_JOB_NUM_NODES": count,
            "SLURM_JOB_NODELIST": compressed,
            "SLURM_NODELIST": compressed,
        }
    )
    cpus = cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""))
    if cpus is not None:
        out["SLURM_JOB_CPUS_PER_NODE"] = f"{cpus}(x{len(nodes)})"
    for key in UNSET:
        out.pop(key, None)
    return out
