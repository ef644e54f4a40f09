"""scripts/install-deps.sh is idempotent: a second run on an installed machine does nothing;
scripts/build-pyslurm.sh checks its archive and skips a build that is there."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import in_ci

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-deps.sh"
BUILD_PYSLURM = SCRIPT.parent / "build-pyslurm.sh"
VENDOR = SCRIPT.parent.parent.parent / "shared" / "vendor"
REPO_URL = f"file://{SCRIPT.parent.parent}"


def installed_from() -> str | None:
    """Where the editable install of slurm-elastic points (None: not installed so)."""
    try:
        text = importlib.metadata.distribution("slurm-elastic").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    return json.loads(text or "{}").get("url")


def test_second_run_is_a_quick_no_op() -> None:
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI must run as root (install-deps.sh installs Debian packages)")
        pytest.skip("install-deps.sh needs root")
    if not in_ci() and installed_from() != REPO_URL:
        # Run from another checkout (a worktree), the script would re-point the machine's
        # editable install at this one, under everyone else's feet.
        pytest.skip(f"slurm-elastic is installed from {installed_from()}, not this tree")
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
    *lines, pyslurm = second.stdout.splitlines()
    assert lines == [
        "install-deps: Debian packages present",
        "install-deps: torch==2.13.0 present",
        "install-deps: slurm-elastic (editable, test+agent+plot extras) present",
    ]
    assert pyslurm.startswith("build-pyslurm: /var/lib/slurm-elastic/pyslurm/22.05 already holds")
    assert pyslurm.endswith("; skipped")
    assert elapsed < 15


def as_root() -> None:
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI must run as root (build-pyslurm.sh writes /var/lib and /var/log)")
        pytest.skip("build-pyslurm.sh needs root")


def build_pyslurm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(BUILD_PYSLURM), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_build_pyslurm_refuses_an_archive_that_does_not_match_its_checksum(
    tmp_path: Path,
) -> None:
    as_root()
    (tmp_path / "pyslurm-22.5.x.tar.gz").write_bytes(b"not the archive")
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  pyslurm-22.5.x.tar.gz\n")
    done = build_pyslurm("--slurm", "22.05", "--vendor", str(tmp_path), "--prefix", str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("build-pyslurm: ") and "does not match SHA256SUMS" in line
    assert not (tmp_path / "22.05").exists()
    for bad, says in (("2205", "like 22.05"), ("99.99", "no pyslurm-99.99.x.tar.gz")):
        done = build_pyslurm("--slurm", bad, "--vendor", str(tmp_path), "--prefix", str(tmp_path))
        assert done.returncode == 1 and says in done.stderr and len(done.stderr.splitlines()) == 1


def test_build_pyslurm_skips_a_build_of_this_archive_for_this_python(tmp_path: Path) -> None:
    as_root()
    if not (VENDOR / "SHA256SUMS").is_file():
        pytest.skip(f"no vendored archives in {VENDOR}")
    archive = "pyslurm-22.5.x.tar.gz"
    sums = dict(reversed(line.split()) for line in (VENDOR / "SHA256SUMS").read_text().splitlines())
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = tmp_path / "22.05"
    (target / "pyslurm").mkdir(parents=True)
    stamp = f"slurm=22.05 archive={archive} sha256={sums[archive]} ext={suffix}"
    (target / "BUILD-INFO").write_text(stamp + "\npyslurm=22.5.3 built=earlier\n")
    done = build_pyslurm("--slurm", "22.05", "--prefix", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"build-pyslurm: {target} already holds pyslurm 22.5 for Slurm 22.05 ({suffix}); skipped\n"
    )
