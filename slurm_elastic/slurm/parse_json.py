"""Decode Slurm ``--json`` output and dispatch to the normaliser of its generation.

How the generation is told (measured on 22.05.8, 24.11.5, 26.05.5):

* Slurm 22.05 names it in ``meta.plugin.type`` (``openapi/v0.0.38``, sacct's
  ``openapi/dbv0.0.38``) and its version block is ``meta.Slurm`` with integers;
* from 24.11 on ``meta.plugin.type`` is ``""``, the generation is in
  ``meta.plugin.data_parser`` (``data_parser/v0.0.42``) and the version block is
  ``meta.slurm`` with strings.

So the name is ``meta.plugin.type`` when set, else ``meta.plugin.data_parser``.  Each
generation family has one pure module: ``parse_v0038`` (22.05) and ``parse_v0040``
(v0.0.40-v0.0.45: 24.11 and 26.05).  An unknown generation is a one-line
``SlurmParseError`` naming it, never a silent guess.

Per-node records come from ``sinfo --json`` up to 22.05 and from ``scontrol --json
show nodes`` from 24.11 on; each module names its source in ``NODES_COMMAND``, and
:func:`nodes` reads either document.  ``scontrol --json show job`` exists from 24.11 on
(``JOB_COMMAND``).  :func:`commands` tells a caller both from any document.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from slurm_elastic.errors import SlurmParseError, SlurmUnreachable
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import parse_v0038, parse_v0040
from slurm_elastic.types import JobHistory, JobView, NodeView

_GENERATIONS: dict[str, ModuleType] = {
    name: module for module in (parse_v0038, parse_v0040) for name in module.PLUGIN_TYPES
}


def decode(text: str | bytes | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """JSON text -> document; a truncated/garbage document is a one-line SlurmParseError."""
    if isinstance(text, Mapping):
        return text
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SlurmParseError(f"{what}: not valid JSON ({exc})") from None
    except RecursionError:
        raise SlurmParseError(f"{what}: JSON nested too deeply") from None
    return cv.mapping(doc, what)


def plugin_type(doc: Mapping[str, Any], what: str) -> str:
    """The document's generation: ``openapi/v0.0.38`` (22.05), ``data_parser/v0.0.42``
    (24.11+, where ``meta.plugin.type`` is empty and ``meta.plugin.data_parser`` names it).
    """
    meta = cv.mapping(cv.field(doc, "meta", what), f"{what}: meta")
    plugin = cv.mapping(cv.field(meta, "plugin", f"{what}: meta"), f"{what}: meta.plugin")
    kind = cv.as_str(plugin.get("type"), f"{what}: meta.plugin.type")
    if kind:
        return kind
    return cv.as_str(plugin.get("data_parser"), f"{what}: meta.plugin.data_parser")


def slurm_release(doc: Mapping[str, Any], what: str) -> str:
    """``meta.Slurm.release`` (22.05, e.g. ``22.05.8``) or ``meta.slurm.release``
    (24.11+, ``24.11.5``), or "" when absent."""
    meta = cv.mapping(cv.field(doc, "meta", what), f"{what}: meta")
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    return cv.as_str(cv.mapping(slurm, f"{what}: meta.Slurm").get("release"), f"{what}: release")


def generation(doc: Mapping[str, Any], what: str) -> ModuleType:
    kind = plugin_type(doc, what)
    try:
        return _GENERATIONS[kind]
    except KeyError:
        known = ", ".join(sorted(_GENERATIONS))
        raise SlurmParseError(
            f"{what}: unsupported JSON generation {kind!r} (supported: {known})"
        ) from None


def _errors(doc: Mapping[str, Any], what: str) -> None:
    # 22.05 quirk: with slurmctld down, `squeue --json` / `sinfo --json` exit 0 and print
    # a valid document with an empty list and an "errors" entry ("Failed while looking
    # for jobs", "Unspecified error").  Taking that as "no jobs" would be a disaster, so
    # any error inside a document means the data could not be read.
    listed = doc.get("errors") or []
    errors = [e for e in listed if not _nothing_found(e)] if isinstance(listed, list) else []
    if errors:
        first = errors[0]
        if isinstance(first, Mapping):
            parts = [first.get("description"), first.get("error"), first.get("source")]
            detail = "; ".join(str(p) for p in parts if p) or cv.short(first, 120)
        else:
            detail = cv.short(first, 120)
        raise SlurmUnreachable(f"{what}: Slurm could not read its data: {detail}")


# 22.05's sacct --json reports an empty window as an error (measured on 22.05.8:
# error_number 9003, "Nothing found with query", from slurmdb_jobs_get, and no jobs);
# 24.11+ print an empty list.  An empty window is an answer, not an outage.
_NOTHING_FOUND = 9003


def _nothing_found(error: object) -> bool:
    return isinstance(error, Mapping) and error.get("error_number") == _NOTHING_FOUND


def _normalise(text: str | bytes | Mapping[str, Any], what: str, function: str, *args: Any) -> Any:
    doc = decode(text, what)
    module = generation(doc, what)
    _errors(doc, what)
    return getattr(module, function)(doc, *args)


# The data_parser each release of the matrix is read with, whatever the site made its default
# (slurm.conf ``DataParserParameters``, from 24.11 on): the generation its fixtures were
# captured in (tests/fixtures/slurm/<version>), its newest.
PINNED_PARSERS = {"24.11": "v0.0.42", "26.05": "v0.0.45"}


def json_flag(doc: Mapping[str, Any], what: str) -> str:
    """The ``--json`` option this Slurm's reads use from now on: ``--json=<parser>`` naming
    the release's pinned parser (``PINNED_PARSERS``), else the generation ``doc`` was
    written in (a release outside the matrix: a site that changes its default later does not
    change what is read); plain ``--json`` where the generation has no name to give (22.05's
    ``openapi/v0.0.38``, which takes no argument)."""
    release = ".".join(slurm_release(doc, what).split(".")[:2])
    if release in PINNED_PARSERS:
        return f"--json={PINNED_PARSERS[release]}"
    kind = plugin_type(doc, what)
    if kind.startswith("data_parser/"):
        return f"--json={kind.removeprefix('data_parser/')}"
    return "--json"


@dataclass(frozen=True, slots=True)
class Commands:
    """What the Slurm that wrote a document answers, by its JSON generation."""

    nodes: tuple[str, ...]  # lists nodes one by one: sinfo --json / scontrol --json show nodes
    job: tuple[str, ...] | None  # shows one job as JSON (+ its id); None: scontrol has no --json
    json: str = "--json"  # json_flag: the option every JSON read passes

    def named(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv`` with its ``--json`` naming the data_parser (``json_flag``)."""
        return tuple(self.json if arg == "--json" else arg for arg in argv)


