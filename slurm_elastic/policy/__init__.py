"""Allocation policies: choose a size for every elastic job.

``allocate(problem, policy="mip") -> Plan`` is the one entry point (pure, deterministic).
Policies: ``mip`` (default; exact MIP with HiGHS under a hard time limit), ``greedy``
(Optimus' marginal gain, faithful), ``dp`` (exact multiple-choice knapsack for one
capacity row), ``static`` (no resizing: the baseline).  Semantics shared by all of them
(capacity with shared nodes, FIFO reservations, candidates, value) are documented in
``capacity`` and ``compiled``.
"""

from slurm_elastic.policy.decide import POLICIES, allocate
from slurm_elastic.policy.options import PolicyOptions

__all__ = ["POLICIES", "PolicyOptions", "allocate"]
