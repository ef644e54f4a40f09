"""Helpers shared by the tests that run ``slurm-elastic daemon`` as a real subprocess.

(No tests here: named for the area so that its tests own it.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAIN = "from slurm_elastic.cli import main; main()"


def write_config(path: Path, state: Path, *, interval_s: float = 0.5, extra: str = "") -> Path:
    """A config for a test daemon: its own state dir, a free API port, a fast loop."""
    path.write_text(f"state_dir: {state}\ninterval_s: {interval_s}\napi: {{port: 0}}\n{extra}")
    return path


@contextmanager
def daemon_process(
    config_file: Path, log_path: Path, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``slurm-elastic daemon --config F``, JSON logs in ``log_path``; exits 0 on SIGTERM."""
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", MAIN, "daemon", "--config", str(config_file)],
            env={**os.environ, "NOTIFY_SOCKET": "", **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"daemon ignored SIGTERM:\n{log_path.read_text()[-3000:]}"
            ) from None
        assert code == 0, log_path.read_text()[-3000:]


def read_events(path: Path) -> list[dict]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def wait_event(path: Path, name: str, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in read_events(path):
            if event.get("event") == name:
                return event
        time.sleep(0.05)
    raise AssertionError(f"no {name} event in {path}:\n{path.read_text()[-2000:]}")


def wait_api(
    log_path: Path, status_path: Path, job: int | None = None, timeout_s: float = 30
) -> str:
    """The API URL once a cycle is published (and has seen ``job``, so its owner is known)."""
    url = wait_event(log_path, "api.listening", timeout_s)["url"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if status_path.exists():
            jobs = json.loads(status_path.read_text()).get("jobs", [])
            if job is None or any(j["job_id"] == job for j in jobs):
                return url
        time.sleep(0.1)
    raise AssertionError(f"daemon published no cycle:\n{log_path.read_text()[-2000:]}")
