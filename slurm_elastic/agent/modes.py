"""The launcher's two modes and the names they share with the workers.  torch-free.

* ``torchrun`` (the default): torch elastic runs the workers; every resize restarts them
  from a checkpoint (``agent.boundary``).
* ``torchft``: stop-free; each node is a torchft replica group and the groups that stay
  keep their processes (``agent.replicas``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastic.errors import AgentError
from slurm_elastic.protocol import Fallback

TORCHRUN = "torchrun"
TORCHFT = "torchft"
MODES = (TORCHRUN, TORCHFT)

MODE_ENV = "SLURM_ELASTIC_MODE"  # set by the node agent for the workers
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
REPLICA_ENV = "SLURM_ELASTIC_REPLICA"  # a replica group's name: its node
ADVERTISE_ENV = "SLURM_ELASTIC_NODE_ADDR"  # where peers reach a group (Slurm's NodeAddr)
TIMEOUT_ENV = "SLURM_ELASTIC_FT_TIMEOUT_S"  # collectives and commits: what a loss costs
# Which lighthouse of the job the groups meet in (0, 1, ...: the launcher starts a new one
# when one dies, and its quorum ids start again at 1).
LIGHTHOUSE_EPOCH_ENV = "SLURM_ELASTIC_LIGHTHOUSE_EPOCH"
LEAVE_ACTION = "leave"  # control.json: the groups on nodes outside keep_nodes leave
# control.json: the same request once its answers are in (or its wait is over): a group
# that forms after it stays, wherever it runs (agent.boundary.leave_open).
LEAVE_CLOSED_ACTION = "leave_closed"
# Why a job launched in the torchft mode runs in the restart mode (launch.json's
# ``fallback``, and the workers' reports): torchft kill requests from outside the job ended
# too many of its groups (``agent.launcher``, ``OutsideKills``).
FALLBACK_OUTSIDE_KILLS = Fallback.OUTSIDE_KILLS.value
FALLBACK_ENV = "SLURM_ELASTIC_FALLBACK"
LEFT_EXIT = 0  # a group that left on request: its step is done, nothing failed
DEFAULT_FT_TIMEOUT_S = 5.0  # what an unannounced loss costs the survivors, at most


def left_name(node: str) -> str:
    """``left-<node>.json``: the group on ``node`` left the quorum (its first rank writes
    it, with the request's ``seq`` and the last step it took part in)."""
    return f"left-{node}.json"


def stop_free(env: Mapping[str, str] | None = None) -> bool:
    """Whether the workers run in the torchft mode."""
    return (env if env is not None else os.environ).get(MODE_ENV) == TORCHFT


# --------------------------------------------------------------------------- torchft timeouts

# torchft's own overrides: ``torchft.manager.Manager`` reads them (``int(value)`` seconds) and
# they win over the values the library passes, so they are checked with the rest.
TORCHFT_TIMEOUT_ENV = "TORCHFT_TIMEOUT_SEC"
TORCHFT_QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"
TORCHFT_CONNECT_TIMEOUT_ENV = "TORCHFT_CONNECT_TIMEOUT_SEC"
HEARTBEAT_S = 0.75  # the lighthouse drops a group that stopped its heartbeats (every 0.1 s)
JOIN_WINDOW_S = 1.5  # the lighthouse waits this long for a live but late group
QUORUM_FLOOR_S = 60.0  # torchft's own default: room for a loaded machine's slow steps


@dataclass(frozen=True, slots=True)
class FtTimeouts:
    """Every torchft timeout of the torchft mode, derived from one setting
    (``--ft-timeout``: the collectives' timeout, what an unannounced loss costs the
    survivors) by :meth:`derive`, and checked as a hierarchy, each level for a reason:

    1. ``heartbeat_s < join_window_s``: a group that left is dropped before the lighthouse
       stops waiting for late groups, so a shrink pauses the others for about the heartbeat
       timeout, not the window (the lighthouse's own settings, ``agent.lighthouse``);
    2. ``heartbeat_s < collective_s``: when the survivors' collectives give up on a lost
       group, the lighthouse has already dropped it, so the next quorum forms at once
       instead of timing out on it too;
    3. ``2 * collective_s + join_window_s <= quorum_s``: the quorum that follows a loss may
       wait out the join window and then heal a newcomer (a transfer bounded by the
       collectives' timeout) after the redone step's own wait; a shorter quorum timeout
       ends a healthy group in the middle of a recovery (torchft#329: recovery took 948 s
       with the levels set the other way round);
    4. ``connect_s <= quorum_s``: a group that cannot reach the lighthouse or its manager
       fails within the quorum timeout, so the launcher's fallback starts, never later.

    torchft's environment overrides (``TORCHFT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_TIMEOUT_SEC``,
    ``TORCHFT_CONNECT_TIMEOUT_SEC``) replace the levels they name (the levels above follow
    them) and are checked the same way: a job whose levels break the hierarchy is refused
    with one line before anything starts.
    """

    collective_s: float = DEFAULT_FT_TIMEOUT_S
    quorum_s: float = QUORUM_FLOOR_S
    connect_s: float = QUORUM_FLOOR_S
    heartbeat_s: float = HEARTBEAT_S
    join_window_s: float = JOIN_WINDOW_S

    @classmethod
    def derive(cls, ft_timeout_s: float, env: Mapping[str, str] | None = None) -> FtTimeouts:
        """The levels for ``--ft-timeout`` and torchft's overrides in ``env`` (None: this
        process's environment); an ``AgentError`` naming the broken level otherwise."""
        environ = os.environ if env is None else env
        if not 0 < ft_timeout_s <= 3600:
            raise AgentError(f"--ft-timeout must be in (0, 3600] seconds, got {ft_timeout_s:g}")
        # Each level follows the one below it, overridden or not.
        collective = _override(environ, TORCHFT_TIMEOUT_ENV, ft_timeout_s)
        quorum = _override(
            environ,
            TORCHFT_QUORUM_TIMEOUT_ENV,
            max(QUORUM_FLOOR_S, 2 * collective + JOIN_WINDOW_S),
        )
        connect = _override(environ, TORCHFT_CONNECT_TIMEOUT_ENV, quorum)
        timeouts = cls(collective_s=collective, quorum_s=quorum, connect_s=connect)
        timeouts.check()
        return timeouts

    def check(self) -> None:
        """Raises ``AgentError``, one line, at the first level out of order (class doc)."""
        broken = "breaks torchft's timeout hierarchy (slurm-elastic run --help, --ft-timeout)"
        if not self.heartbeat_s < self.join_window_s:
            raise AgentError(
                f"heartbeat timeout {self.heartbeat_s:g} s >= join window "
                f"{self.join_window_s:g} s {broken}"
            )
        if not self.heartbeat_s < self.collective_s:
            raise AgentError(
                f"collective timeout {self.collective_s:g} s {broken}: it must be longer than "
                f"the lighthouse's heartbeat timeout ({self.heartbeat_s:g} s)"
            )
        needed = 2 * self.collective_s + self.join_window_s
        if not needed <= self.quorum_s:
            raise AgentError(
                f"quorum timeout {self.quorum_s:g} s {broken}: a recovery needs "
                f"{needed:g} s (twice the collective timeout {self.collective_s:g} s "
                f"+ the join window {self.join_window_s:g} s)"
            )
        if not self.connect_s <= self.quorum_s:
            raise AgentError(
                f"connect timeout {self.connect_s:g} s {broken}: it must not exceed the "
                f"quorum timeout ({self.quorum_s:g} s)"
            )


def _override(env: Mapping[str, str], name: str, derived: float) -> float:
    text = env.get(name)
    if text is None or text == "":
        return derived
    # torchft reads it with int(): anything else would crash every worker at start.
    if not text.strip().isdigit() or int(text) == 0:
        raise AgentError(f"${name} must be a positive whole number of seconds, got {text!r}")
    return float(int(text))
