"""Small, strict conversions shared by every parser.

Each helper takes ``where`` (e.g. ``"squeue job 18: node_count"``) so that a bad
value becomes a one-line ``SlurmParseError`` saying what and where, never a
``KeyError``/``TypeError``/``ValueError`` from deep inside a parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import hostlist

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.types import JobState

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


def epoch(value: Any, where: str) -> float | None:
    """POSIX seconds; Slurm writes 0 (or NO_VAL) for "not yet / never"."""
    number = opt_int(value, where)
    return None if number is None or number <= 0 else float(number)


def limit_minutes(value: Any, where: str) -> float | None:
    """A time limit in minutes -> seconds; None = unlimited (null, INFINITE, >= a year)."""
    minutes = opt_int(value, where)
    if minutes is None or minutes >= UNLIMITED_MINUTES:
        return None
    return float(minutes) * 60.0


def job_state(value: Any, where: str) -> JobState:
    text = as_str(value, where).strip().upper()
    # sacct -P writes "CANCELLED by 0"; squeue may add "+" flags in text forms.
    base = text.split(" ", 1)[0].rstrip("+")
    if not base:
        raise SlurmParseError(f"{where}: empty job state")
    try:
        return JobState(base)
    except ValueError:
        return JobState.UNKNOWN


def nodes(value: Any, where: str) -> tuple[str, ...]:
    """Expand a Slurm node list with python-hostlist (never by hand)."""
    text = as_str(value, where).strip()
    if text in {"", "(null)", "None assigned", "(None)", "None"}:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as exc:
        raise SlurmParseError(f"{where}: bad node list {short(text)}: {exc}") from None


_DURATION = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)$")


def duration_text(value: str, where: str) -> float | None:
    """Slurm text duration (``[D-][HH:]MM:SS``, ``UNLIMITED``, ``N/A``) -> seconds or None."""
    text = value.strip()
    if text.upper() in {"UNLIMITED", "INFINITE", "N/A", "NONE", "", "PARTITION_LIMIT"}:
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


def gres_gpus(value: Any, where: str) -> int:
    """GPU count in a gres string: ``gpu:4``, ``gpu:a100:2(S:0)``, ``gpu:4(IDX:0-3),foo:1``."""
    text = as_str(value, where)
    total = 0
    for item in _split_top_level(text):
        item = item.strip()
        if not (item == "gpu" or item.startswith("gpu:") or item.startswith("gres:gpu")):
            continue
        if item.startswith("gres:"):
            item = item[len("gres:") :]
        item = item.split("(", 1)[0]
        count = item.rsplit(":", 1)[-1] if ":" in item else "1"
        if not count.isdigit():  # "gpu:a100" without a count means one
            count = "1"
        total += int(count)
    return total


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
    parts, depth, current = [], 0, []
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
