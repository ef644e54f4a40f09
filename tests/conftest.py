"""Shared pytest configuration.

Tests that need the real local Slurm cluster carry ``@pytest.mark.slurm`` and
use the ``slurm_cluster`` fixture (tests/slurm_cluster.py), which brings the
cluster up with scripts/cluster.sh when it is not already running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

pytest_plugins = ["tests.slurm_cluster"]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: real traces and Slurm samples (read-only)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    return SHARED
