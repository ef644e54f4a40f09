"""Atomic checkpoint files and the job directory's JSON files (no torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.agent.checkpoint import (
    atomic_write,
    checkpoint_path,
    list_checkpoints,
    prune,
)
from slurm_elastic.agent.jobdir import Control, ControlReader, read_json, write_json
from slurm_elastic.errors import AgentError


def test_a_failing_writer_leaves_the_previous_checkpoint_and_no_debris(tmp_path: Path) -> None:
    good = atomic_write(checkpoint_path(tmp_path, 10), lambda h: h.write(b"step ten"))

    def crash(handle) -> None:
        handle.write(b"half of step eleven")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(checkpoint_path(tmp_path, 11), crash)
    assert list_checkpoints(tmp_path) == [(10, good)]
    assert good.read_bytes() == b"step ten"
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]


def test_a_killed_writer_never_exposes_a_torn_file(tmp_path: Path) -> None:
    """SIGKILL in the middle of a write (the way Slurm removes a node's tasks)."""
    code = f"""
import os, signal
from pathlib import Path
from slurm_elastic.agent.checkpoint import atomic_write, checkpoint_path
def writer(handle):
    handle.write(b"x" * 4096)
    handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)
atomic_write(checkpoint_path(Path({str(tmp_path)!r}), 7), writer)
"""
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert proc.returncode == -9
    assert list_checkpoints(tmp_path) == []
    stray = list(tmp_path.glob(".ckpt-*.tmp-*"))
    assert len(stray) == 1  # the dead writer's temporary, never a ckpt-*.pt
    prune(tmp_path, keep=2)
    assert list(tmp_path.iterdir()) == []


def test_list_is_newest_first_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (3, 120, 45):
        atomic_write(checkpoint_path(tmp_path, step), lambda h: h.write(b"."))
    (tmp_path / "ckpt-notastep.pt").write_bytes(b"")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [120, 45, 3]
    prune(tmp_path, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [120, 45]
    assert list_checkpoints(tmp_path / "missing") == []


def test_prune_leaves_a_live_writers_temporary(tmp_path: Path) -> None:
    live = tmp_path / f".ckpt-00000009.pt.tmp-{os.getppid()}"
    live.write_bytes(b"in progress")
    prune(tmp_path, keep=1)
    assert live.exists()


def test_json_files_round_trip_and_bad_ones_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "held.json"
    assert read_json(path) is None
    write_json(path, {"seq": 2, "step": 40})
    assert read_json(path) == {"seq": 2, "step": 40}
    path.write_text("[1, 2]")
    with pytest.raises(AgentError, match="JSON object"):
        read_json(path)
    path.write_text("{not json")
    with pytest.raises(AgentError, match="not valid JSON"):
        read_json(path)


def test_control_reader_sees_each_new_request_once_cheaply(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    assert reader.read() is None
    write_json(tmp_path / "control.json", Control(1, "hold", keep_nodes=("n1",)).to_json())
    first = reader.read()
    assert first == Control(1, "hold", keep_nodes=("n1",))
    assert reader.read() is first  # unchanged file: no re-read
    write_json(tmp_path / "control.json", Control(1, "resume", restart=True).to_json())
    assert reader.read() == Control(1, "resume", restart=True)
