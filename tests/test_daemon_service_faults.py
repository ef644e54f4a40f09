"""Faults of the state directory and the journal: one line naming the file, exit 5.

Real faults, no mocks: a read-only and a full file system (small tmpfs mounts, root only),
a file that is not a database, a state_dir that cannot be made.  Start-up faults go through
the ``daemon`` command; a disk that fills while the daemon runs goes through the loop with
a recording backend (the journal is written in the cycle, before any Slurm call).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.actuate.journal import JOURNAL_FILE
from slurm_elastic.config import Config
from slurm_elastic.daemon.commands import _journal_copy, daemon
from slurm_elastic.daemon.exitcodes import ExitCode
from slurm_elastic.daemon.service import Notifier, Service
from slurm_elastic.errors import StateError
from tests.fakes import RecordingBackend
from tests.slurm_cluster import wait_until
from tests.test_daemon_controller_data import pending, snapshot
from tests.test_daemon_service_process import MAIN
from tests.test_journal import GROW, fill, spoil_a_row

REPO = Path(__file__).resolve().parent.parent


def _config_file(tmp_path: Path, state_dir: Path) -> Path:
    path = tmp_path / "slurm-elastic.yaml"
    # backend cli: the faults come before any Slurm call, with or without a cluster.
    path.write_text(f"state_dir: {state_dir}\napi: {{port: 0}}\nslurm: {{backend: cli}}\n")
    return path


def _daemon_once(config_file: Path) -> tuple[int, str]:
    """Exit status and what the command said, less its JSON log lines."""
    result = CliRunner().invoke(daemon, ["--config", str(config_file), "--once"])
    said = [line for line in result.output.splitlines() if not line.startswith("{")]
    return result.exit_code, "\n".join(said)


def test_read_only_state_dir_stops_the_start(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    state = tmpfs(read_only=True)
    code, output = _daemon_once(_config_file(tmp_path, state))
    assert code == ExitCode.STATE
    assert output == f"Error: {state}: cannot write in the state directory: Read-only file system"


def test_corrupt_journal_stops_the_start_in_one_line(tmp_path: Path) -> None:
    """As the admin sees it: the real command's stderr has the one error line, no traceback."""
    state = tmp_path / "state"
    state.mkdir()
    (state / JOURNAL_FILE).write_bytes(b"SQLite format 3\0" + os.urandom(4000))
    done = subprocess.run(
        [sys.executable, "-c", MAIN, "daemon", "--once"],
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SLURM_ELASTIC_CONFIG": str(_config_file(tmp_path, state)),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == ExitCode.STATE
    errors = [line for line in done.stderr.splitlines() if not line.startswith("{")]  # logs
    assert errors == [
        f"Error: {state / JOURNAL_FILE}: corrupt journal (file is not a database); the daemon"
        " will not act on it: move it aside to start with an empty one (docs/security.md,"
        " Honest failure)"
    ]
    assert "Traceback" not in done.stderr + done.stdout


def test_state_dir_in_place_of_a_file_stops_the_start(tmp_path: Path) -> None:
    blocker = tmp_path / "journal-is-a-dir"
    (blocker / JOURNAL_FILE).mkdir(parents=True)
    code, output = _daemon_once(_config_file(tmp_path, blocker))
    assert code == ExitCode.STATE
    assert output == f"Error: {blocker / JOURNAL_FILE}: unable to open database file"


def test_a_disk_that_fills_while_running_stops_the_loop(
    tmp_path: Path, tmpfs: Callable[..., Path]
) -> None:
    """The cycle must write the job's spec and its pin intent before pinning: with the disk
    full it cannot, so nothing is sent to Slurm and the loop ends with the journal's line."""
    state = tmpfs()
    config = Config.model_validate(
        {"mode": "enforce", "state_dir": str(state), "api": {"port": 0}, "interval_s": 0.05}
    )
    backend = RecordingBackend(snapshot([pending(7)]), fresh=True)
    service = Service(config, backend=backend, notifier=Notifier(""), serve_api=False)  # type: ignore[arg-type]
    fill(state)
    with pytest.raises(StateError) as info:
        service.run(once=True)
    assert str(info.value) == f"{state / JOURNAL_FILE}: database or disk is full"
    assert backend.actions() == []  # nothing done that was not written down first


@pytest.mark.parametrize(
    ("damage", "warning"),
    [("not a database", "cannot copy"), ("a row it never wrote", "cannot use")],
)
def test_plan_on_a_corrupt_journal_says_so_and_plans_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, warning: str
) -> None:
    """``plan`` is a dry run: a journal it cannot copy (or whose copy fails the check) is
    named in one warning, and the plan is made with no cooldowns."""
    source = tmp_path / JOURNAL_FILE
    if damage == "not a database":
        source.write_bytes(os.urandom(5000))
    else:
        spoil_a_row(source)
    before = source.read_bytes()
    with _journal_copy(tmp_path) as journal:
        assert journal.all_actions() == ()
        journal.record_intent(GROW, 1.0)  # private: the daemon's file is never written
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"warning: {warning} {source} (") and "\n" not in said
    assert said.endswith("; using an empty journal")
    assert source.read_bytes() == before


@pytest.mark.slurm
def test_the_real_daemon_stops_in_one_line_when_its_disk_fills(
    clean_queue, two_users, tmp_path: Path, tmpfs: Callable[..., Path]
) -> None:
    """``slurm-elastic daemon`` in enforce mode cycles on a small state file system; the disk
    fills, then se-alice submits an elastic job: the journal cannot take its spec, so the
    daemon stops with one line naming the journal, exit 5 (it used to fail every cycle,
    with a traceback that did not name the file, and never say so)."""
    alice, _ = two_users
    state = tmpfs()
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"mode: enforce\nstate_dir: {state}\napi: {{port: 0}}\ninterval_s: 0.5")
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "daemon", "--config", str(config_file)],
        env={**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: (state / "status.json").exists(), 30, "a first cycle")
        fill(state)
        alice.sbatch("-N1-2", "--comment=elastic", "--wrap", "sleep 300", cwd=alice.home)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    said = [line for line in proc.stderr.read().splitlines() if not line.startswith("{")]
    assert (code, said) == (
        ExitCode.STATE,
        [f"Error: {state / JOURNAL_FILE}: database or disk is full"],
    )
