"""``PyslurmBackend``: the batched reads and the signals/cancels in-process, via pyslurm.

Chosen by :func:`slurm_elastic.slurm.select.make_backend` when a pyslurm built for the
running Slurm's major.minor imports (pyslurm 22.5.x <-> Slurm 22.05.x; builds live in
``/var/lib/slurm-elastic/pyslurm/<release>``, see ``scripts/build-pyslurm.sh``).  This
module never imports pyslurm (the selector hands the module in), and the package imports
neither at import time.

What runs in-process (pyslurm 22.5's dictionary API, ``pyslurm.job()``/``node()``/
``partition()`` and ``pyslurm.slurm_kill_job``), and what it costs:

* ``read_jobs``       one ``slurm_load_jobs`` RPC              (CLI: ``squeue --json``)
* ``read_nodes``      ``slurm_load_node`` + ``slurm_load_ctl_conf`` + ``slurm_load_partitions``
                      (3 RPCs: pyslurm's ``node().get()`` always makes all three)
                                                               (CLI: ``sinfo --json``)
* ``read_partitions`` one ``slurm_load_partitions`` RPC        (CLI: ``scontrol -o show partition``)
                      (pyslurm 24.11: ``Partitions.load()``, 2 RPCs, see the method)
* ``read_job``        one ``slurm_load_job`` RPC               (CLI: ``scontrol -o show job``)
* ``signal``/``cancel`` one ``slurm_kill_job`` RPC             (CLI: ``scancel``)

so ``read_cluster`` is 5 RPCs (6 on pyslurm 24.11) whatever the job count
(``ClusterSnapshot.slurm_calls``; the CLI backend's 3 are processes).  At 5,000 jobs
pyslurm's ``job().get()`` alone takes ~70 ms (the RPC ~25 ms, building its ~110-entry
dictionaries the rest), and mapping every record anew another ~60 ms; so a job whose
:data:`JOB_FIELDS` are unchanged since the previous read keeps its view (~4 us a job to
compare, ~18 ms at 5,000), and the read runs with Python's cyclic collector paused
(``_collector_paused``).
``scripts/bench_slurm_read.py --backend pyslurm`` measures it.

What stays on the CLI backend (this class inherits it), and why:

* ``read_history``: pyslurm 22.5 cannot return a resized job's earlier allocations.
  slurmdbd sends one record per allocation (``RESIZING`` records, and with ``-D``
  ``REQUEUED`` ones), but both of pyslurm's accounting APIs key their result by job id
  (``slurmdb_jobs().get()`` in a dict, ``db.Jobs.load()`` in a map; upstream's open note
  "How to handle ... duplicate job ids"), so only the last record survives and
  :func:`slurm_elastic.slurm.history.collapse` has nothing to collapse (seen on 22.05.8:
  a job resized 4 -> 3 -> 2 came back as one 2-node record, and the live equality test
  checks it for 3 -> 2).  History is one ``sacct -P`` call every
  ``slurm.sacct_interval_s``, off the fast path.
* size changes (``pin_pending_size``, ``shrink``), ``set_admin_comment``, ``requeue``,
  ``reconfigure``: ``scontrol update`` turns ``NumNodes=n-n`` / ``NumNodes=n`` /
  ``NodeList=`` into the update message in ways the facts measured (a pending job's
  plain ``NumNodes=n`` only lowers its minimum on 22.05); rebuilding that translation
  on pyslurm's ``JobSubmitDescription`` would be a second, subtly different path for a
  rare action where one process spawn does not matter.
* ``submit``: must run ``sbatch`` as the job's user (``runuser``), never as root.
* ``probe``: one-off at start-up; it reads ``scontrol show config`` text anyway.

Field mapping: pure functions from pyslurm's dictionaries to the same views the CLI
parsers build (:func:`job_view`, :func:`node_view`, :func:`partition_view`), using
:mod:`slurm_elastic.slurm.convert`; for the same cluster state both backends give equal
views (tested live), except as listed here.  pyslurm 22.5 quirks handled here:

* ``job()['state_reason']`` is Slurm's description, spaces made ``_``, when slurmctld
  set one (``Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved...``), else the
  reason code; pyslurm 22.5 has no way to get the code then (its newer ``Job`` class
  prefers the description too).  ``squeue --json`` gives the code (``Resources``); the
  CLI's ``read_job`` (``scontrol``) gives the description, as here.  The reasons the
  daemon acts on (held, dependency, begin time) carry no description.
* strings are decoded as UTF-8 with replacement, like the CLI runner's output, so a
  non-UTF-8 job name or comment reads as U+FFFD in both backends.  The one exception is
  a job's state description, which pyslurm decodes strictly inside ``job().get()``: a
  ``UnicodeDecodeError`` there fails pyslurm's whole read, so that read (and only it)
  falls back to the CLI, with a warning.
* ``time_limit`` is ``"UNLIMITED"``/``"Partition_Limit"`` or minutes; a partition's
  ``max_time`` is *seconds* (pyslurm multiplies by 60) or ``"UNLIMITED"``; an INACTIVE
  partition's state is ``""`` (pyslurm tests the state for truth before naming it).
* a node's ``state`` is ``slurm_node_state_string`` of the base state after pyslurm took
  the CLOUD/COMPLETING/DRAIN/FAIL/POWER flags off (and with MIXED computed from the
  allocated CPUs, as sinfo does), then ``+FLAG`` per flag removed: ``MIXED+DRAIN``,
  ``IDLE*`` (not responding).  :func:`node_state` turns it into sinfo's base state and
  flag names.  pyslurm writes ``+FAIL`` instead of ``+DRAIN`` when a node has both.
* ``gres``/``gres_used`` are lists split at commas; they are joined back before parsing
  (GPU count and type: ``["gpu:a100:2(IDX:0", "2)"]`` is ``gpu:a100:2(IDX:0,2)`` again).
* a partition's access lists: ``allow_*`` is ``"ALL"`` or a list, ``deny_*`` None or a
  list, as scontrol shows them (a Deny list only while its Allow list is unset); but
  ``deny_qos`` is always ``[]`` where a DenyQos is set (pyslurm fills it from the unset
  AllowQos), so a read that meets one falls back to the CLI (:func:`deny_qos_lost`).
  pyslurm 24.11's ``Partition`` reads an unset Deny list as ``["ALL"]``
  (:func:`partition_record` maps it back).
* user names: pyslurm gives only the uid; it is resolved like squeue does (the number
  as a string when the uid is unknown), cached per process.

Error mapping: pyslurm 22.5's dictionary API raises ``ValueError(message, errno)`` for a
failed RPC; libslurm's message decides, as for the CLI (``runner.slurm_error``):
``SlurmUnreachable`` (nothing applied, idempotent actions retried), ``SlurmBusy`` (a
refusal Slurm calls temporary: retried too) or ``SlurmRejected``.  The retry policy is the
CLI backend's: cancel is retried, signal never.

Process-wide libslurm state: libslurm reads ``slurm.conf`` at ``slurm_init`` and keeps
it for the whole process, so before each RPC a backend makes sure libslurm is on its
``slurm_conf`` (re-initialising it when another backend of this process switched it; the
daemon has one backend, the tests several).  Backends are not thread-safe, and the RPCs
hold the GIL (pyslurm's Cython calls into libslurm without releasing it): other threads
(the HTTP API) wait for the RPC -- milliseconds, but up to slurm.conf's MessageTimeout
when slurmctld hangs, a bound the CLI backend's ``timeout_s`` does not apply to.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
import pwd
import signal as signals
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

import structlog

from slurm_elastic.errors import (
    ActionRefused,
    ConfigError,
    SlurmParseError,
    SlurmRejected,
)
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import semantics
from slurm_elastic.slurm.cli import _SIGNAL, CliBackend, _positive
from slurm_elastic.slurm.runner import slurm_error
from slurm_elastic.types import JobState, JobView, NodeView, PartitionView

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
# RPCs per batched read (pyslurm 22.5): constant whatever the job count.
JOB_RPCS = 1  # slurm_load_jobs
NODE_RPCS = 3  # slurm_load_node + slurm_load_ctl_conf + slurm_load_partitions
PARTITION_RPCS = 1  # slurm_load_partitions
# pyslurm 24.11's Partitions.load(): slurm_load_partitions + slurm_load_ctl_conf.
PARTITION_RPCS_24 = 2

_RUNNING_LIKE = frozenset({JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING})
_NO_TIME_LIMIT = frozenset({"UNLIMITED", "PARTITION_LIMIT"})
# slurm_node_state_string's one-character suffixes (sinfo's NODE STATE CODES), as the
# flag names sinfo --json lists.
_STATE_SUFFIX = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
# pyslurm's "+FLAG" words that are not Slurm's flag names.
_FLAG_NAMES = {"POWER": "POWERED_DOWN"}
# Whole-string states that hide the base state (slurm_node_state_string returns them
# alone): a node in a MAINT reservation or with a reboot pending is idle (those words
# are returned only then); an invalid registration's base state is unknown.
_STATE_WORDS = {
    "MAINT": ("idle", "MAINTENANCE"),
    "REBOOT": ("idle", "REBOOT_REQUESTED"),
    "INVAL": ("unknown", "INVALID_REG"),
}

# The slurm.conf libslurm was last initialised with in this process (None: as imported).
_libslurm_conf: str | None = None


# --------------------------------------------------------------------------- field mapping

# Every field of a pyslurm job record that job_view reads: a record whose values of these
# are unchanged since the last read maps to the same view (PyslurmBackend reuses it).
JOB_FIELDS = (
    "job_id", "job_state", "num_nodes", "max_nodes", "tres_req_str", "tres_alloc_str",
    "tres_per_node", "tres_per_job", "nodes", "batch_host", "state_reason", "time_limit",
    "submit_time", "start_time", "end_time", "resize_time", "restart_cnt", "user_id",
    "name", "account", "partition", "qos", "comment", "admin_comment", "work_dir",
    "dependency", "het_job_id", "het_job_offset", "priority", "eligible_time", "bitflags",
)  # fmt: skip
# slurm.h's STEPMGR_ENABLED job flag, SLURM_BIT(41) in 24.11 and 26.05 (unused in 22.05):
# pyslurm hands the job's flags over as one integer.
STEPMGR_BIT = 1 << 41
_job_key = operator.itemgetter(*JOB_FIELDS)


def job_view(raw: Mapping[str, Any], user_name: Callable[[int], str] | None = None) -> JobView:
    """One ``pyslurm.job().get()`` record -> the JobView ``squeue --json`` gives."""
    job_id = cv.as_int(raw.get("job_id"), "pyslurm job: job_id")
    try:
        return _job(raw, job_id, user_name or uid_to_name)
    except SlurmParseError as exc:
        raise SlurmParseError(f"pyslurm job {job_id}: {exc}") from None


def _job(raw: Mapping[str, Any], job_id: int, user_name: Callable[[int], str]) -> JobView:
    # The ``where`` strings are constant: the job id is added once, on error (above).
    state = cv.job_state(raw.get("job_state"), "job_state")
    node_count = cv.as_int(raw.get("num_nodes"), "num_nodes", default=0)
    tres_req = raw.get("tres_req_str")
    if state is JobState.PENDING and tres_req:
        # num_nodes of a pending job is slurmctld's estimate; the request is in the TRES.
        node_count = cv.tres_count(tres_req, "node", "tres_req_str") or node_count
    het_job_id = cv.opt_int(raw.get("het_job_id"), "het_job_id") or None
    time_limit = _time_limit(raw.get("time_limit"))
    start = cv.epoch(raw.get("start_time"), "start_time")
    end = cv.epoch(raw.get("end_time"), "end_time")
    running_like = state in _RUNNING_LIKE
    if state is JobState.PENDING:
        start = end = None  # the scheduler's guesses, not facts (as in the CLI parsers)
    elif running_like and time_limit is None:
        end = None  # Slurm writes start + 1 year for an unlimited job
    uid = cv.opt_int(raw.get("user_id"), "user_id")
    return JobView(
        job_id=job_id,
        name=cv.as_str(raw.get("name"), "name"),
        user=user_name(uid) if uid is not None else "",
        user_id=uid,
        account=cv.as_str(raw.get("account"), "account"),
        partition=cv.as_str(raw.get("partition"), "partition"),
        qos=cv.as_str(raw.get("qos"), "qos"),
        state=state,
        state_reason=cv.as_str(raw.get("state_reason"), "state_reason"),
        node_count=node_count,
        min_nodes=node_count,
        max_nodes=cv.opt_int(raw.get("max_nodes"), "max_nodes") or None,
        nodes=cv.nodes(raw.get("nodes"), "nodes"),
        batch_host=cv.as_str(raw.get("batch_host"), "batch_host") or None,
        comment=cv.as_str(raw.get("comment"), "comment"),
        admin_comment=cv.as_str(raw.get("admin_comment"), "admin_comment"),
        submit_time=cv.epoch(raw.get("submit_time"), "submit_time"),
        start_time=start,
        end_time=end,
        resize_time=cv.epoch(raw.get("resize_time"), "resize_time"),
        time_limit_s=time_limit,
        restart_count=cv.as_int(raw.get("restart_cnt"), "restart_cnt", default=0),
        priority=cv.opt_int(raw.get("priority"), "priority"),
        eligible_time=semantics.pending_only(
            state, cv.epoch(raw.get("eligible_time"), "eligible_time")
        ),
        gpus_per_node=_gpus_per_node(raw, node_count, allocated=running_like),
        het_job_id=het_job_id,
        het_job_offset=(
            cv.as_int(raw.get("het_job_offset"), "het_job_offset", default=0)
            if het_job_id is not None
            else None
        ),
        work_dir=cv.as_str(raw.get("work_dir"), "work_dir"),
        dependency=cv.as_str(raw.get("dependency"), "dependency"),
        stepmgr=bool(cv.as_int(raw.get("bitflags"), "bitflags", default=0) & STEPMGR_BIT),
    )


def _time_limit(value: Any) -> float | None:
    """pyslurm's ``time_limit``: minutes, or "UNLIMITED" / "Partition_Limit" (NO_VAL)."""
    if isinstance(value, str) and value.upper() in _NO_TIME_LIMIT:
        return None
    return cv.limit_minutes(value, "time_limit")


