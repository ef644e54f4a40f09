"""The elastic flag: the marker a user puts in a job's ``--comment``.

Grammar (version 1)
-------------------
The marker is ONE token of the comment; tokens are separated by whitespace or ``;`` so
the rest of the comment stays free text::

    marker   := "elastic" [ "/" version ] [ ":" option { "," option } ]
    version  := "1"                        (the only version so far; implied when absent)
    option   := key "=" value
    key      := "min" | "max" | "step" | "gpus" | "cost"
    value    := 1 to 6 ASCII digits

``min``/``max``: node range (>= 1); ``step``: allowed sizes are min, min+step, ... (>= 1,
must divide max - min); ``gpus``: GPUs per node the job uses (>= 0); ``cost``: the user's
estimate in seconds of one restart at a new size (>= 0; the daemon measures it later).

Examples::

    sbatch --nodes=2-8 --comment=elastic train.sh
    sbatch --nodes=2-8 --comment="elastic:step=2,cost=30 nightly run" train.sh
    sbatch --comment=elastic/1:min=2,max=8,gpus=4 train.sh

A token is a marker when it is ``elastic`` or starts with ``elastic:`` or ``elastic/``;
``elasticity`` or ``Elastic`` are ordinary words.  Everything is case-sensitive.

Markers and ``--nodes``
-----------------------
At submission ``etc/job_submit.lua`` checks the marker with the same rules and messages,
rejects a marker whose ``min``/``max`` disagree with ``--nodes=MIN-MAX``, sets the job's
node range from the marker when ``--nodes`` was not given, and completes a marker without
``min``/``max`` from ``--nodes`` (``elastic`` -> ``elastic:min=2,max=8``).  It completes
the marker because the job's range does not survive in Slurm: the daemon pins pending jobs
with ``NumNodes=n-n`` and a running job reports only its current size.  So after
submission **the marker wins**: :func:`resolve_spec` takes ``min``/``max`` from the marker
and falls back to the job's reported range only for values the marker leaves out.

Comments that cannot be trusted
-------------------------------
Slurm stores a comment byte for byte and the daemon decodes what it reads with
replacement (U+FFFD for bytes that are not UTF-8).  A comment holding a replaced byte,
a control character (a newline, an escape), or an invisible format character that
reorders or hides text (bidi overrides, zero-width marks, U+2028/2029) does not say
for sure what its owner wrote: :func:`untrusted` names the first such character, and the
daemon leaves that job alone with the reason (``slurm-elastic status``) instead of
guessing a marker from it.  A tab is whitespace, as in ``job_submit.lua``.

Bounded ranges
--------------
A range is worth only what the job's partitions can ever give: the fewest of a partition's
node count and its ``MaxNodes``, the most of that over the partitions the job may run in
(its *capacity*).  At submission the plugin caps ``max`` at the capacity (on the ``step``
grid: ``elastic:min=1,max=999999`` on 4 nodes is stored as ``elastic:min=1,max=4``, and
``--nodes`` with it) and rejects a ``min`` above it; the daemon caps again every cycle
(:func:`cap_spec`), so neither a comment changed later with ``scontrol update`` nor a
cluster without the plugin can make it plan more sizes than the cluster has nodes.  The
daemon's capacity also holds the per-job node limits of the job's QOS, its partition's QOS
and its association, which the plugin does not read (``daemon.problem.job_capacity``).

Companion jobs (submitted by the daemon to grow a job) carry the token
``slurm-elastic:companion-of=<PARENT_JOBID>`` and are never elastic themselves:
:func:`parse_marker` returns ``None`` for them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

from slurm_elastic.errors import MarkerError, OutOfReach
from slurm_elastic.types import ElasticSpec

__all__ = [
    "COMPANION_PREFIX",
    "KEYS",
    "MARKER_WORD",
    "SUPPORTED_VERSIONS",
    "MarkerToken",
    "cap_spec",
    "capped_max",
    "check_submission",
    "complete_marker",
    "find_marker_token",
    "format_companion",
    "format_marker",
    "parse_companion",
    "parse_marker",
    "parse_token",
    "resolve_spec",
    "tokens",
    "untrusted",
]

MARKER_WORD = "elastic"
COMPANION_PREFIX = "slurm-elastic:companion-of="
SUPPORTED_VERSIONS = (1,)
KEYS = ("min", "max", "step", "gpus", "cost")  # also the canonical order of format_marker
MAX_DIGITS = 6

# Exactly Lua's %s plus ';' (not Unicode whitespace): job_submit.lua must split the same way.
_TOKEN = re.compile(r"[^ \t\n\v\f\r;]+")
_DIGITS = re.compile(r"[0-9]+")
_LOWEST = {"min": 1, "max": 1, "step": 1, "gpus": 0, "cost": 0}
# What makes a comment untrusted (module docstring): C0 controls but tab, DEL, C1
# controls, the replacement character, zero-width and bidi format characters, BOM, and
# the Unicode line and paragraph separators.
_UNTRUSTED = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\ufffd\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)


@dataclass(frozen=True, slots=True)
class MarkerToken:
    """One parsed marker; ``None`` fields were not given."""

    version: int = 1
    explicit_version: bool = False  # written as ``elastic/1``: kept so formatting round-trips
    min_nodes: int | None = None
    max_nodes: int | None = None
    step: int | None = None
    gpus_per_node: int | None = None
    cost_s: int | None = None


# --------------------------------------------------------------------------- tokens


def tokens(comment: str | None) -> list[str]:
    """The comment's tokens (whitespace or ``;`` separated)."""
    return _TOKEN.findall(comment or "")


