"""Demo set-up: the local cluster, the daemon's config file, the daemon process.

Nothing here decides anything: it runs ``scripts/cluster.sh`` (the local cluster), writes
a config the daemon validates itself, and starts and stops ``slurm-elastic daemon`` as a
subprocess exactly as an operator would (``systemd`` aside).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from slurm_elastic.config import Config, load_config
from slurm_elastic.demo.workload import DemoJob, batch_script
from slurm_elastic.errors import ConfigError, SlurmBusy, SlurmUnreachable
from slurm_elastic.slurm.runner import slurm_error, slurm_message

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "scripts" / "cluster.sh"
EXAMPLE = REPO / "examples" / "train_mlp.py"
NODES = 4
# The Slurm versions scripts/cluster.sh runs; the demo's default is Debian stable's.
SLURM_VERSIONS = ("22.05", "24.11", "26.05")
DEFAULT_SLURM = "24.11"
# How long a submission answered "try again" or "unreachable" is repeated, and how often.
SUBMIT_RETRY_S = 60.0
SUBMIT_RETRY_GAP_S = 2.0


def parse_exports(text: str) -> dict[str, str]:
    """``cluster.sh env`` output (``export A=1`` lines, shell-quoted) -> {"A": "1"}."""
    exports: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if not words:
            continue
        if len(words) != 2 or words[0] != "export" or "=" not in words[1]:
            raise ValueError(f"cluster.sh env: not an export line: {line!r}")
        name, _, value = words[1].partition("=")
        exports[name] = value
    return exports


def cluster_exports(slurm: str, instance: int) -> dict[str, str]:
    """What ``cluster.sh env`` exports for that cluster (SLURM_CONF, PATH, ...)."""
    out = subprocess.run(
        ["bash", str(CLUSTER_SH), "env", "--slurm", slurm, "--instance", str(instance)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return parse_exports(out)


def require_clone() -> None:
    """The demo runs the repository's example and cluster script: it needs a clone."""
    for path in (CLUSTER_SH, EXAMPLE):
        if not path.is_file():
            raise ConfigError(f"{path} not found: run the demo from a clone of the repository")
    if shutil.which("slurm-elastic") is None:
        raise ConfigError("slurm-elastic is not on PATH: install the package first (make setup)")


def cluster_up(slurm: str, instance: int) -> str:
    """Bring instance ``instance`` of Slurm ``slurm`` up with 4 nodes (a quick check when it
    is up; the first `up` of 24.11/26.05 builds its root, ~1 min); apply its exports to this
    process and its children; return cluster.sh's summary line."""
    which = ["--slurm", slurm, "--instance", str(instance)]
    argv = ["bash", str(CLUSTER_SH), "up", "--nodes", str(NODES), *which]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SlurmUnreachable(f"cluster.sh up {' '.join(which)} failed: {tail[0]}")
    os.environ.update(cluster_exports(slurm, instance))
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else f"instance {instance} up"


def free_port() -> int:
    """A free loopback port for the daemon's API (other daemons may hold the default)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(
    out: Path, port: int, *, quick: bool, overrides: dict[str, Any] | None = None
) -> tuple[Path, Config]:
    """The demo's daemon config: enforce, a 3 s loop, short guards so resizes happen within
    minutes; validated by the daemon's own loader before the daemon sees it.  ``overrides``
    replaces top-level keys, and keys inside a section where its value is a mapping (the
    chaos run's faster loop)."""
    doc: dict[str, Any] = {
        "mode": "enforce",
        "interval_s": 3,
        "state_dir": str(out / "state"),
        # History only of this run: earlier demo runs must not become priors.
        "slurm": {"sacct_interval_s": 120, "sacct_lookback_s": 0},
        "policy": {"name": "mip"},
        "guards": {
            "cooldown_s": 15 if quick else 20,
            "min_dwell_s": 15 if quick else 25,
            "max_resizes_per_cycle": 2,
            "payback_horizon_s": 300,
            "ack_timeout_s": 30,
            "time_limit_margin_s": 0,
            "stale_snapshot_s": 30,
        },
        "model": {"default_resize_cost_s": 15},
        "api": {"bind": "127.0.0.1", "port": port},
        "log": {"level": "info", "json": True},
    }
    for key, value in (overrides or {}).items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    path = out / "daemon.yaml"
    path.write_text(
        "# slurm-elastic demo daemon config (written by python -m slurm_elastic.demo)\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )
    return path, load_config(path)


def submit_job(job: DemoJob, work: Path, *, api: str, submit_dir: Path, mode: str) -> int:
    """``sbatch`` of the job's batch script from ``work`` (its output lands there), with
    the daemon's API in the environment as a user's shell would have it; returns the id.

    Submitted from ``submit_dir``, where the daemon runs too: whether the launcher keeps
    launch.json under the job's WorkDir (--chdir) or its $SLURM_SUBMIT_DIR, a companion
    job (submitted by the daemon) finds its parent's in the same place."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "job.sbatch"
    script.write_text(
        batch_script(job, python=sys.executable, example=EXAMPLE, work_dir=work, mode=mode)
    )
    # A controller restarting (26.05 restarts slurmctld at every `scontrol reconfigure`,
    # which the demo runs) or busy answers "try again": so do we, for a while, but only
    # where sbatch cannot have submitted anything (slurm.cli never repeats a submit: a
    # timed-out one may have been taken).  A refusal of the job itself is final.
    for attempt in Retrying(
        retry=retry_if_exception(_not_submitted),
        stop=stop_after_delay(SUBMIT_RETRY_S),
        wait=wait_fixed(SUBMIT_RETRY_GAP_S),
        reraise=True,
    ):
        with attempt:
            done = subprocess.run(
                ["sbatch", "--parsable", f"--chdir={work}", str(script)],
                cwd=submit_dir,
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "SLURM_ELASTIC_API": api},
                check=False,
            )
            if done.returncode != 0:
                raise slurm_error(f"sbatch {job.name}", slurm_message(done.stderr))
    return int(done.stdout.strip().split(";")[0])


def _not_submitted(error: BaseException) -> bool:
    """Slurm said "try again", or sbatch never reached a controller."""
    return isinstance(error, SlurmBusy) or (
        isinstance(error, SlurmUnreachable) and "unable to contact" in str(error).lower()
    )


class Daemon:
    """``slurm-elastic daemon --config FILE`` as a child process, logging to a file
    (``argv``: another command line that runs the daemon, the chaos run's)."""

    def __init__(
        self, config_path: Path, log_path: Path, cwd: Path, argv: list[str] | None = None
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.cwd = cwd  # companion jobs it submits get this as $SLURM_SUBMIT_DIR
        self.argv = argv or ["slurm-elastic", "daemon", "--config", str(config_path)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = self.argv
        with self.log_path.open("ab") as log:
            # Its own session: the terminal's Ctrl-C reaches the demo, which stops it.
            self.proc = subprocess.Popen(
                argv,
                cwd=self.cwd,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self, status_file: Path, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ConfigError(f"the daemon exited ({self.proc.returncode}): {self.tail()}")
            if status_file.exists():
                return
            time.sleep(0.3)
        raise ConfigError(f"the daemon published no status within {timeout_s:.0f}s: {self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    def kill(self) -> None:
        """SIGKILL, as a crash would end it (the chaos run)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (the daemon finishes its cycle and exits), SIGKILL if it does not."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode
