"""Stop-free mode (``slurm-elastic run --mode torchft``): one torchft replica group per node.

In the torchrun mode every resize restarts every worker.  In this mode each node of the job
(and of each companion job) is one *replica group*, its local ranks inside it, and the
groups meet at every step in a quorum run by torchft's lighthouse (beside the launcher on the
batch host).  Groups join and leave between steps; the processes of the groups that stay
never restart:

* **join**: a new group asks the lighthouse for the next quorum; in it the newcomer is
  healed (weights, optimizer, position in the data) from a peer before its first step;
* **planned leave**: ``control.json`` action ``leave`` names the nodes that stay
  (``keep_nodes``); a group whose node is not among them finishes the step under way, leaves
  the quorum and its processes exit 0 (:data:`LEFT_EXIT`); the rest carry on;
* **unannounced loss** (a killed process, a node gone): the step under way is not committed
  anywhere (``should_commit``), and the survivors redo it at the next quorum, after at most
  the process group's timeout.

Per step (:class:`ReplicaGroup`)::

    begin()   the quorum (synchronous; a newcomer is healed inside it) -> Membership
    reduce()  gradients summed inside the group (torchrun's process group), then across the
              quorum's groups; True when every group commits the step, else it is redone

A step's samples are split over participants x local ranks, so the sum of the gradients is
the gradient of the whole global batch whatever the membership: the update equals that of an
unresized run (``agent.torch``).  torch and torchft are imported only here and in
``agent.torch``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog

from slurm_elastic.errors import AgentError, MissingExtra

try:
    import torch
    import torch.distributed as dist
    from torchft.checkpointing import HTTPTransport
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo
except ModuleNotFoundError:
    raise MissingExtra("the torchft mode", "torchft", "torchft") from None

from slurm_elastic.agent.modes import (
    ADVERTISE_ENV,
    DEFAULT_FT_TIMEOUT_S,
    LIGHTHOUSE_ENV,
    LIGHTHOUSE_EPOCH_ENV,
    REPLICA_ENV,
    TIMEOUT_ENV,
    FtTimeouts,
)

log = structlog.get_logger("slurm_elastic.agent")

# A step's generation (samplelog): the lighthouse (a new one numbers its quorums from 1
# again), then the quorum, then how often it redid a step.
_RETRIES_PER_QUORUM = 1000
_QUORUMS_PER_LIGHTHOUSE = 10**9


@dataclass(frozen=True, slots=True)
class Membership:
    """This step's quorum as one rank sees it."""

    participants: int  # replica groups taking part
    group_rank: int  # this group's place among them
    local_world: int  # ranks inside each group
    local_rank: int
    quorum_id: int
    retries: int  # steps this quorum redid
    lighthouse_epoch: int = 0  # launch.json's: which of the job's lighthouses

    @property
    def generation(self) -> int:
        quorum = self.lighthouse_epoch * _QUORUMS_PER_LIGHTHOUSE + self.quorum_id
        return quorum * _RETRIES_PER_QUORUM + min(self.retries, _RETRIES_PER_QUORUM - 1)

    @property
    def world_size(self) -> int:
        return self.participants * self.local_world

    @property
    def rank(self) -> int:
        """This rank's place among all the step's ranks: the share of the batch it takes."""
        return self.group_rank * self.local_world + self.local_rank


class _WithoutFlightRecorder(logging.Filter):
    """torchft warns at every new quorum that it cannot reset NCCL's flight recorder: a
    debugging aid of NCCL's that gloo and this build do not have.  Nothing is wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Unable to reset NCCL flight recorder" not in str(record.msg)


def quiet_torchft() -> None:
    """Keep what torchft says about normal operation out of the job's output (its errors
    stay): the flight-recorder warning, and torch's warning that the weights a newcomer
    receives arrive in a read-only buffer (they are copied into the model)."""
    logging.getLogger("torchft.manager").addFilter(_WithoutFlightRecorder())
    warnings.filterwarnings(
        "ignore", message="The given buffer is not writable", category=UserWarning
    )


def quiet_transport(timeout: timedelta) -> HTTPTransport:
    """torchft's checkpoint transport (how a newcomer gets the weights from a peer) without
    its HTTP server's access log, one stderr line per newcomer."""
    transport = HTTPTransport(timeout=timeout, num_chunks=0)
    server = getattr(transport, "_server", None)  # torchft 0.2 has no option for it
    handler = getattr(server, "RequestHandlerClass", None)
    if handler is not None:
        handler.log_message = lambda *_args, **_kwargs: None
    return transport