def _is_marker_token(token: str) -> bool:
    return token == MARKER_WORD or token.startswith((MARKER_WORD + ":", MARKER_WORD + "/"))


def _is_companion_token(token: str) -> bool:
    return token.startswith("slurm-elastic:")


def find_marker_token(comment: str | None) -> str | None:
    """The marker token of a comment, None when there is none; two markers are an error."""
    found = [t for t in tokens(comment) if _is_marker_token(t)]
    if len(found) > 1:
        raise MarkerError(_msg(found[1], "more than one elastic marker in the comment"))
    return found[0] if found else None


def _show(text: str, limit: int = 20) -> str:
    # One bounded line: a hostile comment must not smuggle newlines or pages into logs.
    # Lua (job_submit.lua) replaces ASCII control bytes the same way; Python also catches
    # Unicode line breaks such as U+2028, which str.splitlines() would split on.
    shown = text if len(text) <= limit else text[: limit - 3] + "..."
    return "".join(ch if ch.isprintable() else "?" for ch in shown)


def _msg(token: str, reason: str) -> str:
    return f"invalid elastic marker '{_show(token, 60)}': {reason}"


def untrusted(comment: str | None) -> str | None:
    """Why ``comment`` cannot be trusted (module docstring), None when it can."""
    found = _UNTRUSTED.search(comment or "")
    if found is None:
        return None
    char = found.group()
    if char == "\ufffd":
        return "the comment holds bytes that are not UTF-8"
    return f"the comment holds control or format character U+{ord(char):04X}"


# --------------------------------------------------------------------------- parse


def parse_token(token: str) -> MarkerToken:
    """Parse one marker token (which must start with ``elastic``); MarkerError if malformed."""
    if not _is_marker_token(token):
        raise MarkerError(_msg(token, "not an elastic marker"))
    head, colon, options = token.partition(":")
    version, explicit = 1, False
    if head != MARKER_WORD:
        text = head[len(MARKER_WORD) + 1 :]
        if text not in {str(v) for v in SUPPORTED_VERSIONS}:
            supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
            raise MarkerError(
                _msg(token, f"unknown version '{_show(text)}' (supported: {supported})")
            )
        version, explicit = int(text), True
    values: dict[str, int] = {}
    if colon:
        if not options:
            raise MarkerError(_msg(token, "empty option list after ':'"))
        for option in options.split(","):
            key, eq, raw = option.partition("=")
            if not eq or not key:
                raise MarkerError(_msg(token, f"option '{_show(option)}' is not key=value"))
            if key not in KEYS:
                raise MarkerError(
                    _msg(token, f"unknown key '{_show(key)}' (known: {', '.join(KEYS)})")
                )
            if key in values:
                raise MarkerError(_msg(token, f"duplicate key '{key}'"))
            values[key] = _value(token, key, raw)
    marker = MarkerToken(
        version=version,
        explicit_version=explicit,
        min_nodes=values.get("min"),
        max_nodes=values.get("max"),
        step=values.get("step"),
        gpus_per_node=values.get("gpus"),
        cost_s=values.get("cost"),
    )
    _check_range(token, marker.min_nodes, marker.max_nodes, marker.step)
    return marker


