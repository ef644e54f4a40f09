"""Small, strict conversions shared by every parser.

Each helper takes ``where`` (e.g. ``"squeue job 18: node_count"``) so that a bad
value becomes a one-line ``SlurmParseError`` saying what and where, never a
``KeyError``/``TypeError``/``ValueError`` from deep inside a parser.  Every value a
parser reads goes through one of these, so that decoding lives in one place (a later
per-field tolerant mode only has to change them).

Representations that differ between Slurm's JSON generations are decoded here:

* numbers: plain integers / null in v0.0.38 (22.05); ``{"set", "infinite", "number"}``
  objects from v0.0.40 on (24.11+), see :func:`number`;
* job states: one string in v0.0.38 and the text outputs, a list (base state plus
  flags) from v0.0.40 on, see :func:`job_state`;
* node states: a string plus ``state_flags`` in v0.0.38, one list from v0.0.40 on, see
  :func:`node_state`;
* GPU GRES: ``gres:gpu:1`` in 22.05's ``tres_per_node``, ``gres/gpu:1`` in 24.11+; a
  node's ``gres`` is the same string in every version (``gpu:4``, typed ``gpu:a100:4``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import hostlist

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.types import MIXED_GPU_TYPE, JobState

# Slurm's own "infinite" sentinels and the facts' rule: a limit of a year or more
# (525600 min) is what sites write for "unlimited" and the daemon treats it so.
UNLIMITED_MINUTES = 525600
_INTEGER = re.compile(r"-?[0-9]{1,30}")  # ASCII digits only; no "1_000", no huge strings
_NO_VAL = {0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFE}


def short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise SlurmParseError(f"{where}: missing field {key!r}") from None
    except TypeError:
        raise SlurmParseError(f"{where}: expected an object, got {short(obj)}") from None


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SlurmParseError(f"{where}: expected an object, got {short(value)}")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SlurmParseError(f"{where}: expected a list, got {short(value)}")
    return value


def as_int(value: Any, where: str, *, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool):
        raise SlurmParseError(f"{where}: expected an integer, got {short(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    raise SlurmParseError(f"{where}: expected an integer, got {short(value)}")


def opt_int(value: Any, where: str) -> int | None:
    """Integer, or None for Slurm's null / NO_VAL / INFINITE."""
    if value is None or value == "":
        return None
    number = as_int(value, where)
    return None if number in _NO_VAL else number


def as_str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise SlurmParseError(f"{where}: expected a string, got {short(value)}")


def number(value: Any, where: str) -> int | None:
    """An integer in either JSON representation; None for "not set" and "unlimited".

    v0.0.40+ (Slurm 24.11 on) writes ``{"set": bool, "infinite": bool, "number": N}``:
    ``set: false`` means no value (``number`` is then a meaningless 0) and
    ``infinite: true`` means unlimited; both become None, like the null / NO_VAL /
    INFINITE of v0.0.38, whose plain integers are accepted too.  No caller needs to
    tell "unset" from "unlimited": a missing maximum, limit or time means "none".
    """
    if isinstance(value, Mapping):
        is_set, infinite = value.get("set"), value.get("infinite")
        if not isinstance(is_set, bool) or not isinstance(infinite, bool) or "number" not in value:
            raise SlurmParseError(
                f"{where}: expected {{set, infinite, number}}, got {short(value)}"
            )
        if infinite or not is_set:
            return None
        return opt_int(value["number"], where)
    return opt_int(value, where)


def epoch(value: Any, where: str) -> float | None:
    """POSIX seconds; Slurm writes 0 (or NO_VAL) for "not yet / never"."""
    seconds = number(value, where)
    return None if seconds is None or seconds <= 0 else float(seconds)


def limit_minutes(value: Any, where: str) -> float | None:
    """A time limit in minutes -> seconds; None = unlimited (null, INFINITE, >= a year).

    The year rule matters beyond site habits: 24.11 and 26.05 rewrite an unlimited
    running job's limit to 525600 minutes (JSON ``number: 525600``, text
    ``365-00:00:00``) a little after it starts (measured on 24.11.5 and 26.05.5)."""
    minutes = number(value, where)
    if minutes is None or minutes >= UNLIMITED_MINUTES:
        return None
    return float(minutes) * 60.0


# Slurm's job_state_string() shows these flags instead of the base state, in this order;
# the text outputs and v0.0.38's JSON therefore say e.g. RESIZING where v0.0.40+ list
# ["PENDING", "RESIZING"].  Only flags that are JobStates are kept (REQUEUE_HOLD, STOPPED,
# SIGNALING, STAGE_OUT, ... leave the base state, which says more than UNKNOWN would).
_STATE_FLAGS_SHOWN = (
    "COMPLETING",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "SPECIAL_EXIT",
    "REVOKED",
)
_BASE_JOB_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
     "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)  # fmt: skip


def job_state(value: Any, where: str) -> JobState:
    """A job state: one string (v0.0.38 JSON, text outputs) or v0.0.40+'s list.

    A list holds the base state and its flags (``["PENDING", "RESIZING"]`` is sacct's
    record of an earlier allocation of a resized job, 22.05's ``RESIZING``); it is read
    the way Slurm's own text outputs show it (see ``_STATE_FLAGS_SHOWN``), so every
    generation and the text paths give the same JobState."""
    if isinstance(value, list):
        names = [as_str(item, where).strip().upper() for item in value]
        if not names:
            raise SlurmParseError(f"{where}: empty job state")
        flag = next((f for f in _STATE_FLAGS_SHOWN if f in names), None)
        base = next((n for n in names if n in _BASE_JOB_STATES), None)
        return JobState(flag or base or JobState.UNKNOWN)
    text = as_str(value, where).strip().upper()
    # sacct -P writes "CANCELLED by 0"; squeue may add "+" flags in text forms.
    base = text.split(" ", 1)[0].rstrip("+")
    if not base:
        raise SlurmParseError(f"{where}: empty job state")
    try:
        return JobState(base)
    except ValueError:
        return JobState.UNKNOWN


# A node's base states (Slurm's NODE_STATE_BASE); everything else in a state list is a flag.
_BASE_NODE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})


def node_state(state: Any, flags: Any, where: str) -> tuple[str, tuple[str, ...]]:
    """(base state in lower case, flags in upper case) of a node.

    v0.0.38: ``state`` is the base (``"idle"``) and ``state_flags`` a list (``["DRAIN"]``).
    v0.0.40+: ``state`` is one list (``["IDLE", "DRAIN"]``, ``["MIXED"]``) and there is
    no ``state_flags``; the first base state in it is the base, the rest are flags.
    """
    if isinstance(state, list):
        names = [as_str(item, where).strip().upper() for item in state]
        base = next((n for n in names if n in _BASE_NODE_STATES), "UNKNOWN")
        extra = [n for n in names if n != base]
    else:
        base = as_str(state, where).strip().upper()
        extra = []
    if not base:
        raise SlurmParseError(f"{where}: empty node state")
    listed = as_list(flags if flags is not None else [], f"{where}: flags")
    extra += [as_str(f, f"{where}: flags").strip().upper() for f in listed]
    return base.lower(), tuple(extra)


def nodes(value: Any, where: str) -> tuple[str, ...]:
    """Expand a Slurm node list with python-hostlist (never by hand)."""
    text = as_str(value, where).strip()
    if text in {"", "(null)", "None assigned", "(None)", "None"}:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as exc:
        raise SlurmParseError(f"{where}: bad node list {short(text)}: {exc}") from None