def timeout_from_env(env: dict[str, str] | None = None) -> float:
    text = (env if env is not None else os.environ).get(TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_FT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise AgentError(f"${TIMEOUT_ENV} is not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise AgentError(f"${TIMEOUT_ENV} must be in (0, 3600] seconds, got {value}")
    return value


def epoch_from_env(env: dict[str, str] | None = None) -> int:
    text = (env if env is not None else os.environ).get(LIGHTHOUSE_EPOCH_ENV, "0")
    if not text.isdigit():
        raise AgentError(f"${LIGHTHOUSE_EPOCH_ENV} is not a count: {text!r}")
    return int(text)


class ReplicaGroup:
    """One rank's side of its replica group and the quorum (module doc)."""

    def __init__(
        self,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        *,
        step: int,
        timeout_s: float | None = None,
    ) -> None:
        replica = os.environ.get(REPLICA_ENV, "")
        lighthouse = os.environ.get(LIGHTHOUSE_ENV, "")
        if not replica or not lighthouse:
            raise AgentError(
                f"the torchft mode needs ${REPLICA_ENV} and ${LIGHTHOUSE_ENV}: "
                "run the script with slurm-elastic run --mode torchft"
            )
        # Every level from the one setting, torchft's own overrides included (modes.FtTimeouts).
        levels = FtTimeouts.derive(timeout_s if timeout_s is not None else timeout_from_env())
        timeout = timedelta(seconds=levels.collective_s)
        self.local_rank = dist.get_rank() if dist.is_initialized() else 0
        self.local_world = dist.get_world_size() if dist.is_initialized() else 1
        self.replica = replica
        self.lighthouse_epoch = epoch_from_env()
        # The group's store, which the other groups reach too (torchft configures the
        # quorum's process group through one group's store): at the node's address, never
        # "localhost".  Under torchrun its workers' store; a one-process group hosts its own.
        advertise = os.environ.get(ADVERTISE_ENV) or "localhost"
        self._own_store: dist.TCPStore | None = None
        if "MASTER_PORT" in os.environ:
            store_port = int(os.environ["MASTER_PORT"])
        else:
            self._own_store = dist.TCPStore(advertise, 0, is_master=True, wait_for_workers=False)
            store_port = self._own_store.port
        quiet_torchft()
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=1,
            use_async_quorum=False,  # the membership is known before the step's samples are
            timeout=timeout,
            quorum_timeout=timedelta(seconds=levels.quorum_s),
            connect_timeout=timedelta(seconds=levels.connect_s),
            rank=self.local_rank,
            world_size=self.local_world,
            store_addr=advertise,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            replica_id=replica,
            hostname=advertise,
            checkpoint_transport=quiet_transport(timeout),
        )
        # The quorum compares steps to choose who heals whom: a group that restored a
        # checkpoint starts from its step.
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        self.retries = 0  # in the current quorum
        self._last_quorum = -1

    def begin(self) -> Membership:
        """Join this step's quorum; a group behind the others is healed inside it.

        A quorum this group could not take part in (setting up the quorum's process group
        or the heal failed: torchft reported the error, and no step can commit here) runs no
        step: the group votes against the commit, as every rank of it must, and joins the
        next quorum.  So a group left behind never trains an old step on stale weights
        (those samples would look trained), and whatever spoils a quorum -- a peer that
        died, an outsider's invented replica, garbage in a store -- costs quorums, not
        work.
        """
        while True:
            self.manager.start_quorum()
            if not self._quorum_failed():
                break
            error = self.manager.errored()
            cause = "another rank's" if error is None else repr(error.original_exception)
            log.warning(
                "trainer.quorum_failed",
                replica=self.replica,
                quorum=int(self.manager._quorum_id),
                error=cause.splitlines()[0][:200],  # torchft logged it whole, with its trace
            )
            self.manager.should_commit()  # False: the group's vote, taken by all its ranks
        participants = self.manager.num_participants()
        group_rank = self.manager.participating_rank()
        if group_rank is None:  # not with use_async_quorum=False, which heals first
            raise AgentError(f"replica group {self.replica} is not in the quorum it joined")
        quorum_id = int(self.manager._quorum_id)  # torchft 0.2 has no public accessor
        if quorum_id != self._last_quorum:
            log.info(
                "trainer.quorum",
                replica=self.replica,
                quorum=quorum_id,
                participants=participants,
                group_rank=group_rank,
                step=self.manager.current_step(),
            )
            self._last_quorum = quorum_id
            self.retries = 0
        return Membership(
            participants,
            group_rank,
            self.local_world,
            self.local_rank,
            quorum_id,
            self.retries,
            self.lighthouse_epoch,
        )

    def _quorum_failed(self) -> bool:
        """Whether any rank of this group failed to join the quorum it just formed: agreed
        inside the group (torchrun's process group), so that all its ranks skip together."""
        failed = self.manager.errored() is not None
        if self.local_world > 1:
            flag = torch.tensor([1.0 if failed else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            failed = bool(flag.item() > 0)
        return failed

    def reduce_in_group(self, buffer: torch.Tensor) -> None:
        """Sum ``buffer`` over this group's ranks (torchrun's process group)."""
        if self.local_world > 1:
            dist.all_reduce(buffer)

    def reduce_across(self, buffer: torch.Tensor) -> bool:
        """Sum ``buffer`` over the quorum's groups; whether every group commits the step.

        An uncommitted step (a peer failed) left ``buffer`` undefined: the caller drops it.
        """
        self.manager.allreduce(buffer, reduce_op=dist.ReduceOp.SUM).wait()
        committed = bool(self.manager.should_commit())
        if not committed:
            self.retries += 1
            log.warning("trainer.step_not_committed", replica=self.replica, retries=self.retries)
        return committed

    def leave(self) -> None:
        """Stop answering the lighthouse: the next quorum forms without this group."""
        self.manager.shutdown(wait=False)
