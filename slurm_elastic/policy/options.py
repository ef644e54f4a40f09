"""Knobs of the allocation policies, in one place with their defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Tuning that is not part of the problem itself (the daemon maps its config onto this).

    ``change_penalty`` is a tie-break, not a cost model: every size change loses this
    fraction of a horizon in the objective, so that among equally good plans the one that
    changes least wins (and the plan does not flap between equal optima).
    """

    mip_rel_gap: float = 1e-3  # HiGHS stops when within this relative gap of the bound
    # Admission floor: pending jobs whose minimum fits in FIFO order, with running jobs at
    # their minimum, must start (``mip`` docstring says why).
    fair_floor: bool = True
    change_penalty: float = 1e-6
    max_component_classes: int = 12  # partition classes sharing nodes, enumerated exactly
    isolate: bool = True  # run the MIP in a child process that is killed at the time limit
