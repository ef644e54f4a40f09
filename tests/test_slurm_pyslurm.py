"""The pyslurm backend without a cluster: its field mapping on pyslurm's own dictionaries
captured beside the CLI outputs of the same moment, and its error/retry/conf handling on a
stand-in pyslurm module.  The live suite (tests/test_slurm_backend_live.py) runs every
backend test against the real cluster with the real pyslurm.

Fixtures: tests/fixtures/slurm/22.05/pyslurm-moment/ (CAPTURED.md, "pyslurm"), and
tests/fixtures/slurm/24.11/pyslurm-moment/ for pyslurm 24.11's partitions.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from slurm_elastic.errors import (
    ActionRefused,
    ConfigError,
    SlurmBusy,
    SlurmParseError,
    SlurmRejected,
    SlurmUnreachable,
)
from slurm_elastic.slurm import parse_json, parse_text, pyslurm_backend
from slurm_elastic.slurm.pyslurm_backend import (
    PyslurmBackend,
    job_view,
    node_state,
    node_view,
    partition_record,
    partition_view,
    signal_number,
)
from slurm_elastic.types import JobState
from tests.fakes import ScriptedRunner

MOMENT = Path(__file__).parent / "fixtures" / "slurm" / "22.05" / "pyslurm-moment"


def read(name: str) -> str:
    return (MOMENT / name).read_text(encoding="utf-8")


def records(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(read(name))
    return loaded


def differences(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)
        if getattr(a, f.name) != getattr(b, f.name)
    }


# --------------------------------------------------------------------------- mapping


def test_jobs_equal_squeue_json_of_the_same_moment_but_described_reasons() -> None:
    ours = {v.job_id: v for v in (job_view(r) for r in records("pyslurm-jobs.json").values())}
    cli = {v.job_id: v for v in parse_json.squeue(read("squeue.json"))}
    described = {
        j["job_id"]: j["state_description"]
        for j in json.loads(read("squeue.json"))["jobs"]
        if j["state_description"]
    }
    assert sorted(ours) == sorted(cli) and len(ours) == 13
    assert described, "the moment has jobs whose reason carries a description"
    for job_id, view in cli.items():
        diff = differences(ours[job_id], view)
        if job_id in described:
            # pyslurm 22.5 gives the description (as scontrol), squeue --json the code.
            assert diff == {
                "state_reason": (described[job_id].replace(" ", "_"), view.state_reason)
            }
        else:
            assert diff == {}, job_id


def test_the_moment_covers_what_the_daemon_reads() -> None:
    jobs = {v.name: v for v in (job_view(r) for r in records("pyslurm-jobs.json").values())}
    resized = jobs["run3"]
    assert resized.nodes == ("n1", "n2") and resized.resize_time is not None
    assert resized.admin_comment == "slurm-elastic: shrunk 3->2"
    assert jobs["gpu2"].gpus_per_node == 2
    assert (jobs["pend24"].min_nodes, jobs["pend24"].max_nodes) == (2, 4)  # from the TRES
    assert jobs["pend24"].time_limit_s == 1800.0 and jobs["pend24"].start_time is None
    assert jobs["pend24"].comment == "free text JobState=FAKE | pipe"
    assert (jobs["rq"].state_reason, jobs["rq"].restart_count) == ("BeginTime", 1)
    assert jobs["fail1"].state is JobState.FAILED
    # The reasons the daemon acts on come through as codes (no description attached).
    reasons = {jobs[n].state_reason for n in ("dep", "never", "later", "adminheld")}
    assert reasons == {"Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldAdmin"}
    # Non-UTF-8 bytes in user data: replaced, the read goes on.
    held = job_view(records("pyslurm-jobs.json")["1017"])
    assert (held.name, held.comment, held.state_reason) == (
        "n\ufffdme",
        "bad\ufffdbyte",
        "JobHeldUser",
    )


def test_nodes_and_partitions_equal_sinfo_and_scontrol() -> None:
    nodes = tuple(node_view(r) for r in records("pyslurm-nodes.json").values())
    assert nodes == parse_json.sinfo(read("sinfo.json"))
    by_name = {n.name: n for n in nodes}
    assert (by_name["n3"].state, by_name["n3"].alloc_gpus) == ("mixed", 2)
    assert by_name["n4"].flags == ("DRAIN",) and not by_name["n4"].is_usable
    assert by_name["n4"].reason == "maint x\ufffdy"
    for ours, theirs in (
        ("pyslurm-partitions.json", "scontrol-o-show-partition.txt"),
        ("pyslurm-partitions-inactive.json", "scontrol-o-show-partition-inactive.txt"),
    ):
        views = tuple(partition_view(r) for r in records(ours).values())
        assert views == parse_text.parse_scontrol_partitions(read(theirs))
    raw = records("pyslurm-partitions-inactive.json").values()
    inactive = {p.name: p for p in (partition_view(r) for r in raw)}
    # pyslurm: "" for INACTIVE, max_time in seconds (2 days here).
    assert (inactive["shared"].state, inactive["shared"].max_time_s) == ("INACTIVE", 172800.0)
    assert inactive["batch"].state == "DRAIN"


def test_partition_qos_equals_scontrol() -> None:
    """pyslurm's qos_char is the partition's own QOS (captured with one set on "shared",
    ../limits/, CAPTURED.md "Node limits")."""
    limits = MOMENT.parent / "limits"
    raw = json.loads((limits / "pyslurm-partitions.json").read_text(encoding="utf-8"))
    views = tuple(partition_view(r) for r in raw.values())
    scontrol = (limits / "scontrol-o-show-partition.txt").read_text(encoding="utf-8")
    assert views == parse_text.parse_scontrol_partitions(scontrol)
    assert {p.name: p.qos for p in views} == {"batch": "", "shared": "se-cluster3-part2"}


def test_pyslurm_24_partitions_equal_scontrol() -> None:
    """pyslurm 24.11's ``Partition`` objects (their attributes as captured, with a job
    pending that Slurm could not schedule: the moment its deprecated ``partition().get()``
    raises OverflowError) map to the views ``scontrol -o show partition`` gives."""
    moment = MOMENT.parent.parent / "24.11" / "pyslurm-moment"
    attrs = json.loads((moment / "pyslurm-partitions.json").read_text(encoding="utf-8"))
    views = tuple(partition_view(partition_record(SimpleNamespace(**a))) for a in attrs)
    scontrol = (moment / "scontrol-o-show-partition.txt").read_text(encoding="utf-8")
    assert views == parse_text.parse_scontrol_partitions(scontrol)
    shared = {p.name: p for p in views}["shared"]
    assert (shared.max_nodes, shared.max_time_s, shared.qos) == (2, 3600.0, "se-capture-q")


def test_one_job_equals_scontrol_show_job(utc: None) -> None:
    ours = [job_view(r) for r in json.loads(read("pyslurm-job-resized.json"))]
    assert ours == list(parse_text.parse_scontrol_jobs(read("scontrol-o-show-job-resized.txt")))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("IDLE", ("idle", ())),
        ("MIXED+DRAIN", ("mixed", ("DRAIN",))),
        ("IDLE*", ("idle", ("NOT_RESPONDING",))),
        ("DOWN*+DRAIN", ("down", ("NOT_RESPONDING", "DRAIN"))),
        ("ALLOCATED+COMPLETING", ("allocated", ("COMPLETING",))),
        ("IDLE~+POWER", ("idle", ("POWERED_DOWN", "POWERED_DOWN"))),
        ("MAINT", ("idle", ("MAINTENANCE",))),
        ("INVAL", ("unknown", ("INVALID_REG",))),
    ],
)
def test_node_state_strings(text: str, expected: tuple[str, tuple[str, ...]]) -> None:
    assert node_state(text) == expected


def test_bad_values_name_the_record() -> None:
    with pytest.raises(SlurmParseError, match=r"pyslurm node state: no base state"):
        node_state("*")
    raw = dict(records("pyslurm-jobs.json")["1011"], num_nodes="many")
    with pytest.raises(SlurmParseError, match=r"^pyslurm job 1011: num_nodes: expected an int"):
        job_view(raw)
    assert job_view(dict(raw, num_nodes=2, time_limit="Partition_Limit")).time_limit_s is None


def test_signal_names() -> None:
    assert signal_number("USR1") == signal_number("sigusr1") == int(signal.SIGUSR1)
    assert signal_number("10") == 10
    for bad in ("FOO", "USR1; rm -rf /", ""):
        with pytest.raises(ActionRefused, match="not a signal name"):
            signal_number(bad)


# --------------------------------------------------------------------------- backend logic


def fake_pyslurm(
    jobs: Callable[[], Any] = lambda: {},
    kill: Callable[[int, int, int], int] | None = None,
) -> tuple[ModuleType, list[tuple[Any, ...]]]:
    """A stand-in pyslurm module with pyslurm 22.5's calling conventions; records calls."""
    calls: list[tuple[Any, ...]] = []
    module = ModuleType("pyslurm")
    job = ModuleType("job")
    job.get = jobs  # type: ignore[attr-defined]
    job.find_id = lambda job_id: (calls.append(("find_id", job_id)), jobs())[1]  # type: ignore[attr-defined]
    module.job = lambda: job  # type: ignore[attr-defined]
    module.node = lambda: ModuleType("node")  # type: ignore[attr-defined]

    def slurm_kill_job(job_id: int, number: int, flags: int) -> int:
        calls.append(("kill", job_id, number, flags))
        return kill(job_id, number, flags) if kill else 0

    module.slurm_kill_job = slurm_kill_job  # type: ignore[attr-defined]
    module.KILL_JOB_BATCH = 4  # type: ignore[attr-defined]
    module.ESLURM_INVALID_JOB_ID = 2017  # type: ignore[attr-defined]
    module.ESLURM_ALREADY_DONE = 2021  # type: ignore[attr-defined]
    api = ModuleType("api")
    api.slurm_fini = lambda: calls.append(("fini",))  # type: ignore[attr-defined]
    api.slurm_init = lambda conf: calls.append(("init", conf))  # type: ignore[attr-defined]
    module.api = api  # type: ignore[attr-defined]
    return module, calls


