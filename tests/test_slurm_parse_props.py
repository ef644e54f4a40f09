"""Property tests: on truncated, mutated or random input every parser either returns
typed dataclasses or raises the typed SlurmParseError/SlurmRejected -- never a
KeyError/TypeError/ValueError from inside."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.errors import SlurmParseError, SlurmUnreachable
from slurm_elastic.slurm import parse_json, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
Parser = Callable[[Any], tuple[Any, ...]]

# (version/file, parser): 22.05's hand-captured documents, then the scripted scenario in
# every JSON generation of 24.11 and 26.05 (v0.0.40-v0.0.45: object numbers, state lists).
JSON_CASES: list[tuple[str, Parser]] = [
    ("22.05/squeue-running-pending.json", parse_json.squeue),
    ("22.05/squeue-hetjob.json", parse_json.squeue),
    ("22.05/sinfo-mixed-drained.json", parse_json.sinfo),
    ("22.05/sacct-resized-requeued-het.json", parse_json.sacct),
    *[
        (f"{version}/{name}.{generation}.json", parser)
        for version, generations in (("24.11", (40, 41, 42)), ("26.05", (42, 43, 44, 45)))
        for generation in (f"0.0.{minor}" for minor in generations)
        for name, parser in (
            ("squeue-pending", parse_json.squeue),
            ("scontrol-nodes-drained", parse_json.scontrol_nodes),
            ("sacct", parse_json.sacct),
        )
    ],
    ("24.11/squeue-het.0.0.42.json", parse_json.squeue),
    ("26.05/squeue-het.0.0.45.json", parse_json.squeue),
]


def squeue_text(text: str) -> tuple[Any, ...]:
    """The squeue -O parser with the text fixtures' separator (CAPTURED.md)."""
    return parse_text.parse_squeue_text(text, separator=parse_text.CAPTURE_SEPARATOR)


def sacct_text(text: str) -> tuple[Any, ...]:
    """The sacct -p parser with the text fixtures' separator (CAPTURED.md)."""
    return parse_text.parse_sacct_text(text, separator=parse_text.CAPTURE_SEPARATOR)


TEXT_CASES: list[tuple[str, Parser]] = [
    ("22.05/scontrol-o-show-job-running-pending.txt", parse_text.parse_scontrol_jobs),
    ("22.05/scontrol-o-show-partition.txt", parse_text.parse_scontrol_partitions),
    ("22.05/squeue-O-het.txt", squeue_text),
    ("22.05/sacct-P-all.txt", sacct_text),
    ("24.11/scontrol-o-show-job-het.txt", parse_text.parse_scontrol_jobs),
    ("24.11/squeue-O-het.txt", squeue_text),
    ("26.05/scontrol-o-show-job-het.txt", parse_text.parse_scontrol_jobs),
    ("26.05/scontrol-o-show-partition.txt", parse_text.parse_scontrol_partitions),
    ("26.05/squeue-O-pending.txt", squeue_text),
    ("26.05/sacct-P.txt", sacct_text),
]
ALL_PARSERS = [
    parse_json.squeue,
    parse_json.sinfo,
    parse_json.scontrol_nodes,
    parse_json.sacct,
    parse_text.parse_scontrol_jobs,
    parse_text.parse_scontrol_partitions,
    squeue_text,
    sacct_text,
]
TYPED = (SlurmParseError, SlurmUnreachable)
QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def survives(parser: Callable[[Any], tuple[Any, ...]], data: Any) -> None:
    try:
        result = parser(data)
    except TYPED as exc:
        message = str(exc)
        assert message and "\n" not in message  # one line, says what and where
        return
    assert isinstance(result, tuple)


@pytest.mark.parametrize(("name", "parser"), JSON_CASES + TEXT_CASES)
@QUICK
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
def test_truncated_output(name: str, parser: Callable[[Any], Any], fraction: float) -> None:
    text = (FIXTURES / name).read_text()
    survives(parser, text[: int(len(text) * fraction)])


@pytest.mark.parametrize("parser", ALL_PARSERS)
@QUICK
@given(garbage=st.text(max_size=300))
def test_random_text(parser: Callable[[Any], Any], garbage: str) -> None:
    survives(parser, garbage)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)


@pytest.mark.parametrize(("name", "parser"), JSON_CASES)
@QUICK
@given(data=st.data())
def test_mutated_json_fields(name: str, parser: Callable[[Any], Any], data: st.DataObject) -> None:
    """Replace one field of one record with an arbitrary JSON value (wrong type, null, ...)."""
    doc = json.loads((FIXTURES / name).read_text())
    key = next(k for k in ("jobs", "nodes") if k in doc)
    record = data.draw(st.sampled_from(doc[key]))
    field = data.draw(st.sampled_from(sorted(record)))
    record[field] = data.draw(JSON_VALUES)
    survives(parser, json.dumps(doc))


# Where v0.0.40+ nest what the parsers read: number objects, state lists, sacct's blocks.
NESTED = ("node_count", "max_nodes", "time_limit", "start_time", "het_job_id", "job_state",
          "state", "time", "het", "comment")  # fmt: skip
NEW_GENERATIONS = [(n, p) for n, p in JSON_CASES if not n.startswith("22.05/")]


@pytest.mark.parametrize(("name", "parser"), NEW_GENERATIONS)
@QUICK
@given(data=st.data())
def test_mutated_nested_values(
    name: str, parser: Callable[[Any], Any], data: st.DataObject
) -> None:
    """Inside a number object ({set, infinite, number}), a state list or sacct's state /
    time / het / comment objects, replace one member (or the list) with any JSON value."""
    doc = json.loads((FIXTURES / name).read_text())
    key = next(k for k in ("jobs", "nodes") if k in doc)
    record = data.draw(st.sampled_from(doc[key]))
    field = data.draw(st.sampled_from([f for f in NESTED if f in record]))
    value = record[field]
    if isinstance(value, dict) and value:
        value[data.draw(st.sampled_from(sorted(value)))] = data.draw(JSON_VALUES)
    elif isinstance(value, list):
        record[field] = data.draw(st.lists(JSON_VALUES, max_size=3))
    else:
        record[field] = data.draw(JSON_VALUES)
    survives(parser, json.dumps(doc))


@pytest.mark.parametrize(("name", "parser"), TEXT_CASES)
@QUICK
@given(data=st.data())
def test_mutated_text_lines(name: str, parser: Callable[[Any], Any], data: st.DataObject) -> None:
    """Overwrite a slice of a real line with random text."""
    lines = (FIXTURES / name).read_text().splitlines()
    index = data.draw(st.integers(0, len(lines) - 1))
    line = lines[index]
    start = data.draw(st.integers(0, len(line)))
    end = data.draw(st.integers(start, len(line)))
    lines[index] = line[:start] + data.draw(st.text(max_size=20)) + line[end:]
    survives(parser, "\n".join(lines))
