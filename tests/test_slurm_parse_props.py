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

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "22.05"

JSON_CASES: list[tuple[str, Callable[[Any], tuple[Any, ...]]]] = [
    ("squeue-running-pending.json", parse_json.squeue),
    ("squeue-hetjob.json", parse_json.squeue),
    ("sinfo-mixed-drained.json", parse_json.sinfo),
    ("sacct-resized-requeued-het.json", parse_json.sacct),
]
TEXT_CASES: list[tuple[str, Callable[[str], tuple[Any, ...]]]] = [
    ("scontrol-o-show-job-running-pending.txt", parse_text.parse_scontrol_jobs),
    ("scontrol-o-show-partition.txt", parse_text.parse_scontrol_partitions),
    ("squeue-o-hetjob.txt", parse_text.parse_squeue_text),
    ("sacct-P-all.txt", parse_text.parse_sacct_text),
]
ALL_PARSERS = [p for _, p in JSON_CASES] + [p for _, p in TEXT_CASES]
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
