"""Shared pytest configuration.

Tests that need the real local Slurm cluster carry ``@pytest.mark.slurm`` and
use the ``slurm_cluster`` fixture (tests/slurm_cluster.py), which brings the
cluster up with scripts/cluster.sh when it is not already running.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

pytest_plugins = ["tests.slurm_cluster"]

# Importing slurm_elastic.agent.elastic fills in torchrun's variables in os.environ, so that a
# script written for torchrun also runs under plain python (single_process_defaults).  In the
# test process that import happens at collection, and the variables would then pass to every
# subprocess and sbatch job the tests start: a one-process reference run once inherited a
# MASTER_PORT that the drill's API had taken since, and failed with EADDRINUSE.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")  # fmt: skip
_OUTER_ENV = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: real traces and Slurm samples (read-only)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    return SHARED


@pytest.fixture
def utc() -> Iterator[None]:
    """Slurm's text timestamps are local time; every fixture was captured with TZ=UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture(autouse=True)
def _no_inherited_torchrun_variables() -> None:
    """Each test starts with torchrun's variables as pytest was started (see above)."""
    for name, value in _OUTER_ENV.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """Entry points (daemon, simulate) configure structlog globally; undo it after each test
    so that ``structlog.testing.capture_logs`` sees every event in the tests that follow."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``tmpfs(size="1m", read_only=False)``: a real small (or read-only) file system, for
    full-disk and read-only state directories.  Needs root (mount); unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str = "1m", *, read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        # Lazily if a test left a file open: the mount must not outlive the test.
        if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], check=True)
