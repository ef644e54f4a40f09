"""SlurmRunner (timeouts, typed errors, counters, dry-run, SLURM_CONF) and backend selection.

No cluster needed: the runner is exercised with real processes; Slurm's own
messages come from outputs captured on the local cluster (the live tests check
the same paths against real Slurm).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from slurm_elastic.errors import (
    ConfigError,
    SlurmBusy,
    SlurmRejected,
    SlurmTimeout,
    SlurmUnreachable,
)
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.runner import SlurmRunner, slurm_message
from slurm_elastic.slurm.select import (
    choose,
    make_backend,
    pyslurm_dir,
    slurm_release,
    versions_match,
)
from tests.fakes import ScriptedRunner


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


# --------------------------------------------------------------------------- runner


def test_missing_binary_is_unreachable() -> None:
    runner = SlurmRunner()
    with pytest.raises(SlurmUnreachable, match="not found"):
        runner.read(("squeue-that-does-not-exist", "--json"))
    assert runner.calls == 1


def test_timeout_is_typed_and_bounded() -> None:
    runner = SlurmRunner(timeout_s=0.3)
    with pytest.raises(SlurmTimeout, match=r"did not finish within 0.3s"):
        runner.read(("sleep", "5"))


@pytest.mark.parametrize(
    ("stderr", "kind", "message"),
    [
        # real stderr lines captured from 22.05 on the local cluster
        (
            "slurm_load_partitions error: Unable to contact slurm controller (connect failure)",
            SlurmUnreachable,
            "slurm_load_partitions error: Unable to contact slurm controller (connect failure)",
        ),
        (
            "scontrol: error: Could not load state information for job 1: Unable to contact "
            "slurm controller (connect failure)",
            SlurmUnreachable,
            "Could not load state information for job 1: Unable to contact slurm controller "
            "(connect failure)",
        ),
        (
            "sacct: error: Problem talking to the database: Connection refused",
            SlurmUnreachable,
            "Problem talking to the database: Connection refused",
        ),
        (
            "Invalid job id specified for job 999999",
            SlurmRejected,
            "Invalid job id specified for job 999999",
        ),
        (
            "Job is pending execution for job 53",
            SlurmRejected,
            "Job is pending execution for job 53",
        ),
    ],
)
def test_failures_are_classified_with_slurms_message(
    stderr: str, kind: type[Exception], message: str
) -> None:
    runner = SlurmRunner()
    with pytest.raises(kind) as info:
        runner.act(sh(f"echo '{stderr}' >&2; exit 1"))
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    if isinstance(info.value, SlurmRejected):
        assert info.value.slurm_message == message
    assert slurm_message(f"noise\n{stderr}\n\n") == message


# Slurm's temporary refusals, as its commands print them: libslurm's error table
# (src/common/slurm_errno.c, the same text on 22.05, 24.11 and 26.05) behind scontrol's
# "... for job N" or sbatch's "Batch job submission failed: ...".  The first is the one
# recorded on 22.05 right after a slurmctld restart (issue 44).
TEMPORARY = [
    "Job update not available right now, the DB index is being set, try again in a bit "
    "for job 5087",
    "slurm_update error: Job can not be altered now, try again later",
    "sbatch: error: Batch job submission failed: Unable to create job record, try again",
    "scontrol: error: Rate limit exceeded, please retry momentarily",
    "slurm_update error: Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
    "sbatch: error: Batch job submission failed: Unable to connect to database",
    "slurm_update error: Database connection reference is invalid",
    "PrologSlurmctld is still running for job 12",
    "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
    "sbatch: error: Batch job submission failed: Switch resources currently not available",
    "Job locked by another sibling for job 12",
    "sbatch: error: Batch job submission failed: System submissions disabled",
]
# Final answers, some that mention trying or waiting without asking to be asked again.
FINAL = [
    "Requested operation not supported on this system for job 8",
    "Requested node configuration is not available",
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job "
    "submit limit, user's size and/or time limits)",
    "Reservation given is not skipable, try deleting instead",
    "Job is no longer pending execution for job 7",
    "Access/permission denied for job 7",
]


@pytest.mark.parametrize("stderr", TEMPORARY)
def test_a_refusal_slurm_calls_temporary_is_busy_not_rejected(stderr: str) -> None:
    """Issue 44: these answers say "not now", never "cannot": ``SlurmBusy`` (retried with
    backoff), which no ``except SlurmRejected`` takes for a fact about the job."""
    runner = SlurmRunner()
    with pytest.raises(SlurmBusy) as info:
        runner.act(sh(f'echo "{stderr}" >&2; exit 1'))
    assert not isinstance(info.value, SlurmRejected)
    assert info.value.slurm_message == slurm_message(stderr)
    assert "Slurm asked to try again" in str(info.value)


@pytest.mark.parametrize("stderr", FINAL)
def test_a_final_refusal_stays_rejected(stderr: str) -> None:
    runner = SlurmRunner()
    with pytest.raises(SlurmRejected) as info:
        runner.act(sh(f'echo "{stderr}" >&2; exit 1'))
    assert info.value.slurm_message == slurm_message(stderr)


def test_the_backend_retries_an_idempotent_action_slurm_calls_temporary(tmp_path: Path) -> None:
    """Within the call first (a few short waits), as for an unreachable Slurm; what still
    answers "not now" leaves as ``SlurmBusy`` for the executor's backoff."""
    state = tmp_path / "count"
    state.write_text("0")
    # Answers "try again" twice, then accepts: a real process, counted in a file.
    script = (
        f'n=$(cat {state}); echo $((n+1)) > {state}; [ "$n" -ge 2 ] && exit 0; '
        f'echo "{TEMPORARY[0]}" >&2; exit 1'
    )
    backend = CliBackend(runner=SlurmRunner(), retry_wait_s=0.0)
    backend._idempotent(lambda: backend.runner.act(sh(script)))
    assert state.read_text().strip() == "3"
    state.write_text("-5")  # now five "not now": more than action_attempts
    with pytest.raises(SlurmBusy):
        backend._idempotent(lambda: backend.runner.act(sh(script)))
    assert state.read_text().strip() == "-2"  # three attempts


