"""Parsers on the fixtures of every Slurm version in the matrix (22.05, 24.11, 26.05).

Each version's fixtures were captured from a real local cluster of that version; how, and
what each file holds, is in ``tests/fixtures/slurm/<version>/CAPTURED.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.slurm.parse_text import parse_scontrol_partitions

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_whole_node_flag_on_every_version(version: str) -> None:
    """``batch`` is OverSubscribe=EXCLUSIVE in slurm.conf; 26.05 shows it as Exclusive=NODE."""
    text = (FIXTURES / version / "scontrol-o-show-partition.txt").read_text()
    views = {p.name: p for p in parse_scontrol_partitions(text)}
    assert set(views) == {"batch", "shared"}
    assert views["batch"].exclusive and views["batch"].is_default
    assert not views["shared"].exclusive and not views["shared"].is_default
    assert views["batch"].nodes == ("n1", "n2", "n3", "n4")
