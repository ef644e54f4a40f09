"""Pure parsers for Slurm's text outputs (the fast paths, and what has no JSON in 22.05).

* ``scontrol -o show partition`` / ``scontrol -o show job``: one ``Key=Value``
  line per record.  Values may contain spaces (``Comment=a b``) and even
  ``x=y``, so lines are split at *known* keys: after a free-text key only a
  known key ends the value; each key is taken once (its first occurrence).
* ``squeue -h -O squeue_format(SEP)`` and ``sacct -p -n --delimiter=SEP -o
  SACCT_FIELDS``: every field, the last one too, followed by ``SEP``, a separator made
  fresh for each call (:func:`new_separator`).  Slurm prints names, comments and working
  directories byte for byte, newlines and ``|`` included, so with a fixed separator a user
  could write a field that reads as more fields or as another job's row (a finished job of
  any user in ``sacct``).  Nobody can write a separator they do not know: split at it,
  every row has exactly its fields, whatever they hold (:func:`split_rows`).

What a job field means (a pending job's requested minimum, Slurm's guessed times) is
decided in :mod:`slurm_elastic.slurm.semantics`, as for the JSON generations.  The text
shapes were checked on 22.05.8, 24.11.5 and 26.05.5; where they differ it is said below.

Text timestamps are in the local time zone of the machine running the
command (Slurm prints local time); they are converted with the same zone.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable, Mapping

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import history, semantics
from slurm_elastic.slurm.history import AcctRecord, collapse
from slurm_elastic.types import JobHistory, JobState, JobView, PartitionView


def _keys(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Keys of `scontrol -o show job` in 22.05 (both always-present and optional ones), then
# those 24.11 added (ReqTRES and AllocTRES replace 22.05's single TRES) and 26.05's
# (Exclusive, LicensesAlloc, SubmitLine).
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
    JOB_GRES NtasksPerTRES Container KillOInInvalidDependent SpreadJob SchedNodeList
    ReqTRES AllocTRES Exclusive LicensesAlloc SubmitLine"""
)
# Values of these keys are free text: only a known key may end them.  26.05's SubmitLine
# is the whole sbatch command line (``--comment=free text JobState=FAKE | pipe`` and all).
_FREE_TEXT = _keys(
    "JobName Comment AdminComment SystemComment Command WorkDir StdErr StdIn StdOut Reason "
    "Dependency Features Prefer SubmitLine"
)
PARTITION_KEYS = _keys(
    """PartitionName AllowGroups AllowAccounts AllowQos AllocNodes Default QoS DefaultTime
    DisableRootJobs ExclusiveUser GraceTime Hidden MaxNodes MaxTime MinNodes LLN
    MaxCPUsPerNode Nodes PriorityJobFactor PriorityTier RootOnly ReqResv OverSubscribe
    OverTimeLimit PreemptMode State TotalCPUs TotalNodes SelectTypeParameters JobDefaults
    DefMemPerNode MaxMemPerNode TRES TRESBillingWeights DenyAccounts DenyQos
    Alternate DefMemPerCPU MaxMemPerCPU Exclusive"""
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


def _logical_lines(text: str, starts_record: Callable[[str], bool]) -> list[tuple[int, str]]:
    """(first line number, record) pairs, lines a free-text value broke joined again.

    Slurm prints free text raw: a comment holding a newline (accepted by sbatch on every
    version), or 26.05's SubmitLine (the whole sbatch line, ``--wrap`` script and all),
    continues on the next line of ``scontrol -o`` output.  A line that does not look like
    the start of a record continues the previous one.  A continuation forged to look like
    a record start stays ambiguous, so the daemon reads no job this way (the backend's
    ``read_job`` uses JSON or ``squeue -O`` with a fresh separator); partitions have no
    user-written field, and the job agent reads only its own job."""
    joined: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if joined and line.strip() and not starts_record(line):
            first, previous = joined[-1]
            joined[-1] = (first, f"{previous}\n{line}")
        else:
            joined.append((number, line))
    return joined


def _records(text: str, what: str, first_key: str, known: frozenset[str]) -> list[dict[str, str]]:
    records = []
    for number, line in _logical_lines(text, lambda line: line.startswith(f"{first_key}=")):
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
        # repr: a name that broken output ran into the next line stays one line of error.
        where = f"scontrol show partition: {cv.short(name)}"
        # Whole-node partitions: "OverSubscribe=EXCLUSIVE" up to 25.x; 26.05 prints the same
        # configuration as "Exclusive=NODE OverSubscribe=NO" (EXCLUSIVE moved to its own key).
        oversubscribe = fields.get("OverSubscribe", "NO").upper()
        exclusive = fields.get("Exclusive", "NO").upper()
        views.append(
            PartitionView(
                name=name,
                nodes=cv.nodes(_null(fields.get("Nodes", "")), f"{where}: Nodes"),
                is_default=fields.get("Default", "NO").upper() == "YES",
                exclusive=oversubscribe.startswith("EXCLUSIVE") or exclusive not in {"NO", ""},
                state=_need(fields, "State", where).upper(),
                max_time_s=cv.duration_text(fields.get("MaxTime", "UNLIMITED"), where),
                max_nodes=_max_nodes(fields.get("MaxNodes", "UNLIMITED"), where),
                qos=_null(fields.get("QoS", "")).strip(),
                # scontrol shows AllowAccounts or DenyAccounts, never both (Slurm ignores
                # the Deny list when an Allow list is set); so for QOS.  A missing Allow
                # key is everyone, a missing Deny key no one.
                allow_groups=cv.allow_list(fields.get("AllowGroups"), f"{where}: AllowGroups"),
                allow_accounts=cv.allow_list(
                    fields.get("AllowAccounts"), f"{where}: AllowAccounts"
                ),
                allow_qos=cv.allow_list(fields.get("AllowQos"), f"{where}: AllowQos"),
                deny_accounts=cv.names(fields.get("DenyAccounts"), f"{where}: DenyAccounts"),
                deny_qos=cv.names(fields.get("DenyQos"), f"{where}: DenyQos"),
            )
        )
    return tuple(views)


def parse_qos_node_limits(text: str) -> dict[str, int]:
    """``sacctmgr -n -P show qos format=Name,MaxTRESPerJob`` -> QOS name -> its per-job
    node limit (``node=`` of MaxTRESPerJob), for the QOS that set one."""
    limits: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, tres = line.partition("|")
        if not sep:
            raise SlurmParseError(f"sacctmgr show qos: line {number}: expected Name|MaxTRESPerJob")
        nodes = cv.tres_count(tres.strip(), "node", f"sacctmgr show qos {name}: MaxTRESPerJob")
        if nodes > 0:
            limits[name.strip()] = nodes
    return limits


def parse_assoc_node_limits(text: str) -> dict[tuple[str, str, str], int]:
    """``sacctmgr -n -P show assoc format=Account,User,Partition,MaxNodes`` (one cluster's)
    -> (account, user, partition) -> the association's per-job node limit, for the user
    associations that have one (partition "" = the association of every partition).

    sacctmgr prints a user association's limits with those it inherits from its accounts
    filled in (unless asked ``WOPLimits``), so a limit set on an account is on its users'
    rows already."""
    limits: dict[tuple[str, str, str], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 4:
            raise SlurmParseError(
                f"sacctmgr show assoc: line {number}: expected Account|User|Partition|MaxNodes"
            )
        account, user, partition, max_nodes = (field.strip() for field in fields)
        if not user or not max_nodes:
            continue  # an account's own row (users carry its limit), or no limit
        nodes = cv.opt_int(max_nodes, f"sacctmgr show assoc {account}/{user}: MaxNodes")
        if nodes is not None and nodes > 0:
            limits[account, user, partition] = nodes
    return limits


def _max_nodes(value: str, where: str) -> int | None:
    text = _null(value).strip().upper()
    if text in {"", "UNLIMITED", "INFINITE"}:
        return None
    return cv.opt_int(text, f"{where}: MaxNodes")


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
    """``scontrol -o show job`` -> JobViews.

    22.05 prints one ``TRES=`` (the request while the job pends, the allocation once it
    runs); 24.11+ print ``ReqTRES=`` and ``AllocTRES=``.  A pending job's ``NumNodes=4-4``
    is the scheduler's estimate and its maximum; the minimum is ``node=`` of the
    requested TRES (``semantics``).
    """
    views = []
    for fields in _records(text, "scontrol show job", "JobId", JOB_KEYS):
        job_id = cv.as_int(fields["JobId"], "scontrol show job: JobId")
        where = f"scontrol show job {job_id}"
        user, uid = _user(_need(fields, "UserId", where))
        state = cv.job_state(_need(fields, "JobState", where), f"{where}: JobState")
        low, high = _node_range(_need(fields, "NumNodes", where), f"{where}: NumNodes")
        requested = _null(fields.get("ReqTRES", fields.get("TRES", "")))
        allocated = _null(fields.get("AllocTRES", fields.get("TRES", "")))
        low = semantics.requested_min_nodes(state, low, requested, where)
        limit = cv.duration_text(fields.get("TimeLimit", "UNLIMITED"), where)
        start, end = semantics.known_times(
            state,
            cv.timestamp_text(fields.get("StartTime", ""), f"{where}: StartTime"),
            cv.timestamp_text(fields.get("EndTime", ""), f"{where}: EndTime"),
            limit,
        )
        het_id = cv.opt_int(fields.get("HetJobId"), f"{where}: HetJobId")
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
                start_time=start,
                end_time=end,
                resize_time=cv.timestamp_text(_null(fields.get("ResizeTime", "")), where),
                time_limit_s=limit,
                restart_count=cv.as_int(fields.get("Restarts", "0"), f"{where}: Restarts"),
                priority=cv.opt_int(fields.get("Priority"), f"{where}: Priority"),
                eligible_time=semantics.pending_only(
                    state, cv.timestamp_text(fields.get("EligibleTime", ""), where)
                ),
                gpus_per_node=semantics.gpus_per_node(
                    state,
                    low,
                    tres_alloc=allocated,
                    tres_per_node=_null(fields.get("TresPerNode", "")),
                    tres_per_job=_null(fields.get("TresPerJob", "")),
                    where=where,
                ),
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


# --------------------------------------------------------------------------- squeue -O

# ``squeue -O`` fields, each with width 0 (unpadded, never truncated) and the call's
# separator as suffix (see the module docstring).
# Why -O and not -o: -o has no letter for the maximum node count, and its %D is a
# pending job's scheduler estimate (a pending -N2-4 showed min 4 and no max on every
# version).  -O has MaxNodes and tres-alloc, which for a pending job is the requested
# TRES (node=2: the minimum), so the text path gives the same min/max as the JSON
# path (see ``semantics``).  MaxNodes means the request only while the job pends: for
# a running job squeue prints its current size there (JSON says 0), so it is not read.
# Checked on 22.05.8, 24.11.5 and 26.05.5.  An unknown field name makes squeue print an
# error but exit 0 with an empty column (24.11): the backend checks stderr.  Any text
# after a field's width is its suffix, on every version: ``JobID:0Xyz`` prints the id
# then ``Xyz``.
_SQUEUE_FIELDS = (
    ("raw_id", "JobID"), ("het_id", "HetJobID"), ("het_offset", "HetJobOffset"),
    ("state", "State"), ("count", "NumNodes"), ("max", "MaxNodes"), ("nodelist", "NodeList"),
    ("batch", "BatchHost"), ("limit", "TimeLimit"), ("submit", "SubmitTime"),
    ("start", "StartTime"), ("end", "EndTime"), ("restarts", "RestartCnt"),
    ("reason", "Reason"), ("user", "UserName"), ("uid", "UserID"), ("account", "Account"),
    ("partition", "Partition"), ("qos", "QOS"), ("tres", "tres-alloc"),
    ("tres_per_node", "tres-per-node"), ("dependency", "Dependency"),
    ("workdir", "WorkDir"), ("name", "Name"), ("comment", "Comment"),
)  # fmt: skip
SQUEUE_COLUMNS = tuple(name for name, _ in _SQUEUE_FIELDS)
SEPARATOR_LENGTH = 24
# The separator of the captured text fixtures (tests/fixtures/slurm/*/CAPTURED.md); the
# backend never uses it: a separator written in the source is one a user can know.
CAPTURE_SEPARATOR = "QqCaptureSeparatorQq"


def new_separator() -> str:
    """A separator for one call: letters only (squeue reads a digit or '.' after ':' as
    part of the width, ',' as the next field), 24 of them from ``secrets``: ~137 bits.

    A user learns it only by seeing the command line while it runs, when the fields it
    prints are already stored; docs/security.md says what that leaves."""
    return "".join(secrets.choice(string.ascii_letters) for _ in range(SEPARATOR_LENGTH))


def squeue_format(separator: str) -> str:
    """The ``squeue -O`` argument printing ``SQUEUE_COLUMNS``, each followed by
    ``separator``."""
    if not separator.isalpha():
        raise ValueError("an squeue -O separator must be letters only")
    return ",".join(f"{field}:0{separator}" for _, field in _SQUEUE_FIELDS)


def split_rows(text: str, separator: str, width: int, what: str) -> list[list[str]]:
    """Rows of ``width`` fields, each field followed by ``separator``, rows by a newline.

    A field may hold anything but the separator, newlines and ``|`` included: the
    newline that ends a row is the one right after a row's last separator, and the
    first field (a job id) never holds one.  Output that does not divide into whole
    rows is a SlurmParseError (a truncated read, or a separator a field did hold)."""
    if not separator:
        raise ValueError("an empty separator splits nothing")
    pieces = text.split(separator)
    if pieces.pop().strip():
        raise SlurmParseError(f"{what}: output does not end with a whole row")
    if len(pieces) % width:
        raise SlurmParseError(f"{what}: {len(pieces)} fields do not make whole rows of {width}")
    rows = []
    for start in range(0, len(pieces), width):
        row = pieces[start : start + width]
        if start:
            if not row[0].startswith("\n"):
                raise SlurmParseError(f"{what}: row {start // width + 1} does not start a line")
            row[0] = row[0][1:]
        rows.append(row)
    return rows


def parse_squeue_text(text: str, *, separator: str) -> tuple[JobView, ...]:
    """``squeue -h -a -t all -O squeue_format(separator)`` -> JobViews (no admin comment:
    ``-O`` has no field for it; no priority or eligible time: the captured fixtures
    predate those columns, so the policy orders this path's queue by submit time and
    sees no begin time coming)."""
    views = []
    for number, fields in enumerate(
        split_rows(text, separator, len(SQUEUE_COLUMNS), "squeue -O"), start=1
    ):
        row = dict(zip(SQUEUE_COLUMNS, fields, strict=True))
        job_id = cv.as_int(row["raw_id"], f"squeue -O: row {number}: job id")
        where = f"squeue -O: job {job_id}"
        state = cv.job_state(row["state"], f"{where}: state")
        count = cv.as_int(row["count"], f"{where}: nodes")
        tres = _null(row["tres"])
        count = semantics.requested_min_nodes(state, count, tres, where)
        limit = cv.duration_text(row["limit"], f"{where}: time limit")
        start, end = semantics.known_times(
            state,
            cv.timestamp_text(row["start"], f"{where}: start"),
            cv.timestamp_text(row["end"], f"{where}: end"),
            limit,
        )
        het_id = cv.opt_int(_null(row["het_id"]), f"{where}: het id")
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
                node_count=count,
                min_nodes=count,
                max_nodes=(
                    cv.opt_int(_null(row["max"]), f"{where}: max nodes") or None
                    if state is JobState.PENDING
                    else None
                ),
                # squeue prints the scheduler's planned nodes for a pending job: not held.
                nodes=cv.nodes("" if state is JobState.PENDING else row["nodelist"], where),
                batch_host=_null(row["batch"]) or None,
                comment=_null(row["comment"]),
                submit_time=cv.timestamp_text(row["submit"], f"{where}: submit"),
                start_time=start,
                end_time=end,
                time_limit_s=limit,
                restart_count=cv.as_int(row["restarts"], f"{where}: restarts"),
                gpus_per_node=semantics.gpus_per_node(
                    state,
                    count,
                    tres_alloc=tres,
                    tres_per_node=_null(row["tres_per_node"]),
                    where=where,
                ),
                het_job_id=het_id,
                het_job_offset=(
                    cv.as_int(row["het_offset"], f"{where}: het offset")
                    if het_id is not None
                    else None
                ),
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


def parse_sacct_text_records(text: str, *, separator: str) -> tuple[AcctRecord, ...]:
    """``sacct -a -X -D -p -n --delimiter=separator -o SACCT_FIELDS`` -> records; a row
    that does not parse is left out (``history.records``)."""
    rows = split_rows(text, separator, len(SACCT_FIELDS), "sacct -p")
    return history.records(
        (dict(zip(SACCT_FIELDS, fields, strict=True)) for fields in rows), _sacct_record, "sacct -p"
    )


def _sacct_record(row: Mapping[str, str], index: int) -> AcctRecord | None:
    if "." in row["jobidraw"]:
        return None  # a step row (when called without -X): not an allocation
    job_id = cv.as_int(row["jobidraw"], f"sacct -p: row {index + 1}: jobidraw")
    where = f"sacct -p: job {job_id}"
    het_id, het_offset = _het_from_display(row["jobid"], where)
    state = cv.job_state(row["state"], f"{where}: state")
    return AcctRecord(
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


def parse_sacct_text(text: str, *, separator: str) -> tuple[JobHistory, ...]:
    return collapse(parse_sacct_text_records(text, separator=separator))


def private_data(value: str) -> tuple[str, ...]:
    """slurm.conf's PrivateData as ``scontrol show config`` prints it ("none",
    "accounts,jobs,usage,users") -> its words, lower case, sorted; () for none."""
    words = {w.strip().lower() for w in value.split(",") if w.strip()}
    words.discard("none")
    return tuple(sorted(words))


def parse_admins(text: str) -> frozenset[str]:
    """``sacctmgr -n -P show user format=User,AdminLevel`` -> the users whose AdminLevel is
    Operator or Administrator."""
    admins = set()
    for line in text.splitlines():
        user, sep, level = line.strip().partition("|")
        if sep and user and level.strip().lower() in ("operator", "administrator"):
            admins.add(user)
    return frozenset(admins)


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