def _gpus_per_node(raw: Mapping[str, Any], node_count: int, *, allocated: bool) -> int:
    # As parse_v0038: a running job's allocation is the truth (exclusive partitions hand
    # out every GPU of a node); a pending job only has its request.
    if allocated and node_count > 0:
        total = cv.tres_count(raw.get("tres_alloc_str"), "gres/gpu", "tres_alloc_str")
        if total:
            return total // node_count
    per_node = cv.gres_gpus(raw.get("tres_per_node"), "tres_per_node")
    if per_node:
        return per_node
    per_job = cv.gres_gpus(raw.get("tres_per_job"), "tres_per_job")
    return per_job // node_count if per_job and node_count else 0


def node_view(raw: Mapping[str, Any]) -> NodeView:
    """One ``pyslurm.node().get()`` record -> the NodeView ``sinfo --json`` gives."""
    name = cv.as_str(raw.get("name"), "pyslurm node: name")
    if not name:
        raise SlurmParseError("pyslurm node: empty node name")
    where = f"pyslurm node {name}"
    state, flags = node_state(cv.as_str(raw.get("state"), f"{where}: state"))
    gres = _joined(raw.get("gres"), f"{where}: gres")
    return NodeView(
        name=name,
        state=state,
        flags=flags,
        cpus=cv.as_int(raw.get("cpus"), f"{where}: cpus"),
        alloc_cpus=cv.as_int(raw.get("alloc_cpus"), f"{where}: alloc_cpus", default=0),
        gpus=cv.gres_gpus(gres, f"{where}: gres"),
        alloc_gpus=cv.gres_gpus(
            _joined(raw.get("gres_used"), f"{where}: gres_used"), f"{where}: gres_used"
        ),
        partitions=tuple(
            cv.as_str(p, f"{where}: partitions")
            for p in cv.as_list(raw.get("partitions") or [], f"{where}: partitions")
        ),
        reason=cv.as_str(raw.get("reason"), f"{where}: reason"),
        gpu_type=cv.gres_gpu_type(gres, f"{where}: gres"),
    )