def commands(doc: Mapping[str, Any], what: str) -> Commands:
    """The :class:`Commands` of the Slurm that wrote ``doc``."""
    module = generation(doc, what)
    return Commands(nodes=module.NODES_COMMAND, job=module.JOB_COMMAND, json=json_flag(doc, what))


def squeue(text: str | bytes | Mapping[str, Any]) -> tuple[JobView, ...]:
    jobs: tuple[JobView, ...] = _normalise(text, "squeue --json", "parse_squeue")
    return jobs


def scontrol_jobs(text: str | bytes | Mapping[str, Any]) -> tuple[JobView, ...]:
    """``scontrol --json show job [ID]`` (24.11+): squeue's document shape.  An unknown id
    gives an empty list (exit status 0), not an error."""
    what = "scontrol --json show job"
    jobs: tuple[JobView, ...] = _normalise(text, what, "parse_squeue", what)
    return jobs


def nodes(text: str | bytes | Mapping[str, Any], what: str) -> tuple[NodeView, ...]:
    """Per-node records of ``sinfo --json`` (22.05) or ``scontrol --json show nodes``
    (24.11+); ``what`` names the command in errors."""
    views: tuple[NodeView, ...] = _normalise(text, what, "parse_nodes")
    return views


def sinfo(text: str | bytes | Mapping[str, Any]) -> tuple[NodeView, ...]:
    """``sinfo --json``: nodes in 22.05; a SlurmParseError for 24.11+'s grouped records."""
    return nodes(text, "sinfo --json")


def scontrol_nodes(text: str | bytes | Mapping[str, Any]) -> tuple[NodeView, ...]:
    """``scontrol --json show nodes`` (24.11+)."""
    return nodes(text, "scontrol --json show nodes")


def sacct(text: str | bytes | Mapping[str, Any]) -> tuple[JobHistory, ...]:
    history: tuple[JobHistory, ...] = _normalise(text, "sacct --json", "parse_sacct")
    return history
