"""The environment of one local test cluster, as ``scripts/cluster.sh env`` prints it.

``cluster.sh env --slurm V --instance K`` prints ``export NAME=value`` lines (SLURM_CONF, PATH
with that version's client wrappers first, SLURM_ELASTIC_SLURM); a shell ``eval``s them, and
the tests and benchmarks read them here (the demo's harness holds the parser).
"""

from __future__ import annotations

import os

from slurm_elastic.demo.harness import SLURM_VERSIONS, cluster_exports, parse_exports

VERSIONS = SLURM_VERSIONS
# The tests' and benchmarks' default: the host's own packages (the demo's is 24.11).
DEFAULT_VERSION = "22.05"

__all__ = ["DEFAULT_VERSION", "VERSIONS", "cluster_env", "parse_exports", "use_cluster"]


def cluster_env(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """The exports for ``version`` (default: ``$SLURM_ELASTIC_SLURM``, else 22.05)."""
    version = version or os.environ.get("SLURM_ELASTIC_SLURM") or DEFAULT_VERSION
    return cluster_exports(version, instance)


def use_cluster(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """Apply the exports to this process (its Slurm commands and children then talk to it)."""
    exports = cluster_env(version, instance)
    os.environ.update(exports)
    return exports
