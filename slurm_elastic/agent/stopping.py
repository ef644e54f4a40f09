"""The signal contract: how a training script that does not use the library is shrunk.

A script without ``agent.elastic`` or ``ElasticTrainer`` cannot answer a hold: it never
writes ``held.json``.  For such a job (no ``agent.json`` in the job directory: the library
writes it when it starts) the follower asks instead for a *stop*: ``control.json`` action
``signal``.  On every node the torchrun wrapper (:class:`StopWatcher`, a thread beside
torchrun) then

1. sends its worker processes the job's stop signal (``SIGUSR1`` unless the job said
   otherwise: ``slurm-elastic run --stop-signal``): a script that checkpoints on it does so,
   one that does nothing ends (the default action of SIGUSR1);
2. waits until those processes have exited, at most the grace period
   (``--stop-grace``), and then ends what is left of them with SIGKILL;
3. writes ``stopped-<node>.json``: when the signal went out, how long the workers took,
   and how long they had been training since they last started -- the most the script can
   lose, since whatever it did after its own last checkpoint is redone;
4. on a node the shrink removes (not among the request's ``keep_nodes``), stops torchrun
   as soon as its workers are gone, before torch elastic can bring this node into a new
   rendezvous round: a round that counted it would start workers that wait for a node
   about to vanish.  The node's task ends by itself (``agent.left``, exit 0).

On the nodes that stay torch elastic restarts the workers, which resume from the script's
own checkpoint; once every node has written its file (or the grace has passed) the
follower acknowledges, and the daemon shrinks the job.

The same watcher ends a companion job that a shrink gives back, for every job (library or
not): when ``release.json`` names its job, it stops torchrun (SIGTERM to the agent: its
workers are holding or already stopped) and the wrapper exits 0 (``released``).  The
companion's srun step and batch script then end by themselves, and Slurm records a
completed job instead of writing "CANCELLED" error lines into its output.  torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from slurm_elastic.agent.jobdir import RELEASE, ControlReader, read_json, write_json

log = structlog.get_logger("slurm_elastic.agent")

STOP_ACTION = "signal"
# How long after a stop torch elastic may still report the stopped workers' exits.
EXITS_NOTICED_S = 30.0
AGENT_MARKER = "agent.json"  # written by the library when it starts (agent.boundary)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def signal_number(name: str) -> int:
    """``USR1`` / ``SIGUSR1`` / ``10`` -> 10; ValueError for anything else."""
    text = name.strip().upper()
    if text.isdigit() and int(text) in {int(s) for s in signal.Signals}:
        return int(text)
    try:
        return int(signal.Signals["SIG" + text.removeprefix("SIG")])
    except KeyError:
        raise ValueError(f"not a signal name: {name!r}") from None


def stopped_name(node: str) -> str:
    return f"stopped-{node}.json"


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``), any of its threads' (empty if gone)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(word) for word in handle.read().split()]
        except OSError:
            continue
    return found


def running_for_s(pid: int) -> float | None:
    """Seconds since ``pid`` started (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - int(fields[19]) / _CLOCK_TICKS  # field 22 of stat: starttime


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purpose: it trains no more.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_workers(
    workers: list[int],
    signum: int,
    grace_s: float,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = 0.05,
) -> tuple[float, bool]:
    """Signal ``workers``, wait for them at most ``grace_s``, SIGKILL the rest.

    Returns (seconds waited, whether all ended by themselves within the grace).
    """
    started = clock()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    while clock() - started < grace_s:
        if not any(alive(pid) for pid in workers):
            return clock() - started, True
        time.sleep(poll_s)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return clock() - started, False


class StopWatcher:
    """Beside torchrun on one node: carries out the follower's stop requests (module doc)."""

    def __init__(
        self,
        job_dir: Path,
        node: str,
        signum: int,
        grace_s: float,
        agent_pid: int | None = None,
        poll_s: float = 0.2,
        job_id: int | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.node = node
        self.job_id = job_id  # the Slurm job this node agent runs in (a companion's own)
        self.released = False  # a shrink gave this job back: torchrun was stopped for it
        self.left = False  # a stop's shrink removes this node: torchrun was stopped for it
        self.signum = signum
        self.grace_s = grace_s
        self.agent_pid = agent_pid if agent_pid is not None else os.getpid()
        self.poll_s = poll_s
        self._reader = ControlReader(job_dir)
        self._busy_until = float("-inf")  # monotonic: until when a stop's exits are expected
        current = self._reader.read()
        # Requests from before this agent started were for other workers.
        self._seen = current.seq if current is not None else 0
        old = read_json(job_dir / RELEASE)
        self._released_by = str(old.get("instruction_id")) if old else None
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="slurm-elastic-stop", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._stop.set()

    def stopping(self) -> bool:
        """Whether the workers' ends now are this watcher's doing (a stop under way, or
        just done: torch elastic notices the exits a moment later)."""
        return time.monotonic() < self._busy_until

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # never take torchrun down
                log.warning("agent.stop_failed", node=self.node, error=str(exc))

    def poll_once(self) -> bool:
        """Carry out a new stop or release request, if there is one; whether there was."""
        return self.release_once() or self.stop_once()

    def release_once(self) -> bool:
        """Stop torchrun when a new ``release.json`` names this job (module doc)."""
        if self.job_id is None or self.released:
            return False
        record = read_json(self.job_dir / RELEASE)
        if not record or str(record.get("instruction_id")) == self._released_by:
            return False
        self._released_by = str(record.get("instruction_id"))
        jobs = record.get("jobs")
        if not isinstance(jobs, list) or self.job_id not in jobs:
            return False
        self.released = True
        log.info("agent.releasing", node=self.node, job=self.job_id)
        os.kill(self.agent_pid, signal.SIGTERM)
        return True

    def stop_once(self) -> bool:
        """Carry out a new stop request, if there is one; whether there was."""
        control = self._reader.read()
        if control is None or control.seq <= self._seen or control.action != STOP_ACTION:
            return False
        self._seen = control.seq
        self._busy_until = time.monotonic() + self.grace_s + EXITS_NOTICED_S
        workers = children(self.agent_pid)
        ages = [age for pid in workers if (age := running_for_s(pid)) is not None]
        leaving = bool(control.keep_nodes) and self.node not in control.keep_nodes
        # A leaving node polls faster: torchrun looks at its workers every 0.1 s, and must
        # not get to start a new round first (module doc, step 4).
        waited, by_themselves = stop_workers(
            workers, self.signum, self.grace_s, poll_s=0.005 if leaving else 0.05
        )
        name = signal.Signals(self.signum).name
        record = {
            "seq": control.seq,
            "node": self.node,
            "signal": name,
            "workers": len(workers),
            "waited_s": round(waited, 3),
            "ended_by_themselves": by_themselves,
            "trained_since_start_s": round(max(ages), 1) if ages else 0.0,
        }
        write_json(self.job_dir / stopped_name(self.node), record)
        log.info("agent.workers_stopped", leaving=leaving, **record)
        if leaving:  # last: the wrapper exits on it, and this thread with it
            self.left = True
            os.kill(self.agent_pid, signal.SIGTERM)
        return True
