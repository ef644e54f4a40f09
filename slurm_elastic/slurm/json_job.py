"""One JSON job record -> JobView, for every JSON generation (v0.0.38 to v0.0.45).

A job record has the same field names in every generation; only how numbers and states
are written differs, and :mod:`slurm_elastic.slurm.convert` reads both ways alike
(``cv.number``: v0.0.38's plain integers with NO_VAL/INFINITE, and v0.0.40+'s
``{set, infinite, number}`` objects; ``cv.job_state``: a string or a list).  What a
value means (a pending job's minimum, known times, GPUs per node) is
:mod:`slurm_elastic.slurm.semantics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import semantics
from slurm_elastic.types import JobView


def job_view(raw: Mapping[str, Any], index: int, what: str) -> JobView:
    """One job record of ``squeue --json`` / ``scontrol --json show job`` -> JobView."""
    job_id = cv.as_int(cv.field(raw, "job_id", f"{what}: jobs[{index}]"), "job_id")
    where = f"{what}: job {job_id}"

    def get(key: str) -> Any:
        return cv.field(raw, key, where)

    state = cv.job_state(get("job_state"), f"{where}: job_state")
    node_count = cv.number(get("node_count"), f"{where}: node_count") or 0
    tres_req = cv.as_str(raw.get("tres_req_str"), f"{where}: tres_req_str")
    node_count = semantics.requested_min_nodes(state, node_count, tres_req, where)
    max_nodes = cv.number(get("max_nodes"), f"{where}: max_nodes")
    het_job_id = cv.number(raw.get("het_job_id"), f"{where}: het_job_id") or None
    time_limit = cv.limit_minutes(raw.get("time_limit"), f"{where}: time_limit")
    start, end = semantics.known_times(
        state,
        cv.epoch(raw.get("start_time"), f"{where}: start_time"),
        cv.epoch(raw.get("end_time"), f"{where}: end_time"),
        time_limit,
    )
    gpus = semantics.gpus_per_node(
        state,
        node_count,
        tres_alloc=cv.as_str(raw.get("tres_alloc_str"), f"{where}: tres_alloc_str"),
        tres_per_node=cv.as_str(raw.get("tres_per_node"), f"{where}: tres_per_node"),
        tres_per_job=cv.as_str(raw.get("tres_per_job"), f"{where}: tres_per_job"),
        where=where,
    )
    return JobView(
        job_id=job_id,
        name=cv.as_str(get("name"), f"{where}: name"),
        user=cv.as_str(get("user_name"), f"{where}: user_name"),
        user_id=cv.number(raw.get("user_id"), f"{where}: user_id"),
        account=cv.as_str(get("account"), f"{where}: account"),
        partition=cv.as_str(get("partition"), f"{where}: partition"),
        qos=cv.as_str(raw.get("qos"), f"{where}: qos"),
        state=state,
        state_reason=cv.as_str(raw.get("state_reason"), f"{where}: state_reason"),
        node_count=node_count,
        min_nodes=node_count,
        max_nodes=max_nodes or None,
        nodes=cv.nodes(get("nodes"), f"{where}: nodes"),
        batch_host=cv.as_str(raw.get("batch_host"), f"{where}: batch_host") or None,
        comment=cv.as_str(get("comment"), f"{where}: comment"),
        admin_comment=cv.as_str(raw.get("admin_comment"), f"{where}: admin_comment"),
        submit_time=cv.epoch(raw.get("submit_time"), f"{where}: submit_time"),
        start_time=start,
        end_time=end,
        resize_time=cv.epoch(raw.get("resize_time"), f"{where}: resize_time"),
        time_limit_s=time_limit,
        restart_count=cv.number(raw.get("restart_cnt"), f"{where}: restart_cnt") or 0,
        priority=cv.number(raw.get("priority"), f"{where}: priority"),
        eligible_time=semantics.pending_only(
            state, cv.epoch(raw.get("eligible_time"), f"{where}: eligible_time")
        ),
        gpus_per_node=gpus,
        het_job_id=het_job_id,
        het_job_offset=(
            cv.number(raw.get("het_job_offset"), f"{where}: het_job_offset") or 0
            if het_job_id is not None
            else None
        ),
        work_dir=cv.as_str(
            raw.get("current_working_directory"), f"{where}: current_working_directory"
        ),
        dependency=cv.as_str(raw.get("dependency"), f"{where}: dependency"),
        stepmgr=STEPMGR_FLAG in _flags(raw.get("flags"), f"{where}: flags"),
    )


STEPMGR_FLAG = "STEPMGR_ENABLED"  # v0.0.40+ job flags (24.05+); 22.05 has no step manager


def _flags(value: Any, where: str) -> tuple[str, ...]:
    """A job record's ``flags``: a list of names (v0.0.40+); absent (v0.0.38) is none."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SlurmParseError(f"{where}: not a list: {cv.short(value, 60)}")
    return tuple(cv.as_str(v, where) for v in value)
