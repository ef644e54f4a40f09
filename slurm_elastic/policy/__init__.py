"""Allocation policies: choose a size for every elastic job.

``allocate(problem, policy="mip") -> Plan`` is the one entry point (pure, deterministic).
The policies, by name, are in ``registry`` (``POLICIES``): ``mip`` (default; exact MIP
with HiGHS under a hard time limit), ``greedy`` (Optimus' marginal gain, faithful),
``dp`` (exact multiple-choice knapsack for one capacity row), ``static`` (no resizing: the
baseline).  Semantics shared by all of them (capacity with shared nodes, FIFO
reservations, candidates, value) are documented in ``capacity`` and ``compiled``.

``allocate`` is imported on first use, so that ``config`` can read
the registry's names without loading numpy and HiGHS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurm_elastic.policy.options import PolicyOptions
from slurm_elastic.policy.registry import POLICIES

if TYPE_CHECKING:
    from slurm_elastic.policy.decide import allocate

__all__ = ["POLICIES", "PolicyOptions", "allocate"]


def __getattr__(name: str) -> Any:
    if name == "allocate":
        from slurm_elastic.policy.decide import allocate

        return allocate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
