"""``python -m slurm_elastic.agent.torchrun ARGS``: torchrun, minus the error lines of a resize.

At a resize every worker leaves with ``RESTART_EXIT`` (75) after its checkpoint, so that
torch elastic restarts the group at the new size (``agent.torch``).  torchrun reports that
as a failure: ``failed (exitcode: 75) local_rank: 0 ...`` at ERROR, after ``Sending process
N closing signal SIGTERM`` at WARNING for the workers it stops meanwhile.  In the job's
output a planned resize then reads like a crash.  The workers already log the resize at
INFO (``trainer.exit reason=restart step=N``, one line per rank), so this drops torch's two
lines for it and changes nothing else: any other exit code is still an error, with its
traceback, and torchrun's arguments and behaviour are its own (``torch.distributed.run``).

A companion that a shrink gives back is ended by the wrapper itself (``agent.stopping``,
``release.json``): SIGTERM to torchrun, torch's warning about it dropped, exit 0.  So is a
node that a stop under the signal contract removes (``agent.left``).

One more: a signal that stops torchrun itself -- the SIGTERM Slurm sends when the job or
its step ends: a companion given back by the daemon, ``scancel``, the time limit -- makes
it raise ``SignalException`` out of its main loop, a 30-line traceback of torch's own
frames.  The wrapper writes one line instead and exits 128 + the signal's number, as a
process killed by it would (so the launcher still sees an unfinished training).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from slurm_elastic.agent.boundary import RESTART_EXIT
from slurm_elastic.agent.stopping import StopWatcher, children, signal_number

# The logger of torch.distributed.elastic.multiprocessing.api (torch 2.x), which writes both.
TORCH_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
# torch elastic's agent, which warns "Received 15 death signal, shutting down workers".
TORCH_AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"


class ResizeExits(logging.Filter):
    """Drops torchrun's records of the workers' planned exit for a resize, and, while the
    signal contract stops them (``stopping``), of their end by the stop signal or by the
    SIGKILL after its grace."""

    def __init__(self, stopping: Callable[[], bool] = lambda: False, stop_signal: int = 0):
        super().__init__()
        self._stopping = stopping
        self._stopped_codes = {-stop_signal, -int(signal.SIGKILL)} if stop_signal else set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("failed (exitcode: "):
            args = record.args if isinstance(record.args, tuple) else ()
            code = args[0] if args else None
            if code == RESTART_EXIT:
                return False
            return not (code in self._stopped_codes and self._stopping())
        # Stopping the other workers once one has left: part of the same restart.  After a
        # real failure the "failed (exitcode: N)" line above still says what happened.
        return not message.startswith("Sending process %s closing signal")


class ReleasedStop(logging.Filter):
    """Drops torch elastic's warning that it got SIGTERM when the wrapper sent it itself, to
    end a companion that a shrink gave back (``agent.stopping``): a planned end."""

    def __init__(self, released: Callable[[], bool]) -> None:
        super().__init__()
        self._released = released

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith("Received %s death signal") and self._released())


def _forward_to_workers(signum: int, _frame: object) -> None:
    # SIGUSR1 (Slurm's --signal, or the node agent's own) is for the training script: the
    # node agent ignored it for torchrun's sake, and that ignore would pass to the workers.
    for pid in children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def start_stop_watcher(env: Mapping[str, str]) -> StopWatcher | None:
    """The signal contract's node side (``agent.stopping``) when run by the node agent."""
    job_dir, node = env.get("SLURM_ELASTIC_JOB_DIR"), env.get("SLURMD_NODENAME")
    if not job_dir or not node:
        return None
    own_job = env.get("SLURM_JOB_ID", "")
    watcher = StopWatcher(
        Path(job_dir),
        node,
        signal_number(env.get("SLURM_ELASTIC_STOP_SIGNAL") or "USR1"),
        float(env.get("SLURM_ELASTIC_STOP_GRACE") or 30.0),
        job_id=int(own_job) if own_job.isdigit() else None,
    )
    watcher.start()
    return watcher


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    signal.signal(signal.SIGUSR1, _forward_to_workers)
    watcher = start_stop_watcher(os.environ)
    exits = ResizeExits(watcher.stopping, watcher.signum) if watcher else ResizeExits()
    logging.getLogger(TORCH_PROCESS_LOGGER).addFilter(exits)
    if watcher is not None:
        planned = ReleasedStop(lambda: watcher.released or watcher.left)
        logging.getLogger(TORCH_AGENT_LOGGER).addFilter(planned)
    try:
        run.main(sys.argv[1:] if argv is None else argv)
    except SignalException as exc:
        # torchrun stopped its workers before raising: nothing is left to clean up.
        name = signal.Signals(exc.sigval).name
        log = structlog.get_logger("slurm_elastic.agent")
        if watcher is not None and watcher.released:
            log.info("agent.released", node=watcher.node, job=watcher.job_id)
            sys.exit(0)  # the shrink's planned end of this companion, not a failure
        if watcher is not None and watcher.left:
            log.info("agent.left", node=watcher.node, reason="removed by the shrink")
            sys.exit(0)  # the signal contract's planned end of this node
        log.info("agent.torchrun_stopped", signal=name)
        sys.exit(128 + int(exc.sigval))


if __name__ == "__main__":
    main()