@pytest.fixture
def conf(tmp_path: Path) -> str:
    """A slurm.conf path that exists (the stand-in pyslurm never reads it)."""
    path = tmp_path / "slurm.conf"
    path.write_text("ClusterName=stand-in\n")
    return str(path)


def raises(*args: Any) -> Callable[..., Any]:
    def call(*_: Any) -> Any:
        raise ValueError(*args)

    return call


def test_an_undecodable_state_description_falls_back_to_the_cli_for_that_read(conf: str) -> None:
    def undecodable() -> Any:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    module, _ = fake_pyslurm(jobs=undecodable)
    runner = ScriptedRunner({"squeue --json": read("squeue.json")}, slurm_conf=conf)
    backend = PyslurmBackend(module, runner=runner)
    with capture_logs() as logs:
        jobs = backend.read_jobs()
    assert jobs == parse_json.squeue(read("squeue.json"))
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "slurm.pyslurm_undecodable"
    ]
    assert (backend.rpc_calls, runner.calls) == (1, 1)


def test_a_partition_with_deny_qos_is_read_through_the_cli(conf: str) -> None:
    """pyslurm 22.5 drops a DenyQos (tests/test_partition_access.py): such a read is
    scontrol's, with one warning however many reads; without a DenyQos it stays pyslurm's."""
    access = MOMENT.parent.parent / "access"
    lost = json.loads((access / "pyslurm-partitions-22.05.json").read_text(encoding="utf-8"))
    text = (access / "scontrol-o-show-partition-22.05.txt").read_text(encoding="utf-8")
    module, _ = fake_pyslurm()
    partition = ModuleType("partition")
    partition.get = lambda: lost  # type: ignore[attr-defined]
    module.partition = lambda: partition  # type: ignore[attr-defined]
    runner = ScriptedRunner({"scontrol -o": text}, slurm_conf=conf)
    backend = PyslurmBackend(module, runner=runner)
    with capture_logs() as logs:
        assert backend.read_partitions() == backend.read_partitions()
    assert backend.read_partitions() == parse_text.parse_scontrol_partitions(text)
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["event"], e["partitions"]) for e in warned] == [
        ("slurm.pyslurm_deny_qos_lost", ["open"])
    ]
    assert (backend.rpc_calls, runner.calls) == (3, 3)
    del lost["open"]
    views = {p.name: p for p in backend.read_partitions()}
    cli = {p.name: p for p in parse_text.parse_scontrol_partitions(text)}
    assert views == {name: cli[name] for name in ("batch", "private", "shared")}
    assert (backend.rpc_calls, runner.calls) == (4, 3)


