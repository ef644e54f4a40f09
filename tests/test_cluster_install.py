"""scripts/install-deps.sh is idempotent: a second run on an installed machine does nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import in_ci

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-deps.sh"


def test_second_run_is_a_quick_no_op() -> None:
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI must run as root (install-deps.sh installs Debian packages)")
        pytest.skip("install-deps.sh needs root")
    env = {**os.environ, "PYTHON": sys.executable}
    first = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900, env=env
    )
    assert first.returncode == 0, first.stdout + first.stderr
    t0 = time.monotonic()
    second = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env
    )
    elapsed = time.monotonic() - t0
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.splitlines() == [
        "install-deps: Debian packages present",
        "install-deps: torch==2.13.0 present",
        "install-deps: slurm-elastic (editable, test+agent extras) present",
    ]
    assert elapsed < 15
