"""scripts/cluster/pidfiles.sh, the functions cluster.sh judges its daemons by, run in bash.

CI once failed a whole leg with "slurmctld (instance 0) exited during start-up" while that
slurmctld came up and ran: the wait took a pid file that did not belong to the new daemon
(left behind, or caught empty between Slurm's O_TRUNC open and its write) for the daemon dying.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

PIDFILES_SH = Path(__file__).resolve().parent.parent / "scripts" / "cluster" / "pidfiles.sh"


def bash(script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'set -euo pipefail; source "{PIDFILES_SH}"; {script}'],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A live process named like a daemon (slurmctld), whose pid file is written after it starts."""
    fake = tmp_path / "slurmctld"
    fake.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(fake), "60"])
    time.sleep(0.1)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    ("content", "gone"),
    [
        ("", False),  # Slurm has opened the file (O_TRUNC) and not yet written its pid
        ("not-a-pid\n", False),
        ("{exited}\n", True),
        ("{live}\n", False),
    ],
)
def test_pid_gone_only_for_a_written_pid_whose_process_exited(
    tmp_path: Path, daemon: subprocess.Popen[bytes], content: str, gone: bool
) -> None:
    pidfile = tmp_path / "slurmctld.pid"
    pidfile.write_text(content.format(exited=exited_pid(), live=daemon.pid))
    assert (bash(f'pid_gone "{pidfile}"').returncode == 0) is gone


def test_pid_gone_without_a_file(tmp_path: Path) -> None:
    assert bash(f'pid_gone "{tmp_path / "slurmctld.pid"}"').returncode != 0


def wait_daemon(pidfile: Path, seconds: int, command: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = bash(
        f'rc=0; wait_daemon "{pidfile}" {seconds} {command} || rc=$?; echo "$rc $DAEMON_DIED"'
    )
    rc, died = proc.stdout.split()
    return int(rc), died, time.monotonic() - t0


def test_wait_daemon_does_not_call_a_daemon_mid_write_dead(tmp_path: Path) -> None:
    """An empty pid file is waited on to the timeout, not reported as a death."""
    pidfile = tmp_path / "slurmctld.pid"
    pidfile.write_text("")
    rc, died, elapsed = wait_daemon(pidfile, 2, "false")
    assert (rc, died) == (1, "0")
    assert elapsed >= 1  # bash's SECONDS counts whole seconds: 2 is more than 1


def test_wait_daemon_gives_up_at_once_on_a_dead_daemon(tmp_path: Path) -> None:
    pidfile = tmp_path / "slurmctld.pid"
    pidfile.write_text(f"{exited_pid()}\n")
    rc, died, elapsed = wait_daemon(pidfile, 20, "false")
    assert (rc, died) == (1, "1")
    assert elapsed < 10


def test_wait_daemon_returns_when_the_daemon_answers(
    tmp_path: Path, daemon: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "slurmctld.pid"
    pidfile.write_text(f"{daemon.pid}\n")
    assert wait_daemon(pidfile, 5, "true")[:2] == (0, "0")


def test_clear_stale_pidfile_removes_only_a_file_not_believed(
    tmp_path: Path, daemon: subprocess.Popen[bytes]
) -> None:
    stale = tmp_path / "slurmd-n1.pid"
    stale.write_text(f"{exited_pid()}\n")
    live = tmp_path / "slurmctld.pid"
    live.write_text(f"{daemon.pid}\n")
    proc = bash(f'clear_stale_pidfile "{stale}"; clear_stale_pidfile "{live}"')
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert live.read_text() == f"{daemon.pid}\n"
    assert daemon.poll() is None
