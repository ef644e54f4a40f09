"""scripts/install-deps.sh is idempotent: a second run on an installed machine does nothing
(each step says it found its part present);
scripts/build-pyslurm.sh checks its archive and skips a build that is there."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.slurm_cluster import in_ci

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-deps.sh"
BUILD_PYSLURM = SCRIPT.parent / "build-pyslurm.sh"
VENDOR = SCRIPT.parent.parent.parent / "shared" / "vendor"


def installed_from() -> Path | None:
    """The checkout this interpreter's slurm-elastic is installed (editable) from, if any:
    what a fresh interpreter imports, with neither this directory nor PYTHONPATH on its path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-P", "-c", "import slurm_elastic; print(slurm_elastic.__file__)"],
        capture_output=True, text=True, timeout=60, env=env, cwd="/",
    )  # fmt: skip
    return Path(found.stdout.strip()).resolve().parent.parent if found.returncode == 0 else None


def test_second_run_is_a_noop() -> None:
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI must run as root (install-deps.sh installs Debian packages)")
        pytest.skip("install-deps.sh needs root")
    here, installed = SCRIPT.parent.parent.resolve(), installed_from()
    if not in_ci() and installed not in (None, here):
        # install-deps.sh installs the package editable from the checkout it runs in: run
        # from a second worktree it would move everyone's `slurm-elastic` to that worktree.
        pytest.skip(f"slurm-elastic is installed from {installed}, not this checkout ({here})")
    env = {**os.environ, "PYTHON": sys.executable}
    first = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900, env=env
    )
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env
    )
    assert second.returncode == 0, second.stdout + second.stderr
    *lines, pyslurm = second.stdout.splitlines()
    assert lines == [
        "install-deps: Debian packages present",
        "install-deps: torch==2.13.0 present",
        "install-deps: slurm-elastic (editable, test+agent+torchft+plot extras) present",
    ]
    assert pyslurm.startswith("build-pyslurm: /var/lib/slurm-elastic/pyslurm/22.05 already holds")
    assert pyslurm.endswith("; skipped")


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