def test_slurm_conf_is_passed_through_and_calls_counted() -> None:
    runner = SlurmRunner(slurm_conf="/etc/slurm-cluster/i9/slurm.conf")
    assert runner.read(sh('echo "$SLURM_CONF"')).stdout.strip() == (
        "/etc/slurm-cluster/i9/slurm.conf"
    )
    runner.act(("true",))
    assert (runner.calls, runner.read_calls, runner.action_calls) == (2, 1, 1)


def test_a_label_names_the_command_in_errors() -> None:
    """squeue --json -a -t all would read as "squeue --json -a" (its first three words)."""
    down = sh("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1")
    with pytest.raises(SlurmUnreachable, match=r"^squeue --json: Slurm unreachable: slurm_load"):
        SlurmRunner().read(down, label="squeue --json")
    with pytest.raises(SlurmUnreachable, match=r"^sh -c echo .*: Slurm unreachable"):
        SlurmRunner().read(down)


def test_undecodable_bytes_in_output_are_replaced_not_fatal() -> None:
    # A job comment with a Latin-1 byte: squeue prints it as is.
    result = SlurmRunner().read(sh(r"printf 'caf\351 ok'"))
    assert result.stdout == "caf\ufffd ok"


def test_dry_run_records_actions_but_still_reads() -> None:
    runner = SlurmRunner(dry_run=True)
    with capture_logs() as logs:
        result = runner.act(("false", "would-fail"))
    assert result.dry_run and result.returncode == 0
    assert runner.dry_run_log == [("false", "would-fail")]
    assert runner.action_calls == 0 and runner.calls == 0
    assert logs[0]["event"] == "slurm.dry_run" and logs[0]["command"] == "false would-fail"
    assert runner.read(sh("echo read")).stdout == "read\n"  # reads are never skipped


# --------------------------------------------------------------------------- selection


@pytest.mark.parametrize(
    ("pyslurm", "slurm", "expected"),
    [
        ("22.5.1", "22.05.8", True),
        ("22.5.0", "22.05.11", True),
        ("25.11.2", "22.05.8", False),
        ("23.2.0", "23.02.7", True),
        ("unknown", "22.05.8", False),
    ],
)
def test_versions_match(pyslurm: str, slurm: str, expected: bool) -> None:
    assert versions_match(pyslurm, slurm) is expected


def test_choose_is_a_pure_decision() -> None:
    assert choose("cli", pyslurm_version="22.5.1", slurm_version="22.05.8") == (
        "cli",
        "configured",
    )
    assert choose("auto", pyslurm_version="22.5.1", slurm_version="22.05.8")[0] == "pyslurm"
    kind, reason = choose("auto", pyslurm_version="25.11.2", slurm_version="22.05.8")
    assert (kind, reason) == ("cli", "pyslurm 25.11.2 does not match Slurm 22.05.8")
    assert choose("auto", pyslurm_version=None, slurm_version=None)[1].startswith(
        "pyslurm is not installed"
    )
    with pytest.raises(ConfigError, match=r"'pyslurm' is unusable: pyslurm 25\.11\.2 does not"):
        choose("pyslurm", pyslurm_version="25.11.2", slurm_version="22.05.8")
    with pytest.raises(ConfigError, match="must be one of auto, cli, pyslurm"):
        choose("rest", pyslurm_version=None, slurm_version=None)


