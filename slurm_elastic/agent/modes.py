"""The launcher's two modes and the names they share with the workers.  torch-free.

* ``torchrun`` (the default): torch elastic runs the workers; every resize restarts them
  from a checkpoint (``agent.boundary``).
* ``torchft``: stop-free; each node is a torchft replica group and the groups that stay
  keep their processes (``agent.replicas``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TORCHRUN = "torchrun"
TORCHFT = "torchft"
MODES = (TORCHRUN, TORCHFT)

MODE_ENV = "SLURM_ELASTIC_MODE"  # set by the node agent for the workers
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
REPLICA_ENV = "SLURM_ELASTIC_REPLICA"  # a replica group's name: its node
ADVERTISE_ENV = "SLURM_ELASTIC_NODE_ADDR"  # where peers reach a group (Slurm's NodeAddr)
TIMEOUT_ENV = "SLURM_ELASTIC_FT_TIMEOUT_S"  # collectives and commits: what a loss costs
LEAVE_ACTION = "leave"  # control.json: the groups on nodes outside keep_nodes leave
LEFT_EXIT = 0  # a group that left on request: its step is done, nothing failed
DEFAULT_FT_TIMEOUT_S = 5.0  # what an unannounced loss costs the survivors, at most


def left_name(node: str) -> str:
    """``left-<node>.json``: the group on ``node`` left the quorum (its first rank writes
    it, with the request's ``seq`` and the last step it took part in)."""
    return f"left-{node}.json"


def stop_free(env: Mapping[str, str] | None = None) -> bool:
    """Whether the workers run in the torchft mode."""
    return (env if env is not None else os.environ).get(MODE_ENV) == TORCHFT
