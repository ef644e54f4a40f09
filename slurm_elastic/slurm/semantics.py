"""What Slurm's job fields mean, the same for every output format and version.

The parsers differ in how they *decode* a field (JSON generation, text column); what a
decoded value *means* is decided here once, so that ``squeue --json`` of any generation,
``squeue -O`` and ``scontrol -o show job`` give the same JobView for the same job:

* A pending job's node count is NOT its requested minimum.  Once slurmctld has looked
  at the job it reports its own estimate (``-N2-4`` shows node_count 4, ``scontrol``
  ``NumNodes=4-4``, ``squeue -O NumNodes`` 4) -- measured on 22.05.8, 24.11.5 and 26.05.5
  alike.  The request survives only in the requested TRES (``node=2`` in JSON's
  ``tres_req_str``, scontrol's ``TRES=`` (22.05) / ``ReqTRES=`` (24.11+), and
  ``squeue -O tres-alloc``, which shows the request while the job pends).
* A pending job's start/end times are the scheduler's guesses, and an unlimited running
  job's end time is start + 1 year: both are "not known" (None).
* A pending job's eligible time is when Slurm may start it at the earliest: its begin
  time while ``Reason=BeginTime`` (``sbatch --begin``, or the delay after a requeue),
  otherwise a time past.  Once a job runs it says nothing more (None).
* GPUs per node: a running job's allocation is the truth (exclusive partitions hand out
  every GPU of a node); a pending job only has its request.
"""

from __future__ import annotations

from slurm_elastic.slurm import convert as cv
from slurm_elastic.types import JobState

# States in which a job holds its allocation.
HOLDS_NODES = frozenset({JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING})


def requested_min_nodes(state: JobState, node_count: int, tres_req: str, where: str) -> int:
    """A pending job's requested minimum (from its requested TRES); otherwise its count."""
    if state is JobState.PENDING:
        return cv.tres_count(tres_req, "node", f"{where}: requested TRES") or node_count
    return node_count


def known_times(
    state: JobState, start: float | None, end: float | None, time_limit_s: float | None
) -> tuple[float | None, float | None]:
    """(start, end) with Slurm's guesses removed (see the module docstring)."""
    if state is JobState.PENDING:
        return None, None
    if state in HOLDS_NODES and time_limit_s is None:
        return start, None
    return start, end


def pending_only(state: JobState, value: float | None) -> float | None:
    """A field that means something only while the job is pending (``eligible_time``)."""
    return value if state is JobState.PENDING else None


def gpus_per_node(
    state: JobState,
    node_count: int,
    *,
    tres_alloc: str,
    tres_per_node: str,
    tres_per_job: str = "",
    where: str,
) -> int:
    """GPUs per node from the allocation (running), else from the request."""
    if state in HOLDS_NODES and node_count > 0:
        total = cv.tres_count(tres_alloc, "gres/gpu", f"{where}: allocated TRES")
        if total:
            return total // node_count
    per_node = cv.gres_gpus(tres_per_node, f"{where}: TRES per node")
    if per_node:
        return per_node
    per_job = cv.gres_gpus(tres_per_job, f"{where}: TRES per job")
    return per_job // node_count if per_job and node_count else 0
