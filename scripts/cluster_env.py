"""The environment of one local test cluster, as ``scripts/cluster.sh env`` prints it.

``cluster.sh env --slurm V --instance K`` prints ``export NAME=value`` lines (SLURM_CONF, PATH
with that version's client wrappers first, SLURM_ELASTIC_SLURM); a shell ``eval``s them, and
the tests, benchmarks and the demo read them here instead of each parsing the text.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"
VERSIONS = ("22.05", "24.11", "26.05")
DEFAULT_VERSION = "22.05"


def parse_exports(text: str) -> dict[str, str]:
    """``export A=1`` lines (shell-quoted values) -> {"A": "1"}; other lines are an error."""
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


def cluster_env(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """The exports for ``version`` (default: ``$SLURM_ELASTIC_SLURM``, else 22.05)."""
    version = version or os.environ.get("SLURM_ELASTIC_SLURM") or DEFAULT_VERSION
    out = subprocess.run(
        ["bash", str(CLUSTER_SH), "env", "--slurm", version, "--instance", str(instance)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return parse_exports(out)


def use_cluster(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """Apply the exports to this process (its Slurm commands and children then talk to it)."""
    exports = cluster_env(version, instance)
    os.environ.update(exports)
    return exports