def _value(token: str, key: str, raw: str) -> int:
    if not _DIGITS.fullmatch(raw):
        raise MarkerError(_msg(token, f"{key} must be a whole number, got '{_show(raw)}'"))
    if len(raw) > MAX_DIGITS:
        raise MarkerError(_msg(token, f"{key} is too large ({len(raw)} digits, at most 6)"))
    value = int(raw)
    if value < _LOWEST[key]:
        raise MarkerError(_msg(token, f"{key} must be at least {_LOWEST[key]}, got {value}"))
    return value


def _check_range(token: str, low: int | None, high: int | None, step: int | None) -> None:
    if low is None or high is None:
        return
    if low > high:
        raise MarkerError(_msg(token, f"min={low} is greater than max={high}"))
    if step is not None and (high - low) % step:
        raise MarkerError(
            _msg(token, f"step={step} does not divide max-min={high - low} (min={low}, max={high})")
        )


def parse_marker(comment: str | None) -> MarkerToken | None:
    """The comment's marker; None when it has none or is a companion's. MarkerError if bad."""
    if parse_companion(comment) is not None:
        return None
    token = find_marker_token(comment)
    return None if token is None else parse_token(token)


def parse_companion(comment: str | None) -> int | None:
    """The parent job id of a companion job's comment, None when it is not a companion."""
    for token in tokens(comment):
        if not _is_companion_token(token):
            continue
        parent = token[len(COMPANION_PREFIX) :] if token.startswith(COMPANION_PREFIX) else ""
        if not _DIGITS.fullmatch(parent) or len(parent) > 12 or int(parent) == 0:
            raise MarkerError(
                _msg(token, f"companion token must be {COMPANION_PREFIX}<PARENT_JOBID>")
            )
        return int(parent)
    return None


# Pure, and read for every active job every cycle (twice for a companion: classify, then
# orphan_reason): parsed once per distinct comment.
@functools.lru_cache(maxsize=4096)
def companion_parent(comment: str) -> int | None:
    """The parent job id when ``comment`` links a companion job, else None.

    A malformed companion token links nothing: such a job is neither counted in a
    parent's size nor ever cancelled as an orphan.
    """
    try:
        return parse_companion(comment)
    except MarkerError:
        return None


# --------------------------------------------------------------------------- combine


def resolve_spec(comment: str | None, min_nodes: int, max_nodes: int | None) -> ElasticSpec | None:
    """The job's ElasticSpec from its marker and its reported node range, None if not elastic.

    The marker wins (see the module docstring): the job's ``min_nodes``/``max_nodes`` only
    fill in what the marker leaves out.  A missing max means a fixed size (max = min).
    """
    marker = parse_marker(comment)
    if marker is None:
        return None
    token = find_marker_token(comment) or MARKER_WORD
    low = marker.min_nodes if marker.min_nodes is not None else min_nodes
    high = marker.max_nodes if marker.max_nodes is not None else max_nodes
    if high is None:
        high = low
    if low < 1:
        raise MarkerError(_msg(token, f"min must be at least 1, got {low}"))
    _check_range(token, low, high, marker.step)
    return ElasticSpec(
        min_nodes=low,
        max_nodes=high,
        step=marker.step or 1,
        gpus_per_node=marker.gpus_per_node,
        resize_cost_s=None if marker.cost_s is None else float(marker.cost_s),
    )


def capped_max(low: int, high: int, step: int, capacity: int) -> int:
    """``high`` lowered to at most ``capacity``, on the grid low, low+step, ...

    The caller has checked ``low <= capacity``.
    """
    if high <= capacity:
        return high
    return low + (capacity - low) // step * step


def cap_spec(spec: ElasticSpec, capacity: int, token: str | None = None) -> ElasticSpec:
    """The spec with its range capped at ``capacity`` nodes (see "Bounded ranges").

    Raises :class:`OutOfReach` when even the minimum is more than ``capacity`` (its
    message names the marker ``token`` when given, as the plugin's does).
    """
    if spec.min_nodes > capacity:
        reason = f"min={spec.min_nodes} is more than the {capacity} nodes its partitions can give"
        raise OutOfReach(reason if token is None else _msg(token, reason))
    high = capped_max(spec.min_nodes, spec.max_nodes, spec.step, capacity)
    return spec if high == spec.max_nodes else replace(spec, max_nodes=high)


