"""``python -m slurm_elastic.agent.torchrun ARGS``: torchrun, minus the error lines of a resize.

At a resize every worker leaves with ``RESTART_EXIT`` (75) after its checkpoint, so that
torch elastic restarts the group at the new size (``agent.torch``).  torchrun reports that
as a failure: ``failed (exitcode: 75) local_rank: 0 ...`` at ERROR, after ``Sending process
N closing signal SIGTERM`` at WARNING for the workers it stops meanwhile.  In the job's
output a planned resize then reads like a crash.  The workers already log the resize at
INFO (``trainer.exit reason=restart step=N``, one line per rank), so this drops torch's two
lines for it and changes nothing else: any other exit code is still an error, with its
traceback, and torchrun's arguments and behaviour are its own (``torch.distributed.run``).

One more: a signal that stops torchrun itself -- the SIGTERM Slurm sends when the job or
its step ends: a companion given back by the daemon, ``scancel``, the time limit -- makes
it raise ``SignalException`` out of its main loop, a 30-line traceback of torch's own
frames.  The wrapper writes one line instead and exits 128 + the signal's number, as a
process killed by it would (so the launcher still sees an unfinished training).
"""

from __future__ import annotations

import logging
import signal
import sys

import structlog

from slurm_elastic.agent.boundary import RESTART_EXIT

# The logger of torch.distributed.elastic.multiprocessing.api (torch 2.x), which writes both.
TORCH_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class ResizeExits(logging.Filter):
    """Drops torchrun's records of the workers' planned exit for a resize."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("failed (exitcode: "):
            args = record.args if isinstance(record.args, tuple) else ()
            return not (args and args[0] == RESTART_EXIT)
        # Stopping the other workers once one has left: part of the same restart.  After a
        # real failure the "failed (exitcode: N)" line above still says what happened.
        return not message.startswith("Sending process %s closing signal")


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    logging.getLogger(TORCH_PROCESS_LOGGER).addFilter(ResizeExits())
    try:
        run.main(sys.argv[1:] if argv is None else argv)
    except SignalException as exc:
        # torchrun stopped its workers before raising: nothing is left to clean up.
        name = signal.Signals(exc.sigval).name
        structlog.get_logger("slurm_elastic.agent").info("agent.torchrun_stopped", signal=name)
        sys.exit(128 + int(exc.sigval))


if __name__ == "__main__":
    main()