def node_state(text: str) -> tuple[str, tuple[str, ...]]:
    """pyslurm's node state string -> (sinfo's lower-case base state, flag names).

    ``"MIXED+DRAIN"`` -> ``("mixed", ("DRAIN",))``; ``"IDLE*"`` -> ``("idle",
    ("NOT_RESPONDING",))``; ``"MAINT"`` -> ``("idle", ("MAINTENANCE",))``.
    """
    base, *extra = text.strip().upper().split("+")
    flags: list[str] = []
    while base and base[-1] in _STATE_SUFFIX:
        flags.insert(0, _STATE_SUFFIX[base[-1]])
        base = base[:-1]
    if base in _STATE_WORDS:
        base, flag = _STATE_WORDS[base]
        flags.insert(0, flag)
    if not base:
        raise SlurmParseError(f"pyslurm node state: no base state in {cv.short(text)}")
    flags.extend(_FLAG_NAMES.get(word, word) for word in extra if word)
    return base.lower(), tuple(flags)


def _joined(value: Any, where: str) -> str:
    # pyslurm splits gres strings at commas ("gpu:2(IDX:0,2)" naively into two items);
    # joining restores Slurm's string, which convert.gres_gpus and gres_gpu_type parse.
    if value is None or isinstance(value, str):
        return cv.as_str(value, where)
    return ",".join(cv.as_str(item, where) for item in cv.as_list(value, where))


