"""Decode Slurm ``--json`` output and dispatch to the normaliser of its generation.

The generation is read from ``meta.plugin.type`` (e.g. ``openapi/v0.0.38``);
each generation has its own pure module (``parse_v0038`` for Slurm 22.05).  An
unknown generation is a ``SlurmParseError`` naming it, never a silent guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from slurm_elastic.errors import SlurmParseError, SlurmUnreachable
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import parse_v0038
from slurm_elastic.types import JobHistory, JobView, NodeView

_GENERATIONS: dict[str, ModuleType] = {t: parse_v0038 for t in parse_v0038.PLUGIN_TYPES}


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
    meta = cv.mapping(cv.field(doc, "meta", what), f"{what}: meta")
    plugin = cv.mapping(cv.field(meta, "plugin", f"{what}: meta"), f"{what}: meta.plugin")
    return cv.as_str(cv.field(plugin, "type", f"{what}: meta.plugin"), f"{what}: meta.plugin.type")


def slurm_release(doc: Mapping[str, Any], what: str) -> str:
    """``meta.Slurm.release`` (e.g. ``22.05.8``), or "" when absent."""
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
    errors = doc.get("errors") or []
    if isinstance(errors, list) and errors:
        first = errors[0]
        if isinstance(first, Mapping):
            parts = [first.get("description"), first.get("error"), first.get("source")]
            detail = "; ".join(str(p) for p in parts if p) or cv.short(first, 120)
        else:
            detail = cv.short(first, 120)
        raise SlurmUnreachable(f"{what}: Slurm could not read its data: {detail}")


def _normalise(text: str | bytes | Mapping[str, Any], what: str, function: str) -> Any:
    doc = decode(text, what)
    module = generation(doc, what)
    _errors(doc, what)
    return getattr(module, function)(doc)


def squeue(text: str | bytes | Mapping[str, Any]) -> tuple[JobView, ...]:
    jobs: tuple[JobView, ...] = _normalise(text, "squeue --json", "parse_squeue")
    return jobs


def sinfo(text: str | bytes | Mapping[str, Any]) -> tuple[NodeView, ...]:
    nodes: tuple[NodeView, ...] = _normalise(text, "sinfo --json", "parse_sinfo")
    return nodes


def sacct(text: str | bytes | Mapping[str, Any]) -> tuple[JobHistory, ...]:
    history: tuple[JobHistory, ...] = _normalise(text, "sacct --json", "parse_sacct")
    return history
