"""Normaliser for the object-number JSON generations: data_parser v0.0.40 to v0.0.45.

Slurm 24.11 writes v0.0.40-v0.0.42 (default v0.0.42), 26.05 v0.0.42-v0.0.45 (default
v0.0.45).  Pure functions from the decoded document to the same ``types`` dataclasses
as :mod:`slurm_elastic.slurm.parse_v0038`, with the same meaning
(:mod:`slurm_elastic.slurm.semantics`).  The dispatcher in
:mod:`slurm_elastic.slurm.parse_json` picks this module from ``meta.plugin.data_parser``
(``meta.plugin.type`` is ``""`` in these generations).

What changed from v0.0.38 (22.05), all handled by the decoders of
:mod:`slurm_elastic.slurm.convert` or below (measured on 24.11.5 and 26.05.5):

* Numbers are ``{"set", "infinite", "number"}`` objects (``node_count``, ``max_nodes``,
  every ``*_time``, ``time_limit``, ``het_job_id``/``het_job_offset``, sacct's
  ``het.job_offset``); unset and unlimited both read as None (``cv.number``).  sacct's
  ``time.*`` and ``het.job_id`` stay plain integers.
* ``job_state`` and sacct's ``state.current`` are lists: ``["RUNNING"]``, and
  ``["PENDING", "RESIZING"]`` for sacct's record of an earlier allocation of a resized
  job (22.05: ``RESIZING``); ``cv.job_state`` reads them as Slurm's text does.
* A node's ``state`` is one list (``["ALLOCATED", "DRAIN"]``, ``["MIXED"]``); there is
  no ``state_flags``.
* ``sinfo --json`` no longer lists nodes one by one: its ``sinfo`` records group nodes
  by partition and state, without per-node allocation.  Per-node records come from
  ``scontrol --json show nodes`` (new in these versions), the source of
  :func:`parse_nodes`; a ``sinfo --json`` document handed to it is refused by name.
* Empty comments are ``""`` (v0.0.38: null); ``show_flags`` is gone (unused anyway).
* The pending-job quirk is unchanged: ``-N2-4`` shows ``node_count`` 4 and
  ``max_nodes`` 4 once the scheduler has looked at it, ``tres_req_str`` ``node=2``.
* ``squeue --json`` honours ``-j``/``-t`` and leaves ended jobs out unless asked
  (``-t all``, which the CLI backend passes on every version).

Between v0.0.40 and v0.0.45 no field read here changed name, type or meaning (checked
on every fixture under ``tests/fixtures/slurm/{24.11,26.05}``).  What did change is
unread: v0.0.41 reshaped ``job_resources`` and added ``time.planned`` and the std*
paths to sacct; v0.0.42 dropped ``show_flags``/``exclusive``/``oversubscribe`` from
jobs and added ``restart_cnt``/``qosreq`` to sacct; v0.0.43 added ``segment_size``,
``licenses_allocated``, ``topology`` and TLS fields; v0.0.44 ``step_id`` and
``submit_line``; v0.0.45 ``sluid``, ``reason_set_by_user`` (sinfo), per-node
``suspend_time`` and dropped ``power.flags`` and ``tres_weighted``.  A later change to a
field read here belongs in this module, named by generation where it is handled.
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

PLUGIN_TYPES = tuple(f"data_parser/v0.0.{minor}" for minor in range(40, 46))
# Where per-node records come from in the Slurm versions that write this generation, and
# the command showing one job in this JSON (its document has squeue's shape, an unknown id
# gives no jobs and exit status 0).
JOB_COMMAND: tuple[str, ...] | None = ("scontrol", "--json", "show", "job")
NODES_COMMAND = ("scontrol", "--json", "show", "nodes")


def parse_squeue(doc: Mapping[str, Any], what: str = "squeue --json") -> tuple[JobView, ...]:
    """Jobs of a ``squeue --json`` document (or another of its shape, named by ``what``)."""
    jobs = cv.as_list(cv.field(doc, "jobs", what), f"{what}: jobs")
    return tuple(job_view(cv.mapping(j, f"{what}: jobs[{i}]"), i, what) for i, j in enumerate(jobs))


def parse_nodes(doc: Mapping[str, Any]) -> tuple[NodeView, ...]:
    """Nodes of a ``scontrol --json show nodes`` document (see the module docstring)."""
    what = "scontrol --json show nodes"
    if "nodes" not in doc and "sinfo" in doc:
        raise SlurmParseError(
            "sinfo --json lists no nodes one by one in JSON generations v0.0.40+ "
            f"(Slurm 24.11+): read them with {' '.join(NODES_COMMAND)}"
        )
    nodes = cv.as_list(cv.field(doc, "nodes", what), f"{what}: nodes")
    return tuple(_node(cv.mapping(n, f"{what}: nodes[{i}]"), i) for i, n in enumerate(nodes))


def parse_sacct_records(doc: Mapping[str, Any]) -> tuple[AcctRecord, ...]:
    """Records of a ``sacct --json`` document; one that does not parse is left out."""
    jobs = cv.as_list(cv.field(doc, "jobs", "sacct --json"), "sacct --json: jobs")
    return history.records(jobs, _acct, "sacct --json")


def parse_sacct(doc: Mapping[str, Any]) -> tuple[JobHistory, ...]:
    return collapse(parse_sacct_records(doc))


def _node(raw: Mapping[str, Any], index: int) -> NodeView:
    what = "scontrol --json show nodes"
    name = cv.as_str(cv.field(raw, "name", f"{what}: nodes[{index}]"), "name")
    where = f"{what}: node {name or index}"
    if not name:
        raise SlurmParseError(f"{where}: empty node name")
    state, flags = cv.node_state(cv.field(raw, "state", where), None, f"{where}: state")
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
    comment = cv.mapping(raw.get("comment") or {}, f"{where}: comment")
    het = cv.mapping(raw.get("het") or {}, f"{where}: het")
    het_job_id = cv.number(het.get("job_id"), f"{where}: het.job_id") or None
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
            cv.number(het.get("job_offset"), f"{where}: het.job_offset")
            if het_job_id is not None
            else None
        ),
        # 26.05 (data_parser v0.0.45): constant across a job's resize records.
        original_sluid=cv.as_str(raw.get("original_sluid"), f"{where}: original_sluid"),
    )