def check_submission(
    comment: str | None,
    min_nodes: int | None,
    max_nodes: int | None,
    *,
    capacity: int | None = None,
) -> ElasticSpec | None:
    """What ``etc/job_submit.lua`` enforces, for one submission (None = not elastic).

    Stricter than :func:`resolve_spec`: a marker ``min``/``max`` must equal the job's
    ``--nodes`` range when the user gave one (``min_nodes`` None = no ``--nodes``).
    ``capacity``: what the job's partitions can ever give (None = unknown, no cap); the
    answer's range is capped at it, and a minimum above it is an :class:`OutOfReach`.
    """
    spec = _submitted_spec(comment, min_nodes, max_nodes)
    if spec is None or capacity is None:
        return spec
    return cap_spec(spec, capacity, find_marker_token(comment) or MARKER_WORD)


def _submitted_spec(
    comment: str | None, min_nodes: int | None, max_nodes: int | None
) -> ElasticSpec | None:
    marker = parse_marker(comment)
    if marker is None:
        return None
    token = find_marker_token(comment) or MARKER_WORD
    if min_nodes is not None:
        high = max_nodes if max_nodes is not None else min_nodes
        given = f"{min_nodes}-{high}" if high != min_nodes else str(min_nodes)
        for key, mine, theirs in (
            ("min", marker.min_nodes, min_nodes),
            ("max", marker.max_nodes, high),
        ):
            if mine is not None and mine != theirs:
                raise MarkerError(_msg(token, f"{key}={mine} disagrees with --nodes={given}"))
        return resolve_spec(comment, min_nodes, high)
    if marker.min_nodes is None:
        raise MarkerError(_msg(token, "no node range: give --nodes=MIN-MAX or min= in the marker"))
    return resolve_spec(comment, marker.min_nodes, marker.max_nodes)


def complete_marker(
    comment: str, min_nodes: int | None, max_nodes: int | None, *, capacity: int | None = None
) -> str:
    """The comment as ``etc/job_submit.lua`` stores it: the marker with min and max filled in
    (max capped at ``capacity``, see :func:`check_submission`).

    Raises MarkerError where the plugin rejects the job; returns the comment unchanged when
    it has no marker or the marker already names both min and max within the capacity.
    """
    spec = check_submission(comment, min_nodes, max_nodes, capacity=capacity)
    marker = parse_marker(comment)
    if spec is None or marker is None:
        return comment
    if marker.min_nodes is not None and marker.max_nodes == spec.max_nodes:
        return comment
    full = format_marker(replace(marker, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes))
    for match in _TOKEN.finditer(comment):
        if _is_marker_token(match.group()):
            return comment[: match.start()] + full + comment[match.end() :]
    return comment


# --------------------------------------------------------------------------- format


def format_marker(marker: MarkerToken | ElasticSpec) -> str:
    """The canonical token for a marker (or a spec): ``parse_token(format_marker(m)) == m``."""
    if isinstance(marker, ElasticSpec):
        cost = None if marker.resize_cost_s is None else round(marker.resize_cost_s)
        marker = MarkerToken(
            min_nodes=marker.min_nodes,
            max_nodes=marker.max_nodes,
            step=None if marker.step == 1 else marker.step,
            gpus_per_node=marker.gpus_per_node,
            cost_s=cost,
        )
    values = (marker.min_nodes, marker.max_nodes, marker.step, marker.gpus_per_node, marker.cost_s)
    options = ",".join(f"{k}={v}" for k, v in zip(KEYS, values, strict=True) if v is not None)
    head = f"{MARKER_WORD}/{marker.version}" if marker.explicit_version else MARKER_WORD
    return f"{head}:{options}" if options else head


def format_companion(parent_job_id: int) -> str:
    """The comment token that links a companion job to its parent."""
    if parent_job_id < 1:
        raise MarkerError(f"companion parent job id must be positive, got {parent_job_id}")
    return f"{COMPANION_PREFIX}{parent_job_id}"
