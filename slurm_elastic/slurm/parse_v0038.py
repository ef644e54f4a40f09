"""Normaliser for Slurm 22.05's JSON generation (openapi v0.0.38 / dbv0.0.38).

Pure functions from the decoded JSON document to ``types`` dataclasses.  The
dispatcher in :mod:`slurm_elastic.slurm.parse_json` picks this module from
``meta.plugin.type``; a later Slurm generation gets its own module beside it,
written from real samples of that version.

Quirks of this generation handled here (measured on 22.05.8):

* ``squeue --json`` ignores every filter and also lists jobs that ended within
  MinJobAge; callers filter client-side.
* A pending job's ``node_count`` is NOT its requested minimum: once slurmctld has
  looked at the job it reports its own node-count estimate (``-N2-3`` shows 3, and
  ``scontrol`` says ``NumNodes=3-3``).  The requested minimum survives only in
  ``tres_req_str`` (``node=2``), so that is what ``min_nodes`` is taken from
  (:mod:`slurm_elastic.slurm.semantics`, shared with every other parser);
  ``max_nodes`` is the requested maximum (0 = none given; also 0 for a running job,
  and for a requeued job pending again, which 24.11+ and ``squeue -O`` still show).  A
  running job's ``node_count`` is its allocation.
* Times are POSIX seconds with 0 meaning "not set"; ``time_limit`` is minutes,
  null or >= 525600 meaning unlimited.  A pending job's start/end times are the
  scheduler's estimates and an unlimited running job's end time is start + 1 year:
  both become None, matching what ``scontrol``/``squeue -O`` print.
* Numbers are plain integers, the job state one string (``RESIZING`` for a resize
  record), a node's state a string plus ``state_flags``; the decoders in
  :mod:`slurm_elastic.slurm.convert` also take the v0.0.40+ forms.
* ``sinfo --json`` lists nodes one by one (the source of :func:`parse_nodes`).
* ``het_job_id`` is 0 for ordinary jobs; a heterogeneous component carries its
  own raw ``job_id`` and the leader's id in ``het_job_id``.
* sacct: see :mod:`slurm_elastic.slurm.history` for the resize records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import history
from slurm_elastic.slurm.history import AcctRecord, collapse
from slurm_elastic.slurm.json_job import job_view
from slurm_elastic.types import JobHistory, JobView, NodeView

PLUGIN_TYPES = ("openapi/v0.0.38", "openapi/dbv0.0.38")
# Where per-node records come from in the Slurm versions that write this generation, and
# the command showing one job in this JSON: none, 22.05's scontrol has no --json.
JOB_COMMAND: tuple[str, ...] | None = None
NODES_COMMAND = ("sinfo", "--json")


def parse_squeue(doc: Mapping[str, Any], what: str = "squeue --json") -> tuple[JobView, ...]:
    """Jobs of a ``squeue --json`` document (or another of its shape, named by ``what``)."""
    jobs = cv.as_list(cv.field(doc, "jobs", what), f"{what}: jobs")
    return tuple(job_view(cv.mapping(j, f"{what}: jobs[{i}]"), i, what) for i, j in enumerate(jobs))


def parse_nodes(doc: Mapping[str, Any]) -> tuple[NodeView, ...]:
    """Nodes of a ``sinfo --json`` document: this generation lists them one by one."""
    nodes = cv.as_list(cv.field(doc, "nodes", "sinfo --json"), "sinfo --json: nodes")
    return tuple(_node(cv.mapping(n, f"sinfo --json: nodes[{i}]"), i) for i, n in enumerate(nodes))


def parse_sacct_records(doc: Mapping[str, Any]) -> tuple[AcctRecord, ...]:
    """Records of a ``sacct --json`` document; one that does not parse is left out."""
    jobs = cv.as_list(cv.field(doc, "jobs", "sacct --json"), "sacct --json: jobs")
    return history.records(jobs, _acct, "sacct --json")


def parse_sacct(doc: Mapping[str, Any]) -> tuple[JobHistory, ...]:
    return collapse(parse_sacct_records(doc))


def _node(raw: Mapping[str, Any], index: int) -> NodeView:
    name = cv.as_str(cv.field(raw, "name", f"sinfo --json: nodes[{index}]"), "name")
    where = f"sinfo --json: node {name or index}"
    if not name:
        raise SlurmParseError(f"{where}: empty node name")
    state, flags = cv.node_state(cv.field(raw, "state", where), raw.get("state_flags"), where)
    partitions = cv.as_list(raw.get("partitions") or [], f"{where}: partitions")
    return NodeView(
        name=name,
        state=state,
        flags=flags,
        cpus=cv.as_int(cv.field(raw, "cpus", where), f"{where}: cpus"),
        alloc_cpus=cv.as_int(raw.get("alloc_cpus"), f"{where}: alloc_cpus", default=0),
        gpus=cv.gres_gpus(raw.get("gres"), f"{where}: gres"),
        alloc_gpus=cv.gres_gpus(raw.get("gres_used"), f"{where}: gres_used"),
        partitions=tuple(cv.as_str(p, f"{where}: partitions") for p in partitions),
        reason=cv.as_str(raw.get("reason"), f"{where}: reason"),
        gpu_type=cv.gres_gpu_type(raw.get("gres"), f"{where}: gres"),
    )


def _acct(raw: Any, index: int) -> AcctRecord:
    raw = cv.mapping(raw, f"sacct --json: jobs[{index}]")
    job_id = cv.as_int(cv.field(raw, "job_id", f"sacct --json: jobs[{index}]"), "job_id")
    where = f"sacct --json: job {job_id} (record {index})"
    state = cv.mapping(cv.field(raw, "state", where), f"{where}: state")
    times = cv.mapping(cv.field(raw, "time", where), f"{where}: time")
    comment = raw.get("comment") or {}
    comment = cv.mapping(comment, f"{where}: comment")
    het = cv.mapping(raw.get("het") or {}, f"{where}: het")
    het_job_id = cv.opt_int(het.get("job_id"), f"{where}: het.job_id") or None
    return AcctRecord(
        job_id=job_id,
        name=cv.as_str(raw.get("name"), f"{where}: name"),
        user=cv.as_str(raw.get("user"), f"{where}: user"),
        account=cv.as_str(raw.get("account"), f"{where}: account"),
        partition=cv.as_str(raw.get("partition"), f"{where}: partition"),
        state=cv.job_state(cv.field(state, "current", where), f"{where}: state.current"),
        submit_time=cv.epoch(times.get("submission"), f"{where}: time.submission"),
        start_time=cv.epoch(times.get("start"), f"{where}: time.start"),
        end_time=cv.epoch(times.get("end"), f"{where}: time.end"),
        node_count=cv.as_int(raw.get("allocation_nodes"), f"{where}: allocation_nodes", default=0),
        nodes=cv.nodes(raw.get("nodes"), f"{where}: nodes"),
        comment=cv.as_str(comment.get("job"), f"{where}: comment.job"),
        work_dir=cv.as_str(raw.get("working_directory"), f"{where}: working_directory"),
        het_job_id=het_job_id,
        het_job_offset=(
            cv.opt_int(het.get("job_offset"), f"{where}: het.job_offset")
            if het_job_id is not None
            else None
        ),
    )