def names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names (a partition's AllowGroups, DenyQos, ...) in any of its forms:
    ``"a,b"`` (scontrol, pyslurm 22.5), ``["a", "b"]`` (pyslurm 22.5 and 24.11); none for
    None, ``""`` and ``"(null)"``."""
    if isinstance(value, list | tuple):
        items = [as_str(item, where) for item in value]
    else:
        items = as_str(value, where).split(",")
    return tuple(n for n in (item.strip() for item in items) if n and n != "(null)")


def allow_list(value: Any, where: str) -> tuple[str, ...] | None:
    """A partition's Allow* list: None for everyone (Slurm's ``ALL``, which slurmctld
    stores as no list at all, or nothing set), else its names."""
    listed = names(value, where)
    return None if not listed or (len(listed) == 1 and listed[0].upper() == "ALL") else listed


_DURATION = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)$")


def duration_text(value: str, where: str) -> float | None:
    """Slurm text duration (``[D-][HH:]MM:SS``, ``UNLIMITED``, ``N/A``) -> seconds or None.

    ``NOT_SET``: squeue's word for a limit Slurm does not know, e.g. the time limit of a job
    whose partition was removed from slurm.conf while the job was still listed (seen on
    22.05 after a partition was taken out by a restart: ``squeue -O TimeLimit``)."""
    text = value.strip()
    if text.upper() in {"UNLIMITED", "INFINITE", "N/A", "NONE", "", "PARTITION_LIMIT", "NOT_SET"}:
        return None
    if text.isdigit():  # bare minutes, as scontrol accepts and some fields print
        return limit_minutes(int(text), where)
    match = _DURATION.match(text)
    if match is None:
        raise SlurmParseError(f"{where}: bad duration {short(text)}")
    days, hours = int(match["d"] or 0), int(match["h"] or 0)
    seconds = ((days * 24 + hours) * 60 + int(match["m"])) * 60 + int(match["s"])
    return None if seconds >= UNLIMITED_MINUTES * 60 else float(seconds)


def timestamp_text(value: str, where: str) -> float | None:
    """Slurm text timestamp (local time ``YYYY-MM-DDTHH:MM:SS``) -> POSIX seconds."""
    text = value.strip()
    if text in {"", "Unknown", "N/A", "NONE", "None", "(null)", "n/a"}:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):  # "year 0 is out of range" and friends
        raise SlurmParseError(f"{where}: bad timestamp {short(text)}") from None


def _gpu_items(text: str) -> Iterator[tuple[str, str]]:
    """(as written, without its ``gres:``/``gres/`` prefix) of each GPU item of a gres
    string; other gres (``mps``, ``shard``, ...) are skipped."""
    for raw in _split_top_level(text):
        item = raw.strip()
        for prefix in ("gres:", "gres/"):
            item = item.removeprefix(prefix)
        if item == "gpu" or item.startswith("gpu:"):
            yield raw, item


def gres_gpus(value: Any, where: str) -> int:
    """GPU count in a gres string: ``gpu:4``, ``gpu:a100:2(S:0)``, ``gpu:4(IDX:0-3),foo:1``,
    and the TRES-per-node forms ``gres:gpu:1`` (22.05) / ``gres/gpu:1`` (24.11+)."""
    total = 0
    for _, item in _gpu_items(as_str(value, where)):
        item = item.split("(", 1)[0]
        count = item.rsplit(":", 1)[-1] if ":" in item else "1"
        if not count.isdigit():  # "gpu:a100" without a count means one
            count = "1"
        total += int(count)
    return total


# A GRES type as slurm.conf/gres.conf accept it (a word: no ':', ',', parentheses or spaces).
_GRES_TYPE = re.compile(r"[A-Za-z0-9_.+-]{1,256}")
# A trailing "(S:0)", "(IDX:0-3)", "(IDX:0,2)"; not the "(null)" of "gpu:(null)" (no type).
_GRES_SUFFIX = re.compile(r"(?<=[^:])\([^()]*\)$")


def gres_gpu_type(value: Any, where: str) -> str:
    """The type of the GPUs in a gres string, lower case; "" when untyped or no GPUs.

    The forms :func:`gres_gpus` reads: ``gpu:a100:4``, ``gpu:a100:2(S:0)``,
    ``gpu:a100:4(IDX:0-3),mps:100``, ``gpu:4`` (untyped), ``gpu:a100`` (one GPU) and the
    ``gres:``/``gres/`` prefixes; ``(null)`` as a type is Slurm's "untyped".  Other gres
    (``mps``, ``shard``, ...) are not GPUs and are skipped; so are items of count 0.

    Several types on one node (``gpu:a100:2,gpu:t4:2``, or a typed item beside an untyped
    one) give :data:`~slurm_elastic.types.MIXED_GPU_TYPE`, not the most numerous type: a job
    on that node may get either kind, so naming one would let a per-type speed model price
    the node at a speed part of it does not have; "mixed" says so, the same word a partition
    of mixed nodes gets (``cluster_state.partition_gpu_types``).

    A gpu item of another shape (``gpu:a:b:2``, a type with spaces or commas, a count that
    is not a number) raises SlurmParseError: a gres string this misread would give a type
    the node does not have.
    """
    types: set[str] = set()
    for raw, item in _gpu_items(as_str(value, where)):
        kind, count = _gpu_item(item, raw, where)
        if count > 0:
            types.add(kind.lower())
    if len(types) > 1:
        return MIXED_GPU_TYPE
    return types.pop() if types else ""


def _gpu_item(item: str, raw: str, where: str) -> tuple[str, int]:
    """(type or "", count) of one ``gpu[:TYPE][:COUNT][(...)]`` item (prefix already off)."""
    fields = _GRES_SUFFIX.sub("", item).split(":")[1:]  # after "gpu"; [] for a bare "gpu"
    if len(fields) == 1 and fields[0].isdigit():
        fields = ["(null)", fields[0]]  # gpu:4: untyped
    elif len(fields) == 1:
        fields.append("1")  # gpu:a100: one GPU
    kind, count = fields if len(fields) == 2 else ("(null)", "1" if not fields else "")
    if not count.isdigit():
        raise SlurmParseError(f"{where}: bad GPU gres item {short(raw)}")
    if kind == "(null)":  # Slurm's word for "no type"
        return "", int(count)
    if not _GRES_TYPE.fullmatch(kind):
        raise SlurmParseError(f"{where}: bad GPU type in gres item {short(raw)}")
    return kind, int(count)


def tres_count(value: Any, name: str, where: str) -> int:
    """Count of one TRES in a TRES string: ``cpu=8,node=2,billing=8,gres/gpu=8`` -> 8 for
    ``gres/gpu``; 0 when absent."""
    text = as_str(value, where)
    for item in text.split(","):
        key, _, number = item.partition("=")
        if key.strip() == name:
            return as_int(number, f"{where}: {name}")
    return 0


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (``gpu:2(IDX:0,2)`` stays whole)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p]