def partition_view(raw: Mapping[str, Any]) -> PartitionView:
    """One ``pyslurm.partition().get()`` record -> the PartitionView ``scontrol`` gives."""
    name = cv.as_str(raw.get("name"), "pyslurm partition: name")
    where = f"pyslurm partition {name}"
    flags = cv.mapping(raw.get("flags") or {}, f"{where}: flags")
    max_time = raw.get("max_time")
    if isinstance(max_time, str) and max_time.upper() == "UNLIMITED":
        max_time_s = None
    else:
        seconds = cv.opt_int(max_time, f"{where}: max_time")  # seconds, not minutes
        too_long = seconds is None or seconds >= cv.UNLIMITED_MINUTES * 60
        max_time_s = None if seconds is None or too_long else float(seconds)
    return PartitionView(
        name=name,
        nodes=cv.nodes(raw.get("nodes"), f"{where}: nodes"),
        is_default=bool(flags.get("Default")),
        exclusive=cv.as_str(flags.get("Shared"), f"{where}: Shared").startswith("EXCLUSIVE"),
        state=cv.as_str(raw.get("state"), f"{where}: state").upper() or "INACTIVE",
        max_time_s=max_time_s,
        max_nodes=_max_nodes(raw.get("max_nodes"), f"{where}: max_nodes"),
        qos=cv.as_str(raw.get("qos_char"), f"{where}: qos_char").strip(),
        allow_groups=cv.allow_list(raw.get("allow_groups"), f"{where}: allow_groups"),
        allow_accounts=cv.allow_list(raw.get("allow_accounts"), f"{where}: allow_accounts"),
        allow_qos=cv.allow_list(raw.get("allow_qos"), f"{where}: allow_qos"),
        deny_accounts=cv.names(raw.get("deny_accounts"), f"{where}: deny_accounts"),
        deny_qos=cv.names(raw.get("deny_qos"), f"{where}: deny_qos"),
    )


