"""The signal contract's node side (``agent.stopping``), with real processes, no torch.

A stand-in for torchrun starts two workers; the watcher, given the agent's pid, signals
them on the follower's ``signal`` request, waits at most the grace, and says what it did.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.agent.jobdir import Control, read_json, write_json
from slurm_elastic.agent.stopping import StopWatcher, children, running_for_s, signal_number

# Two workers: one with no handler (SIGUSR1 ends it), one that saves for 0.3 s and exits,
# or (IGNORE) one that ignores the signal and must be killed after the grace.
AGENT = """
import subprocess, sys, time
plain = "import time; time.sleep(60)"
saver = (
    "import signal, sys, time\\n"
    "def on(*_):\\n    time.sleep(0.3); sys.exit(0)\\n"
    "signal.signal(signal.SIGUSR1, on if sys.argv[1] == 'save' else signal.SIG_IGN)\\n"
    "time.sleep(60)\\n"
)
procs = [subprocess.Popen([sys.executable, "-c", plain]),
         subprocess.Popen([sys.executable, "-c", saver, sys.argv[1]])]
print("ready", flush=True)
for p in procs:
    p.wait()
time.sleep(60)
"""


@pytest.fixture
def agent(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, request.param], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the workers' handlers installed
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("agent", ["save"], indirect=True)
def test_workers_are_signalled_and_end_within_the_grace(
    agent: subprocess.Popen[str], tmp_path: Path
) -> None:
    watcher = StopWatcher(tmp_path, "n2", signal.SIGUSR1, grace_s=10.0, agent_pid=agent.pid)
    assert not watcher.poll_once()  # nothing asked
    write_json(tmp_path / "control.json", Control(4, "signal", instruction_id="i").to_json())
    assert watcher.poll_once()
    record = read_json(tmp_path / "stopped-n2.json")
    assert record is not None and record["seq"] == 4 and record["workers"] == 2
    assert record["ended_by_themselves"] and record["waited_s"] < 5
    assert record["signal"] == "SIGUSR1" and record["trained_since_start_s"] >= 0.5
    assert children(agent.pid) == [] or all(running_for_s(p) is None for p in children(agent.pid))
    assert not watcher.poll_once()  # the same request is carried out once


@pytest.mark.parametrize("agent", ["ignore"], indirect=True)
def test_workers_that_ignore_the_signal_are_killed_after_the_grace(
    agent: subprocess.Popen[str], tmp_path: Path
) -> None:
    watcher = StopWatcher(tmp_path, "n1", signal.SIGUSR1, grace_s=1.0, agent_pid=agent.pid)
    write_json(tmp_path / "control.json", Control(1, "signal").to_json())
    started = time.monotonic()
    assert watcher.poll_once()
    record = read_json(tmp_path / "stopped-n1.json")
    assert record is not None and not record["ended_by_themselves"]
    assert 1.0 <= time.monotonic() - started < 5


def test_a_request_from_before_the_agent_started_is_not_carried_out(tmp_path: Path) -> None:
    write_json(tmp_path / "control.json", Control(3, "signal").to_json())
    watcher = StopWatcher(tmp_path, "n1", signal.SIGUSR1, grace_s=1.0, agent_pid=1 << 22)
    assert not watcher.poll_once()


def test_signal_names() -> None:
    assert signal_number("USR1") == signal_number("SIGUSR1") == signal.SIGUSR1
    assert signal_number("15") == signal.SIGTERM
    with pytest.raises(ValueError, match="not a signal name"):
        signal_number("USR9")


@pytest.mark.parametrize("agent", ["save"], indirect=True)
def test_a_companion_named_in_release_json_stops_its_agent(
    agent: subprocess.Popen[str], tmp_path: Path
) -> None:
    """The companion given back by a shrink: its node's watcher sends torchrun (here the
    stand-in) SIGTERM, once; the wrapper then exits 0 (``released``).  Another job's
    watcher, or a release from before it started, does nothing."""
    write_json(tmp_path / "release.json", {"instruction_id": "old", "jobs": [77]})
    companion = StopWatcher(tmp_path, "n3", signal.SIGUSR1, 1.0, agent_pid=agent.pid, job_id=77)
    parent = StopWatcher(tmp_path, "n1", signal.SIGUSR1, 1.0, agent_pid=1 << 22, job_id=76)
    assert not companion.poll_once() and not companion.released  # from before it started
    write_json(tmp_path / "release.json", {"instruction_id": "i-2", "jobs": [77]})
    assert not parent.poll_once() and not parent.released  # not its job
    assert companion.poll_once() and companion.released
    assert agent.wait(timeout=5) == -signal.SIGTERM
    assert not companion.poll_once()  # carried out once


@pytest.mark.parametrize("agent", ["save"], indirect=True)
def test_a_node_the_stop_removes_ends_its_agent_once_the_workers_are_gone(
    agent: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Under the signal contract a node outside the shrink's keep_nodes stops torchrun (here
    the stand-in) right after its workers, so that it never joins a new rendezvous round;
    its stopped file is written first.  A node that stays keeps its agent."""
    kept = StopWatcher(tmp_path, "n1", signal.SIGUSR1, 5.0, agent_pid=1 << 22)
    leaving = StopWatcher(tmp_path, "n2", signal.SIGUSR1, 5.0, agent_pid=agent.pid)
    stop = Control(2, "signal", instruction_id="i", keep_nodes=("n1",))
    write_json(tmp_path / "control.json", stop.to_json())
    assert kept.poll_once() and not kept.left
    assert leaving.poll_once() and leaving.left
    assert agent.wait(timeout=5) == -signal.SIGTERM
    record = read_json(tmp_path / "stopped-n2.json")
    assert record is not None and record["seq"] == 2 and record["ended_by_themselves"]


@pytest.mark.parametrize("agent", ["save"], indirect=True)
def test_a_stop_that_names_no_nodes_to_keep_leaves_every_agent_running(
    agent: subprocess.Popen[str], tmp_path: Path
) -> None:
    watcher = StopWatcher(tmp_path, "n2", signal.SIGUSR1, 5.0, agent_pid=agent.pid)
    write_json(tmp_path / "control.json", Control(1, "signal").to_json())
    assert watcher.poll_once() and not watcher.left
    time.sleep(0.3)
    assert agent.poll() is None