@pytest.fixture
def no_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process where nothing provides pyslurm (the live tests may have imported one)."""
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "slurm-elastic/pyslurm" not in p])
    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("a pyslurm is importable from site-packages or PYTHONPATH")


def version_runner(slurm_conf: str | None = None) -> ScriptedRunner:
    """Answers ``scontrol --version`` only, and counts the calls."""
    return ScriptedRunner({"scontrol --version": "slurm 22.05.8\n"}, slurm_conf=slurm_conf)


def fake_build(base: Path, release: str) -> Path:
    package = base / release / "pyslurm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return base / release


def test_pyslurm_build_directory_for_the_running_release(tmp_path: Path) -> None:
    assert slurm_release("22.05.8") == "22.05" and slurm_release("24.11.5") == "24.11"
    assert slurm_release("unknown") is None
    build = fake_build(tmp_path, "22.05")
    (tmp_path / "24.11").mkdir()  # a directory without a build in it
    assert pyslurm_dir("22.05.8", tmp_path) == build
    assert pyslurm_dir("24.11.5", tmp_path) is None
    assert pyslurm_dir("23.02.1", tmp_path / "missing") is None


def test_auto_without_pyslurm_is_cli_with_one_log_line_and_no_slurm_call(
    no_pyslurm: None, tmp_path: Path
) -> None:
    with capture_logs() as logs:
        backend = make_backend("auto", slurm_conf="/nonexistent/slurm.conf", pyslurm_path=tmp_path)
    assert isinstance(backend, CliBackend) and isinstance(backend, SlurmBackend)
    assert backend.runner.calls == 0  # pyslurm's absence costs no Slurm call
    assert "pyslurm" not in sys.modules
    selected = [e for e in logs if e["event"] == "slurm.backend_selected"]
    assert len(selected) == 1
    assert selected[0]["backend"] == "cli"
    assert selected[0]["reason"] == "pyslurm is not installed or does not import"


def test_auto_with_builds_for_other_releases_only_costs_one_version_call(
    no_pyslurm: None, tmp_path: Path
) -> None:
    fake_build(tmp_path, "24.11")
    runner = version_runner()
    with capture_logs() as logs:
        backend = make_backend("auto", runner=runner, pyslurm_path=tmp_path)
    assert type(backend) is CliBackend and runner.calls == 1
    assert "pyslurm" not in sys.modules and str(tmp_path / "24.11") not in sys.path
    (selected,) = [e for e in logs if e["event"] == "slurm.backend_selected"]
    assert selected["reason"] == (
        "pyslurm is not installed or does not import (no build for Slurm 22.05.8)"
    )


def test_explicit_pyslurm_without_it_is_a_config_error(no_pyslurm: None, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pyslurm is not installed"):
        make_backend("pyslurm", slurm_conf="/nonexistent/slurm.conf", pyslurm_path=tmp_path)


def test_cli_options_reach_the_backend() -> None:
    backend = make_backend("cli", dry_run=True, timeout_s=7, history_format="json")
    assert isinstance(backend, CliBackend)
    assert backend.runner.dry_run and backend.runner.timeout_s == 7
    assert backend.history_format == "json"
    with pytest.raises(ValueError, match="history_format"):
        CliBackend(history_format="xml")


# --------------------------------------------------------------------------- shrink planning


def test_shrink_always_keeps_the_batch_host() -> None:
    from slurm_elastic.slurm.cli import _keep_nodes
    from slurm_elastic.types import JobState, JobView

    def running(nodes: tuple[str, ...], batch_host: str) -> JobView:
        return JobView(
            job_id=1, name="x", user="u", user_id=1, account="a", partition="p", qos="q",
            state=JobState.RUNNING, state_reason="None", node_count=len(nodes),
            min_nodes=len(nodes), max_nodes=None, nodes=nodes, batch_host=batch_host,
            comment="",
        )  # fmt: skip

    nodes = ("n1", "n2", "n3", "n4")
    assert _keep_nodes(running(nodes, "n1"), 2) == ("n1", "n2")  # NumNodes=2 is enough
    assert _keep_nodes(running(nodes, "n3"), 2) == ("n3", "n1")  # NodeList= keeps n3
    assert _keep_nodes(running(nodes, "n4"), 1) == ("n4",)


def test_auto_never_imports_pyslurm_without_a_slurm_conf(
    no_pyslurm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pyslurm's import runs libslurm's slurm_init: without a slurm.conf it retries for 60 s
    # and then exits the process, so a build for this release must not even be imported.
    fake_build(tmp_path, "22.05")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    runner = version_runner(slurm_conf=str(tmp_path / "no" / "slurm.conf"))
    with capture_logs() as logs:
        backend = make_backend("auto", runner=runner, pyslurm_path=tmp_path)
    assert type(backend) is CliBackend and "pyslurm" not in sys.modules
    assert str(tmp_path / "22.05") not in sys.path
    (selected,) = [e for e in logs if e["event"] == "slurm.backend_selected"]
    assert selected["reason"] == f"no slurm.conf at {tmp_path}/no/slurm.conf for libslurm"
    with pytest.raises(ConfigError, match=r"unusable: no slurm\.conf at "):
        make_backend("pyslurm", runner=runner, pyslurm_path=tmp_path)