def deny_qos_lost(raw: Mapping[str, Any]) -> bool:
    """Whether pyslurm 22.5 dropped this partition's DenyQos (see the module doc).

    Its ``partition().get()`` mirrors scontrol: ``allow_qos`` None and ``deny_qos`` a list
    exactly when slurmctld sent a DenyQos and no AllowQos; but it fills ``deny_qos`` from
    the (then unset) AllowQos, so the list is always empty there (pyslurm 22.5.x,
    ``pyslurm.pyx``; measured with ``DenyQos=low``: ``[]``).
    """
    return "allow_qos" in raw and raw["allow_qos"] is None and not raw.get("deny_qos")


def partition_record(partition: Any) -> dict[str, Any]:
    """A pyslurm 24.11 ``Partition`` object as the ``partition().get()`` record that
    :func:`partition_view` reads (the same fields, in the deprecated API's units: max_time
    in seconds or "UNLIMITED", oversubscription as its "Shared" mode)."""
    minutes = partition.max_time  # minutes; "UNLIMITED"; None when not set
    return {
        "name": partition.name,
        "nodes": partition.nodes,
        "flags": {"Default": partition.is_default, "Shared": partition.oversubscribe},
        "max_time": minutes * 60 if isinstance(minutes, int) else minutes,
        "state": partition.state,
        "max_nodes": partition.max_nodes,
        "qos_char": partition.qos,
        "allow_groups": partition.allowed_groups,
        "allow_accounts": partition.allowed_accounts,
        "allow_qos": partition.allowed_qos,
        "deny_accounts": _denied(partition.denied_accounts, partition.allowed_accounts),
        "deny_qos": _denied(partition.denied_qos, partition.allowed_qos),
    }