def test_rpc_errors_are_typed_by_libslurms_message(conf: str) -> None:
    module, _ = fake_pyslurm(
        jobs=raises("Unable to contact slurm controller (connect failure)", 1800)
    )
    backend = PyslurmBackend(module, slurm_conf=conf)
    with pytest.raises(SlurmUnreachable, match=r"^pyslurm slurm_load_jobs: Slurm unreachable"):
        backend.read_jobs()
    module, _ = fake_pyslurm(jobs=raises("Invalid job id specified", 2017))
    assert PyslurmBackend(module, slurm_conf=conf).read_job(7) is None
    module, _ = fake_pyslurm(jobs=raises("Access/permission denied", 2002))
    with pytest.raises(SlurmRejected) as info:
        PyslurmBackend(module, slurm_conf=conf).read_jobs()
    assert info.value.slurm_message == "Access/permission denied"


def test_signal_flags_and_no_retry(conf: str) -> None:
    module, calls = fake_pyslurm()
    backend = PyslurmBackend(module, slurm_conf=conf)
    backend.signal(5, "USR1", batch_only=True)
    backend.signal(5, "SIGUSR1", batch_only=False)
    assert [c for c in calls if c[0] == "kill"] == [
        ("kill", 5, int(signal.SIGUSR1), 4),
        ("kill", 5, int(signal.SIGUSR1), 0),
    ]
    module, calls = fake_pyslurm(kill=raises("Unable to contact slurm controller", 1800))
    backend = PyslurmBackend(module, slurm_conf=conf, retry_wait_s=0.0)
    with pytest.raises(SlurmUnreachable):
        backend.signal(5, "USR1", batch_only=True)
    assert len([c for c in calls if c[0] == "kill"]) == 1  # a retry could signal twice
    assert backend.rpc_action_calls == 1


