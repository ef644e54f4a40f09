"""Pure parsers for Slurm's text outputs (the fast paths, and what has no JSON in 22.05).

* ``scontrol -o show partition`` / ``scontrol -o show job``: one ``Key=Value``
  line per record.  Values may contain spaces (``Comment=a b``) and even
  ``x=y``, so lines are split at *known* keys: after a free-text key only a
  known key ends the value; each key is taken once (its first occurrence).
* ``squeue -h -o SQUEUE_FORMAT`` and ``sacct -P -n -o SACCT_FIELDS``: ``|``
  separated, the free-text comment last so a ``|`` inside it survives.

Text timestamps are in the local time zone of the machine running the
command (Slurm prints local time); they are converted with the same zone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm.history import AcctRecord, collapse
from slurm_elastic.types import JobHistory, JobState, JobView, PartitionView


def _keys(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Keys of `scontrol -o show job` in 22.05 (both always-present and optional ones).
JOB_KEYS = _keys(
    """JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet
    JobName UserId GroupId MCS_label Priority Nice Account QOS JobState Reason Dependency
    Requeue Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin
    SubmitTime EligibleTime AccrueTime ResizeTime StartTime EndTime Deadline SuspendTime
    SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList ExcNodeList
    NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES Socks/Node
    NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode
    Features Prefer DelayBoot OverSubscribe Contiguous Licenses Network Command WorkDir
    AdminComment SystemComment Comment StdErr StdIn StdOut Power TresPerNode TresPerJob
    TresPerSocket TresPerTask CpusPerTres MemPerTres TresBind TresFreq Reservation
    Clusters ClusterFeatures BurstBuffer BurstBufferState CpusPerTask MailUser MailType
    JOB_GRES NtasksPerTRES Container KillOInInvalidDependent SpreadJob"""
)
# Values of these keys are free text: only a known key may end them.
_FREE_TEXT = _keys(
    "JobName Comment AdminComment SystemComment Command WorkDir StdErr StdIn StdOut Reason "
    "Dependency Features Prefer"
)
PARTITION_KEYS = _keys(
    """PartitionName AllowGroups AllowAccounts AllowQos AllocNodes Default QoS DefaultTime
    DisableRootJobs ExclusiveUser GraceTime Hidden MaxNodes MaxTime MinNodes LLN
    MaxCPUsPerNode Nodes PriorityJobFactor PriorityTier RootOnly ReqResv OverSubscribe
    OverTimeLimit PreemptMode State TotalCPUs TotalNodes SelectTypeParameters JobDefaults
    DefMemPerNode MaxMemPerNode TRES TRESBillingWeights DenyAccounts DenyQos
    Alternate DefMemPerCPU MaxMemPerCPU"""
)

_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z_][\w:/]*)=")


def parse_keyvalue_line(
    line: str, known: frozenset[str], where: str, *, free_text: frozenset[str] = _FREE_TEXT
) -> dict[str, str]:
    """Split one ``Key=Value Key2=Value two`` line into a dict (values stripped)."""
    fields: dict[str, str] = {}
    current: str | None = None
    value_start = 0
    for match in _KEY.finditer(line):
        key = match.group(1)
        if current is None and match.start() != 0:
            raise SlurmParseError(f"{where}: line does not start with Key=Value")
        if current is not None:
            ends_value = key in known if current in free_text else True
            if not ends_value or key in fields or key == current:
                continue  # part of the current value (e.g. a comment containing "x=y")
            fields[current] = line[value_start : match.start()].strip()
        current, value_start = key, match.end()
    if current is None:
        raise SlurmParseError(f"{where}: no Key=Value pairs in {cv.short(line)}")
    fields[current] = line[value_start:].strip()
    return fields


def _records(text: str, what: str, first_key: str, known: frozenset[str]) -> list[dict[str, str]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.strip().startswith("No jobs in the system") or line.startswith("No partitions"):
            continue
        where = f"{what}: line {number}"
        fields = parse_keyvalue_line(line.strip(), known, where)
        if first_key not in fields:
            raise SlurmParseError(f"{where}: missing {first_key}")
        records.append(fields)
    return records


def _need(fields: Mapping[str, str], key: str, where: str) -> str:
    try:
        return fields[key]
    except KeyError:
        raise SlurmParseError(f"{where}: missing {key}") from None


def _null(value: str) -> str:
    return "" if value.strip() in {"(null)", "N/A", "n/a", "(None)"} else value


# --------------------------------------------------------------------------- partitions


def parse_scontrol_partitions(text: str) -> tuple[PartitionView, ...]:
    views = []
    for fields in _records(text, "scontrol show partition", "PartitionName", PARTITION_KEYS):
        name = fields["PartitionName"]
        where = f"scontrol show partition: {name}"
        oversubscribe = fields.get("OverSubscribe", "NO").upper()
        views.append(
            PartitionView(
                name=name,
                nodes=cv.nodes(_null(fields.get("Nodes", "")), f"{where}: Nodes"),
                is_default=fields.get("Default", "NO").upper() == "YES",
                exclusive=oversubscribe.startswith("EXCLUSIVE"),
                state=_need(fields, "State", where).upper(),
                max_time_s=cv.duration_text(fields.get("MaxTime", "UNLIMITED"), where),
            )
        )
    return tuple(views)


# --------------------------------------------------------------------------- scontrol jobs

_USER = re.compile(r"^(?P<name>.*?)\((?P<id>\d+)\)$")


def _user(value: str) -> tuple[str, int | None]:
    match = _USER.match(value)
    if match is None:
        return value, None
    return match["name"], int(match["id"])


def _node_range(value: str, where: str) -> tuple[int, int | None]:
    low, sep, high = value.partition("-")
    first = cv.as_int(low, where)
    return first, (cv.as_int(high, where) if sep else None)


def parse_scontrol_jobs(text: str) -> tuple[JobView, ...]:
    views = []
    for fields in _records(text, "scontrol show job", "JobId", JOB_KEYS):
        job_id = cv.as_int(fields["JobId"], "scontrol show job: JobId")
        where = f"scontrol show job {job_id}"
        user, uid = _user(_need(fields, "UserId", where))
        state = cv.job_state(_need(fields, "JobState", where), f"{where}: JobState")
        low, high = _node_range(_need(fields, "NumNodes", where), f"{where}: NumNodes")
        tres = fields.get("TRES", "")
        if state is JobState.PENDING:
            # NumNodes of a pending job is slurmctld's estimate; TRES keeps the request.
            low = cv.tres_count(tres, "node", f"{where}: TRES") or low
        het_id = cv.opt_int(fields.get("HetJobId"), f"{where}: HetJobId")
        limit = cv.duration_text(fields.get("TimeLimit", "UNLIMITED"), f"{where}: TimeLimit")
        gpus = cv.gres_gpus(_null(fields.get("TresPerNode", "")), f"{where}: TresPerNode")
        if state is JobState.RUNNING and low:
            gpus = cv.tres_count(tres, "gres/gpu", f"{where}: TRES") // low or gpus
        views.append(
            JobView(
                job_id=job_id,
                name=_null(fields.get("JobName", "")),
                user=user,
                user_id=uid,
                account=_null(fields.get("Account", "")),
                partition=_null(fields.get("Partition", "")),
                qos=_null(fields.get("QOS", "")),
                state=state,
                state_reason=fields.get("Reason", ""),
                node_count=low,
                min_nodes=low,
                max_nodes=high,
                nodes=cv.nodes(_null(fields.get("NodeList", "")), f"{where}: NodeList"),
                batch_host=_null(fields.get("BatchHost", "")) or None,
                comment=_null(fields.get("Comment", "")),
                admin_comment=_null(fields.get("AdminComment", "")),
                submit_time=cv.timestamp_text(fields.get("SubmitTime", ""), where),
                start_time=_started(fields.get("StartTime", ""), state, where),
                end_time=_ends(fields.get("EndTime", ""), state, limit, where),
                resize_time=cv.timestamp_text(_null(fields.get("ResizeTime", "")), where),
                time_limit_s=limit,
                restart_count=cv.as_int(fields.get("Restarts", "0"), f"{where}: Restarts"),
                gpus_per_node=gpus,
                het_job_id=het_id,
                het_job_offset=(
                    cv.opt_int(fields.get("HetJobOffset"), f"{where}: HetJobOffset")
                    if het_id is not None
                    else None
                ),
                work_dir=_null(fields.get("WorkDir", "")),
                dependency=_null(fields.get("Dependency", "")),
            )
        )
    return tuple(views)


def _started(value: str, state: JobState, where: str) -> float | None:
    # A pending job's StartTime/EndTime are the scheduler's estimates, not facts.
    if state is JobState.PENDING:
        return None
    return cv.timestamp_text(value, where)


_RUNNING_LIKE = frozenset({JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING})


def _ends(value: str, state: JobState, limit_s: float | None, where: str) -> float | None:
    # As parse_v0038: a running job without a limit (or one of a year or more) has no end;
    # Slurm prints start + 1 year.  Keeps read_job (scontrol) equal to read_jobs (JSON).
    if state in _RUNNING_LIKE and limit_s is None:
        return None
    return _started(value, state, where)


# --------------------------------------------------------------------------- squeue -o

# %A raw id, %i display id ("25+1" for a het component), then the JobView fields; the
# free-text comment comes last so that a "|" inside it survives.
_SQUEUE_COLUMNS = (
    ("raw_id", "%A"), ("shown_id", "%i"), ("state", "%T"), ("count", "%D"),
    ("nodelist", "%N"), ("batch", "%B"), ("limit", "%l"), ("submit", "%V"), ("start", "%S"),
    ("end", "%e"), ("reason", "%r"), ("user", "%u"), ("uid", "%U"), ("account", "%a"),
    ("partition", "%P"), ("qos", "%q"), ("workdir", "%Z"), ("dependency", "%E"),
    ("name", "%j"), ("comment", "%k"),
)  # fmt: skip
SQUEUE_FORMAT = "|".join(code for _, code in _SQUEUE_COLUMNS)
SQUEUE_COLUMNS = tuple(name for name, _ in _SQUEUE_COLUMNS)


def _split_row(line: str, names: tuple[str, ...], where: str) -> dict[str, str]:
    # The last column is free text: split at most len-1 times so a "|" inside it survives.
    parts = line.split("|", len(names) - 1)
    if len(parts) != len(names):
        raise SlurmParseError(
            f"{where}: expected {len(names)} '|'-separated fields, got {len(parts)}"
        )
    return dict(zip(names, parts, strict=True))


def parse_squeue_text(text: str) -> tuple[JobView, ...]:
    views = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _split_row(line, SQUEUE_COLUMNS, f"squeue -o: line {number}")
        job_id = cv.as_int(row["raw_id"], f"squeue -o: line {number}: job id")
        where = f"squeue -o: job {job_id}"
        state = cv.job_state(row["state"], f"{where}: state")
        low, high = _node_range(row["count"], f"{where}: nodes")
        het_id, het_offset = _het_from_display(row["shown_id"], where)
        limit = cv.duration_text(row["limit"], f"{where}: time limit")
        views.append(
            JobView(
                job_id=job_id,
                name=row["name"],
                user=row["user"],
                user_id=cv.opt_int(row["uid"], f"{where}: uid"),
                account=row["account"],
                partition=row["partition"],
                qos=row["qos"],
                state=state,
                state_reason=row["reason"],
                node_count=low,
                min_nodes=low,
                max_nodes=high,
                # squeue prints the scheduler's planned nodes for a pending job: not held.
                nodes=cv.nodes("" if state is JobState.PENDING else row["nodelist"], where),
                batch_host=_null(row["batch"]) or None,
                comment=_null(row["comment"]),
                submit_time=cv.timestamp_text(row["submit"], f"{where}: submit"),
                start_time=_started(row["start"], state, f"{where}: start"),
                end_time=_ends(row["end"], state, limit, f"{where}: end"),
                time_limit_s=limit,
                het_job_id=het_id,
                het_job_offset=het_offset,
                work_dir=row["workdir"],
                dependency=_null(row["dependency"]),
            )
        )
    return tuple(views)


def _het_from_display(shown: str, where: str) -> tuple[int | None, int | None]:
    leader, plus, offset = shown.partition("+")
    if not plus:
        return None, None
    return cv.as_int(leader, f"{where}: het id"), cv.as_int(offset, f"{where}: het offset")


# --------------------------------------------------------------------------- sacct -P

SACCT_FIELDS = (
    "jobid", "jobidraw", "state", "nnodes", "nodelist", "submit", "start", "end",
    "user", "account", "partition", "workdir", "jobname", "comment",
)  # fmt: skip


def parse_sacct_text_records(text: str) -> tuple[AcctRecord, ...]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _split_row(line, SACCT_FIELDS, f"sacct -P: line {number}")
        if "." in row["jobidraw"]:
            continue  # a step row (when called without -X): not an allocation
        job_id = cv.as_int(row["jobidraw"], f"sacct -P: line {number}: jobidraw")
        where = f"sacct -P: job {job_id}"
        het_id, het_offset = _het_from_display(row["jobid"], where)
        state = cv.job_state(row["state"], f"{where}: state")
        records.append(
            AcctRecord(
                job_id=job_id,
                name=row["jobname"],
                user=row["user"],
                account=row["account"],
                partition=row["partition"],
                state=state,
                submit_time=cv.timestamp_text(row["submit"], f"{where}: submit"),
                start_time=cv.timestamp_text(row["start"], f"{where}: start"),
                end_time=cv.timestamp_text(row["end"], f"{where}: end"),
                node_count=cv.as_int(row["nnodes"] or "0", f"{where}: nnodes"),
                nodes=cv.nodes("" if state is JobState.PENDING else row["nodelist"], where),
                comment=_null(row["comment"]),
                work_dir=row["workdir"],
                het_job_id=het_id,
                het_job_offset=het_offset,
            )
        )
    return tuple(records)


def parse_sacct_text(text: str) -> tuple[JobHistory, ...]:
    return collapse(parse_sacct_text_records(text))


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = Value`` lines) -> dict; other lines are skipped."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    if not config:
        raise SlurmParseError("scontrol show config: no 'Key = Value' lines")
    return config
