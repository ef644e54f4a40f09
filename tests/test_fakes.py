"""The shared fakes keep the contracts they stand in for."""

from __future__ import annotations

import inspect

import pytest

from slurm_elastic.sim.backend import SimBackend
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend
from tests.fakes import RecordingBackend, ScriptedRunner
from tests.test_daemon_controller_data import pending, snapshot

MEMBERS = sorted(
    name
    for name, value in vars(SlurmBackend).items()
    if not name.startswith("_") and inspect.isfunction(value)
)


def _params(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def mismatches(cls: type, *, annotations: bool) -> list[str]:
    """The protocol's methods that ``cls`` lacks or declares with another signature
    (parameter names, kinds and defaults; with ``annotations``, the types too)."""
    wrong = []
    for name in MEMBERS:
        mine = getattr(cls, name, None)
        if not callable(mine):
            wrong.append(f"{name}: missing")
            continue
        want, got = inspect.signature(getattr(SlurmBackend, name)), inspect.signature(mine)
        same = want == got if annotations else _params(want) == _params(got)
        if not same:
            wrong.append(f"{name}: {got} != {want}")
    return wrong


def test_the_protocol_has_the_members_the_daemon_uses() -> None:
    assert {"read_cluster", "shrink", "submit", "signal", "requeue", "reconfigure"} <= set(MEMBERS)


def test_recording_backend_implements_every_protocol_method_exactly() -> None:
    assert mismatches(RecordingBackend, annotations=True) == []
    assert isinstance(RecordingBackend(snapshot([])), SlurmBackend)


@pytest.mark.parametrize("backend", [CliBackend, PyslurmBackend, SimBackend])
def test_real_backends_take_the_protocol_parameters(backend: type) -> None:
    assert mismatches(backend, annotations=False) == []


def test_the_check_catches_a_wrong_or_missing_method() -> None:
    class Partial(RecordingBackend):
        def shrink(self, job_id: int, count: int) -> None:  # type: ignore[override]
            return None

    class Missing:
        pass

    assert [m.split(":")[0] for m in mismatches(Partial, annotations=True)] == ["shrink"]
    assert mismatches(Missing, annotations=False) == [f"{m}: missing" for m in MEMBERS]


def test_recording_backend_records_actions_not_reads() -> None:
    backend = RecordingBackend(snapshot([pending(7)]))
    assert backend.read_jobs()[0].job_id == 7 and backend.read_partitions()[0].name == "batch"
    backend.read_history(0.0)
    backend.signal(7, "USR1", batch_only=True)
    job_id = backend.submit("#!/bin/sh\n", user="se-alice", nodes=2, partition="batch")
    assert job_id == 501
    assert [c[0] for c in backend.actions()] == ["signal", "submit"]


def test_scripted_runner_answers_known_commands_only() -> None:
    runner = ScriptedRunner({"scontrol --version": "slurm 24.11.1\n"})
    assert runner.read(["scontrol", "--version"]).stdout == "slurm 24.11.1\n"
    assert runner.argvs == [("scontrol", "--version")] and runner.calls == 1
    with pytest.raises(AssertionError, match="unexpected command: squeue --json"):
        runner.read(["squeue", "--json"])