def test_cancel_is_silent_for_ended_or_unknown_jobs_and_retried_when_unreachable(conf: str) -> None:
    for errno in (2017, 2021):
        module, calls = fake_pyslurm(kill=raises("gone", errno))
        PyslurmBackend(module, slurm_conf=conf).cancel(9)
        assert ("kill", 9, int(signal.SIGKILL), 0) in calls
    module, calls = fake_pyslurm(kill=raises("Unable to contact slurm controller", 1800))
    backend = PyslurmBackend(module, slurm_conf=conf, retry_wait_s=0.0)
    with pytest.raises(SlurmUnreachable):
        backend.cancel(9)
    assert backend.rpc_action_calls == 3  # action_attempts=3: idempotent, so retried


def test_a_refusal_libslurm_calls_temporary_is_busy_and_retried(conf: str) -> None:
    """Issue 44: libslurm's "try again" answers (its error table, as the CLI prints them)
    are ``SlurmBusy`` through pyslurm too, and an idempotent call is retried on them."""
    message = "Job update not available right now, the DB index is being set, try again in a bit"
    module, _ = fake_pyslurm(kill=raises(message))  # no errno: the message decides
    backend = PyslurmBackend(module, slurm_conf=conf, retry_wait_s=0.0)
    with pytest.raises(SlurmBusy) as info:
        backend.cancel(9)
    assert info.value.slurm_message == message
    assert backend.rpc_action_calls == 3


def test_dry_run_sends_nothing_and_records_the_cli_commands(conf: str) -> None:
    module, calls = fake_pyslurm()
    backend = PyslurmBackend(module, slurm_conf=conf, dry_run=True)
    backend.signal(3, "USR1", batch_only=True)
    backend.cancel(3)
    assert calls == [] and backend.rpc_calls == 0
    assert backend.runner.dry_run_log == [
        ("scancel", "--signal=USR1", "--batch", "3"),
        ("scancel", "3"),
    ]


