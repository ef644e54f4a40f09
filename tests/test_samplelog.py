"""The sample log's readers on hand-made records (the format ``SampleLog.write`` writes):
what a surviving worker felt at each resize."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.samplelog import SampleLog, read_records, survivor_pauses


def rec(node: str, t: float, step: int, world: int, pid: int) -> dict:
    return {"node": node, "t": t, "step": step, "world": world, "pid": pid, "gen": 0}


def test_a_stop_free_shrink_and_grow_pause_the_survivor_without_a_restart() -> None:
    records = [
        rec("n1", 0.0, 0, 2, 11),
        rec("n2", 0.0, 0, 2, 22),
        rec("n1", 0.2, 1, 2, 11),
        rec("n2", 0.2, 1, 2, 22),  # n2 leaves after step 1
        rec("n1", 1.1, 2, 1, 11),  # the shrink: 0.9 s
        rec("n1", 1.3, 3, 1, 11),
        rec("n1", 1.5, 4, 3, 11),  # the grow: 0.2 s
        rec("n3", 1.5, 4, 3, 33),  # newcomers: no step of theirs before, not survivors
        rec("n4", 1.5, 4, 3, 44),
    ]
    pauses = survivor_pauses(records)
    assert [(p.node, p.from_world, p.to_world, p.restarted) for p in pauses] == [
        ("n1", 2, 1, False),
        ("n1", 1, 3, False),
    ]
    assert [p.seconds for p in pauses] == pytest.approx([0.9, 0.2])


def test_a_restart_is_a_new_process_and_a_node_that_comes_back_is_no_survivor() -> None:
    records = [
        rec("n1", 0.0, 10, 2, 11),
        rec("n2", 0.0, 10, 2, 22),
        rec("n1", 9.0, 9, 1, 12),  # torchrun: restored step 9 in a new process
        rec("n2", 30.0, 40, 3, 23),  # n2 left at step 10 and came back at 40
    ]
    (pause,) = survivor_pauses(records)
    assert (pause.node, pause.seconds, pause.restarted) == ("n1", 9.0, True)


def test_what_the_writer_writes_the_reader_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    log = SampleLog(tmp_path, generation=3, rank=0)
    log.write(step=0, epoch=0, world=1, nodes=1, indices=[1, 2])
    log.write(step=1, epoch=0, world=2, nodes=2, indices=[3], generation=4, rank=1)
    (tmp_path / "samples-g9-r0.jsonl").write_text('{"cut": ')  # a line cut mid-write
    first, second = read_records(tmp_path)
    assert (first["node"], first["gen"], second["gen"], second["rank"]) == ("n7", 3, 4, 1)
    (pause,) = survivor_pauses([first, second])
    assert not pause.restarted
