"""The torchft lighthouse beside the parent launcher (the torchft mode, ``agent.replicas``).

It runs as a child process of the launcher on the batch host, which Slurm never takes from
the job, for as long as the launcher runs: torchft's own ``torchft_lighthouse``, the one
installed beside the launcher's Python, so the launcher itself stays torch-free.  Its
settings are this project's choice for elastic jobs, not torchft's defaults (which suit
fault tolerance across long-lived replicas):

* ``min_replicas=1``: a job shrunk to one node still trains;
* ``heartbeat_timeout_ms=750``: a group that left (it stops its heartbeats, every 0.1 s)
  stops counting 0.75 s later.  Until then the others wait for it when they are no more than
  half of the groups (torchft's split-brain rule) or for at most the join timeout: this
  bounds the pause of a shrink;
* ``join_timeout_ms=1500``: how long a quorum waits for a group that is still alive but
  late.  Shorter, a group slowed by a loaded machine misses quorums and the membership
  flaps (measured: at 200 ms on the 2-core test machine under a full test run, a job's
  groups never met three at a time);
* ``quorum_tick_ms=50``.

Both timeouts are levels of the mode's timeout hierarchy (``agent.modes.FtTimeouts``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import structlog

from slurm_elastic.agent.modes import HEARTBEAT_S, JOIN_WINDOW_S
from slurm_elastic.errors import AgentError

log = structlog.get_logger("slurm_elastic.agent")

COMMAND = "torchft_lighthouse"


def lighthouse_command() -> str:
    """``torchft_lighthouse`` of this Python's installation (its scripts directory), else
    the one on ``PATH``; an ``AgentError`` when torchft is not installed."""
    beside = Path(sysconfig.get_path("scripts")) / COMMAND
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(COMMAND)
    if found is None:
        raise AgentError(
            f"the torchft mode needs torchft ({COMMAND} not found): "
            "pip install 'slurm-elastic[torchft]'"
        )
    return found


@dataclass(frozen=True, slots=True)
class LighthouseSettings:
    min_replicas: int = 1
    join_timeout_ms: int = round(JOIN_WINDOW_S * 1000)
    heartbeat_timeout_ms: int = round(HEARTBEAT_S * 1000)
    quorum_tick_ms: int = 50

    def argv(self, host: str, port: int) -> list[str]:
        return [
            f"--bind={host}:{port}",
            f"--min_replicas={self.min_replicas}",
            f"--join_timeout_ms={self.join_timeout_ms}",
            f"--heartbeat_timeout_ms={self.heartbeat_timeout_ms}",
            f"--quorum_tick_ms={self.quorum_tick_ms}",
        ]


class Lighthouse:
    """The lighthouse process: started listening, or an ``AgentError`` saying why not."""

    def __init__(self, host: str, port: int, settings: LighthouseSettings | None = None) -> None:
        self.host = host
        self.port = port
        self.settings = settings or LighthouseSettings()
        self._proc: subprocess.Popen[bytes] | None = None
        self._tail: deque[bytes] = deque(maxlen=5)  # its last lines, for an error message

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")  # it logs every quorum at INFO
        argv = [lighthouse_command(), *self.settings.argv(self.host, self.port)]
        self._proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        assert self._proc.stderr is not None
        copier = threading.Thread(
            target=self._copy, args=(self._proc.stderr,), name="slurm-elastic-lighthouse"
        )
        copier.daemon = True
        copier.start()
        deadline = time.monotonic() + timeout_s
        while not self._listening():
            if self._proc.poll() is not None:
                copier.join(timeout=5)
                lines = [line.decode(errors="replace").strip() for line in self._tail]
                why = next((ln for ln in reversed(lines) if ln), f"exit {self._proc.returncode}")
                raise AgentError(f"the torchft lighthouse did not start: {why}")
            if time.monotonic() > deadline:
                self.stop()
                raise AgentError(f"the torchft lighthouse is not listening on {self.address}")
            time.sleep(0.05)
        log.info("agent.lighthouse", address=self.address, pid=self._proc.pid)

    def alive(self) -> bool:
        """Started and not ended (an ``AgentError`` from ``start`` leaves it not alive)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """How it ended (None: never started, or still running)."""
        return None if self._proc is None else self._proc.poll()

    def _copy(self, stream: IO[bytes]) -> None:
        """Its warnings go to the job's output (and the last lines are kept)."""
        for line in iter(stream.readline, b""):
            self._tail.append(line)
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()

    def _listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
