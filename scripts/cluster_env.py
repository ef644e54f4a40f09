"""The environment of one local test cluster, as ``scripts/cluster.sh env`` prints it, and
what the live benchmarks share (their cluster arguments, a shadow-mode controller).

``cluster.sh env --slurm V --instance K`` prints ``export NAME=value`` lines (SLURM_CONF, PATH
with that version's client wrappers first, SLURM_ELASTIC_SLURM); a shell ``eval``s them, and
the tests and benchmarks read them here (the demo's harness holds the parser).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from slurm_elastic.demo.harness import SLURM_VERSIONS, cluster_exports, parse_exports

if TYPE_CHECKING:
    from slurm_elastic.daemon.controller import Allocate, Controller

VERSIONS = SLURM_VERSIONS
# The tests' and benchmarks' default: the host's own packages (the demo's is 24.11).
DEFAULT_VERSION = "22.05"

__all__ = [
    "DEFAULT_VERSION",
    "VERSIONS",
    "add_cluster_arguments",
    "cluster_env",
    "parse_exports",
    "shadow_controller",
    "use_cluster",
]


def cluster_env(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """The exports for ``version`` (default: ``$SLURM_ELASTIC_SLURM``, else 22.05)."""
    version = version or os.environ.get("SLURM_ELASTIC_SLURM") or DEFAULT_VERSION
    return cluster_exports(version, instance)


def use_cluster(version: str | None = None, instance: int = 0) -> dict[str, str]:
    """Apply the exports to this process (its Slurm commands and children then talk to it)."""
    exports = cluster_env(version, instance)
    os.environ.update(exports)
    return exports


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--instance`` and ``--slurm`` (defaults: the tests' environment)."""
    parser.add_argument(
        "--instance", type=int, default=int(os.environ.get("SLURM_ELASTIC_TEST_INSTANCE", "0"))
    )
    parser.add_argument(
        "--slurm",
        choices=VERSIONS,
        default=os.environ.get("SLURM_ELASTIC_SLURM", DEFAULT_VERSION),
        help="which local cluster version (scripts/cluster.sh --slurm)",
    )


def shadow_controller(
    state_dir: str, allocate: Allocate | None = None, backend: str = "cli"
) -> Controller:
    """A shadow-mode controller on the cluster this process uses (a journal in memory):
    every step of a cycle but applying.  ``allocate``: the policy (default the configured
    one); ``backend``: cli, or pyslurm as the daemon loads it (``slurm.backend``)."""
    from slurm_elastic.actuate.instructions import InstructionBoard
    from slurm_elastic.actuate.journal import Journal
    from slurm_elastic.config import Config
    from slurm_elastic.daemon.controller import Controller
    from slurm_elastic.daemon.reports import ReportStore
    from slurm_elastic.slurm.select import make_backend

    return Controller(
        make_backend(backend),
        Config.model_validate({"mode": "shadow", "state_dir": state_dir}),
        reports=ReportStore(),
        journal=Journal(),
        agents=InstructionBoard(),
        allocate=allocate,
    )