def test_each_backend_talks_to_its_own_cluster(tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "slurm.conf").write_text(f"ClusterName={name}\n")
    module, calls = fake_pyslurm(jobs=lambda: {})
    one = PyslurmBackend(module, slurm_conf=f"{tmp_path}/one/slurm.conf")
    two = PyslurmBackend(module, slurm_conf=f"{tmp_path}/two/slurm.conf")
    one.read_jobs()
    one.read_jobs()  # still on its conf: no re-initialisation
    two.read_jobs()
    one.read_jobs()
    assert [c for c in calls if c[0] in {"init", "fini"}] == [
        ("fini",),
        ("init", f"{tmp_path}/one/slurm.conf"),
        ("fini",),
        ("init", f"{tmp_path}/two/slurm.conf"),
        ("fini",),
        ("init", f"{tmp_path}/one/slurm.conf"),
    ]


@pytest.fixture(autouse=True)
def _forget_libslurm_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as if libslurm's conf were unknown (the stand-in has no state)."""
    monkeypatch.setattr(pyslurm_backend, "_libslurm_conf", None)


def test_job_fields_are_all_the_mapping_reads() -> None:
    # If job_view read a field outside JOB_FIELDS, a view reused because JOB_FIELDS were
    # unchanged could be stale; restricting the records to JOB_FIELDS must change nothing.
    for raw in records("pyslurm-jobs.json").values():
        only = {name: raw[name] for name in pyslurm_backend.JOB_FIELDS}
        assert job_view(only) == job_view(raw)


def test_a_job_view_is_reused_only_while_its_fields_are_unchanged(conf: str) -> None:
    jobs = records("pyslurm-jobs.json")
    state = {"jobs": jobs}
    module, _ = fake_pyslurm(jobs=lambda: state["jobs"])
    backend = PyslurmBackend(module, slurm_conf=conf)
    first = {v.job_id: v for v in backend.read_jobs()}
    again = {v.job_id: v for v in backend.read_jobs()}
    assert all(again[k] is first[k] for k in first)  # reused, not rebuilt
    changed = dict(jobs, **{"1017": dict(jobs["1017"], comment="elastic:min=1,max=2")})
    del changed["1011"]
    state["jobs"] = changed
    third = {v.job_id: v for v in backend.read_jobs()}
    assert third[1017].comment == "elastic:min=1,max=2" and 1011 not in third
    assert third[1012] is first[1012]
    assert list(third.values()) == [job_view(r) for r in changed.values()]


def test_the_collector_is_paused_during_a_job_read_and_restored_after(conf: str) -> None:
    seen: list[bool] = []

    def jobs() -> Any:
        seen.append(gc.isenabled())
        raise ValueError("Unable to contact slurm controller (connect failure)", 1800)

    module, _ = fake_pyslurm(jobs=jobs)
    assert gc.isenabled()
    with pytest.raises(SlurmUnreachable):
        PyslurmBackend(module, slurm_conf=conf).read_jobs()
    assert seen == [False] and gc.isenabled()


def test_a_backend_needs_a_slurm_conf(tmp_path: Path) -> None:
    module, calls = fake_pyslurm()
    with pytest.raises(ConfigError, match=r"pyslurm backend: no slurm.conf at .*/none\.conf"):
        PyslurmBackend(module, slurm_conf=str(tmp_path / "none.conf"))
    assert calls == []  # libslurm was not re-initialised on a missing file


def test_a_job_under_the_step_manager_is_told_from_its_flags() -> None:
    """Issue 20: pyslurm hands a job's flags over as one integer (``bitflags``); slurm.h's
    STEPMGR_ENABLED is bit 41 in 24.11 and 26.05 (unused in 22.05, whose captures have it
    clear)."""
    raw = dict(records("pyslurm-jobs.json")["1017"])
    assert job_view(raw).stepmgr is False
    raw["bitflags"] = int(raw.get("bitflags") or 0) | 1 << 41
    assert job_view(raw).stepmgr is True