def _denied(denied: list[str] | None, allowed: list[str] | None) -> list[str] | None:
    """pyslurm 24.11's Deny list as scontrol shows it (None: no one denied).

    ``Partition.denied_*`` reads an unset list as ``["ALL"]`` (the default it hands to
    ``cstr.to_list``, as for the Allow lists; measured), which would read as an account or
    QOS named ALL, one Slurm's lower-case names never match anyway.  And scontrol leaves a
    Deny list out while the Allow list of its kind is set, because Slurm then ignores it
    (``part_policy_valid_acct``/``_qos``); the views of both backends must agree.
    """
    if denied == ["ALL"] or cv.allow_list(allowed, "pyslurm partition: allow list") is not None:
        return None
    return denied


def _max_nodes(value: Any, where: str) -> int | None:
    if isinstance(value, str) and value.strip().upper() in {"UNLIMITED", "INFINITE"}:
        return None
    return cv.opt_int(value, where)


_USER_NAMES: dict[int, str] = {}


def uid_to_name(uid: int) -> str:
    """The user name of ``uid`` as squeue shows it; successful look-ups are cached."""
    name = _USER_NAMES.get(uid)
    if name is None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)  # not cached: the user may be created later
        _USER_NAMES[uid] = name
    return name


def signal_number(name: str) -> int:
    """``USR1`` / ``SIGUSR1`` / ``10`` -> 10; ActionRefused for anything else."""
    text = name.strip().upper()
    if not _SIGNAL.match(text):
        raise ActionRefused(f"not a signal name: {name!r}")
    if text.isdigit():
        return int(text)
    try:
        return int(signals.Signals["SIG" + text.removeprefix("SIG")])
    except KeyError:
        raise ActionRefused(f"not a signal name: {name!r}") from None


# --------------------------------------------------------------------------- the backend


