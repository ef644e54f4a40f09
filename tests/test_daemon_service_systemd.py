"""The shipped systemd unit: ``systemd-analyze verify`` clean, notify type, watchdog, hardening."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "slurm-elastic.service"
INSTALLED = "/usr/local/bin/slurm-elastic"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser


def test_unit_shape() -> None:
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert int(service["WatchdogSec"]) >= 60
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["ExecStart"].endswith("slurm-elastic daemon")
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectKernelTunables", "RestrictSUIDSGID"):
        assert service[option] == "yes", option
    assert service["ProtectSystem"] == "strict"
    # The state dir is the only writable place; munge (AF_UNIX) and slurmctld (TCP) reachable.
    assert service["ReadWritePaths"] == "/var/lib/slurm-elastic"
    assert {"AF_UNIX", "AF_INET"} <= set(service["RestrictAddressFamilies"].split())
    assert {"CAP_SETUID", "CAP_SETGID"} <= set(service["CapabilityBoundingSet"].split())


def test_watchdog_leaves_room_for_slow_cycles() -> None:
    from slurm_elastic.config import Config

    config = Config()
    watchdog = int(_unit()["Service"]["WatchdogSec"])
    # A cycle: 3 Slurm reads + one sacct, each bounded by slurm.timeout_s, after interval_s.
    assert watchdog > config.interval_s + 4 * config.slurm.timeout_s


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze missing: install Debian's `systemd` package")
        pytest.skip("systemd-analyze is not installed (Debian package `systemd`)")
    unit = tmp_path / UNIT.name
    text = UNIT.read_text()
    if not Path(INSTALLED).exists():
        # verify checks that ExecStart exists: point it at this checkout's entry point.
        entry = shutil.which("slurm-elastic")
        assert entry is not None, "slurm-elastic is not installed (pip install -e .)"
        text = text.replace(INSTALLED, entry)
    unit.write_text(text)
    proc = subprocess.run(
        [tool, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slurm-elastic.service" not in proc.stderr, proc.stderr  # no warnings about it