def _series(version: str) -> int:
    """pyslurm "24.11.0" -> 24 (0 when unknown: treated as the oldest API)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def libslurm_conf(slurm_conf: str | None) -> str:
    """The slurm.conf libslurm reads for ``slurm_conf`` (None: ``$SLURM_CONF`` or the default)."""
    return slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF


class PyslurmBackend(CliBackend):
    """SlurmBackend whose reads, signals and cancels are pyslurm RPCs (see the module doc)."""

    def __init__(self, pyslurm: ModuleType, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pyslurm = pyslurm
        self._conf = libslurm_conf(self.runner.slurm_conf)
        if not os.path.isfile(self._conf):
            # libslurm's slurm_init would retry for 60 s, then exit the whole process.
            raise ConfigError(f"pyslurm backend: no slurm.conf at {self._conf}")
        # pyslurm 23.x on (measured with 24.11.0 against Slurm 24.11.5) differs in two
        # places this backend uses: slurm_fini/slurm_init within one process crashes it
        # (segmentation fault), so one process serves one slurm.conf; and the dict API's
        # job().find_id() is broken (it hands slurm_load_job the id as bytes: "TypeError:
        # an integer is required"), so one job is read through the CLI there.
        self._legacy_api = _series(str(getattr(pyslurm, "__version__", ""))) < 23
        current = _libslurm_conf or libslurm_conf(None)
        if not self._legacy_api and current != self._conf:
            raise ConfigError(
                f"pyslurm {pyslurm.__version__} serves one slurm.conf per process: this one "
                f"has {current}, not {self._conf} (it cannot re-initialise libslurm)"
            )
        self.rpc_calls = 0  # every RPC this backend made
        self.rpc_action_calls = 0  # those that change Slurm state (signal, cancel)
        self._job_cache: dict[Any, tuple[tuple[Any, ...], JobView]] = {}
        self._deny_qos_warned = False  # read_partitions' fallback, warned once

    # ------------------------------------------------------------------ reads

    def slurm_calls(self) -> int:
        """RPCs, plus a process only when a read fell back to the CLI (module doc)."""
        return self.rpc_calls + self.runner.calls

    def read_jobs(self) -> tuple[JobView, ...]:
        with _collector_paused():
            try:
                records = self._rpc(
                    "slurm_load_jobs", lambda: self._pyslurm.job().get(), rpcs=JOB_RPCS
                )
            except UnicodeDecodeError as exc:
                log.warning(
                    "slurm.pyslurm_undecodable", read="jobs", error=str(exc), fallback="cli"
                )
                return super().read_jobs()
            views = self._job_views(cv.mapping(records, "pyslurm jobs").values())
            # Free pyslurm's dictionaries while the collector is still paused: freed later,
            # the collector (re-enabled with ~20,000 new containers counted) would scan them
            # all first, which cost 20-30 ms at 5,000 jobs.
            del records
            return views

    def read_nodes(self) -> tuple[NodeView, ...]:
        records = self._rpc("slurm_load_node", lambda: self._pyslurm.node().get(), rpcs=NODE_RPCS)
        return tuple(node_view(record) for record in cv.mapping(records, "pyslurm nodes").values())

    def read_partitions(self) -> tuple[PartitionView, ...]:
        if not self._legacy_api:
            # pyslurm 24.11's partition().get() hands the partition's 32-bit flags to
            # get_partition_mode(uint16_t flags): with any flag from bit 16 on it raises
            # OverflowError ("value too large to convert to uint16_t").  Slurm 24.11 sets
            # one (PART_FLAG_SCHED_FAILED, bit 18) when a scheduling pass could not start
            # a job of the partition: a pending -N4 job beside a drained node was enough
            # (CI, 24.11.5).  Its Partitions API reads the same records without that helper.
            loaded = self._rpc(
                "slurm_load_partitions",
                lambda: [partition_record(p) for p in self._pyslurm.Partitions.load().values()],
                rpcs=PARTITION_RPCS_24,
            )
            return tuple(partition_view(record) for record in loaded)
        records = self._rpc(
            "slurm_load_partitions", lambda: self._pyslurm.partition().get(), rpcs=PARTITION_RPCS
        )
        raw = [
            cv.mapping(r, "pyslurm partition")
            for r in cv.mapping(records, "pyslurm partitions").values()
        ]
        lost = [
            cv.as_str(r.get("name"), "pyslurm partition: name") for r in raw if deny_qos_lost(r)
        ]
        if lost:
            # A view without the DenyQos would offer the partition to jobs Slurm refuses
            # there: the read goes through scontrol, which shows the list (one process per
            # read for as long as a partition has a DenyQos; warned once, it is config).
            report = log.debug if self._deny_qos_warned else log.warning
            report("slurm.pyslurm_deny_qos_lost", partitions=lost, fallback="cli")
            self._deny_qos_warned = True
            return super().read_partitions()
        return tuple(partition_view(record) for record in raw)

    def read_job(self, job_id: int) -> JobView | None:
        """One job (action pre-checks): ``slurm_load_job``; None when Slurm does not know it."""
        if not self._legacy_api:
            return super().read_job(job_id)  # find_id is broken from pyslurm 23 on (above)
        try:
            records = self._rpc("slurm_load_job", lambda: self._pyslurm.job().find_id(str(job_id)))
        except SlurmRejected as exc:
            if "invalid job id" in exc.slurm_message.lower():
                return None
            raise
        except UnicodeDecodeError as exc:
            log.warning("slurm.pyslurm_undecodable", read="job", error=str(exc), fallback="cli")
            return super().read_job(job_id)
        # find_id returns every record the id selects (a het job's components, an array).
        found = cv.as_list(records, "pyslurm job")
        views = [job_view(r) for r in found if cv.mapping(r, "pyslurm job").get("job_id") == job_id]
        return views[0] if views else None

    def _job_views(self, records: Iterable[Mapping[str, Any]]) -> tuple[JobView, ...]:
        """job_view of every record, reusing last read's view of a job whose JOB_FIELDS are
        unchanged: most jobs are, and mapping every record costs almost as much as pyslurm's
        read itself (5,000 jobs: ~60 ms of Python, vs ~18 ms to compare the fields)."""
        last, cache = self._job_cache, {}
        views = []
        for raw in records:
            try:
                key = _job_key(raw)
            except (KeyError, TypeError):  # not pyslurm 22.5's full record: no reuse
                views.append(job_view(raw))
                continue
            hit = last.get(key[0])
            view = hit[1] if hit is not None and hit[0] == key else job_view(raw)
            cache[key[0]] = (key, view)
            views.append(view)
        self._job_cache = cache  # only the jobs of this read: no growth
        return tuple(views)

    # ------------------------------------------------------------------ actions

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        _positive(job_id, "job id")
        number = signal_number(signal)
        if self.runner.dry_run:
            super().signal(job_id, signal, batch_only=batch_only)
            return
        # KILL_JOB_BATCH: the batch shell only; 0: every step but the batch one -- the
        # same split as `scancel --signal --batch` vs plain `scancel --signal`.
        flags = self._pyslurm.KILL_JOB_BATCH if batch_only else 0
        self._rpc(
            "slurm_kill_job",
            lambda: self._pyslurm.slurm_kill_job(job_id, number, flags),
            action=True,
        )  # never retried: a second try could signal twice
        name = signal.strip().upper()
        log.info("slurm.signal", job_id=job_id, signal=name, batch_only=batch_only, via="pyslurm")

    def cancel(self, job_id: int) -> None:
        _positive(job_id, "job id")
        if self.runner.dry_run:
            super().cancel(job_id)
            return
        gone = {self._pyslurm.ESLURM_ALREADY_DONE, self._pyslurm.ESLURM_INVALID_JOB_ID}

        def kill() -> None:
            try:
                self._pyslurm.slurm_kill_job(job_id, int(signals.SIGKILL), 0)
            except ValueError as exc:
                # As scancel: a job that ended or is unknown needs no cancelling.
                if len(exc.args) == 2 and exc.args[1] in gone:
                    return
                raise

        self._idempotent(lambda: self._rpc("slurm_kill_job", kill, action=True))
        log.info("slurm.cancel", job_id=job_id, via="pyslurm")

    # ------------------------------------------------------------------ helpers

    def _rpc(self, what: str, call: Callable[[], T], *, rpcs: int = 1, action: bool = False) -> T:
        """Run pyslurm ``call`` (``rpcs`` RPCs) on this backend's slurm.conf; typed errors."""
        self._use_own_conf()
        self.rpc_calls += rpcs
        if action:
            self.rpc_action_calls += rpcs
        started = time.monotonic()
        try:
            result = call()
        except UnicodeDecodeError:
            raise  # a ValueError too, but not an RPC failure: the caller decides
        except ValueError as exc:
            # pyslurm 22.5: ValueError(message, errno) for a failed RPC (some paths give
            # only the message).  Anything else from pyslurm is a bug and propagates.
            message = str(exc.args[0]) if exc.args else str(exc)
            raise slurm_error(f"pyslurm {what}", message) from None
        log.debug("slurm.rpc", rpc=what, elapsed_s=time.monotonic() - started)
        return result

    def _use_own_conf(self) -> None:
        # libslurm keeps one slurm.conf per process (module doc): switch if needed.
        global _libslurm_conf
        if _libslurm_conf is None:
            # Importing pyslurm initialised libslurm from $SLURM_CONF (or the default).  A
            # slurm_fini/slurm_init round trip right after that import crashes the process
            # on pyslurm 24.11 (segmentation fault, measured against 24.11.5): switch only
            # when the conf really differs.
            _libslurm_conf = libslurm_conf(None)
        if _libslurm_conf != self._conf:
            self._pyslurm.api.slurm_fini()
            self._pyslurm.api.slurm_init(self._conf)
            _libslurm_conf = self._conf


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one job read.

    pyslurm's ``job().get()`` builds ~110-entry dictionaries (and a few nested ones) per job,
    all freed by reference counting; at 5,000 jobs those allocations trigger collector
    passes that scan every tracked object of the process and added 20-30 ms to a ~90 ms
    read (measured on 22.05.8).  Nothing of the read is cyclic garbage; the collector's
    state is restored on the way out, also on errors.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
