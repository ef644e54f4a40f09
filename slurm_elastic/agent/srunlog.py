"""srun's own lines about a planned shrink, told apart from real failures.

When Slurm takes a node from a running job it kills the job step's task there, and srun
says so on its stderr: ``srun: error: n2: task 1: Killed``.  At a shrink the launcher
agreed to, that is the expected end of a task on a node the daemon removed, after the
workers checkpointed; as an error line it reads like a crash.  So the launcher reads srun's
stderr (:func:`copy_stderr`): while such a shrink is being applied (:class:`PlannedRemoval`,
opened by the follower once it acknowledged), the line for a removed node becomes one INFO
line, ``agent.task_removed``; every other line, on any other node or at any other time,
passes through unchanged.  The same holds for every node while the launcher itself is being
stopped (SIGTERM: a companion the daemon gives back, ``scancel``): its tasks ending then
are that stop's doing.

Slurm adds one more: once a shrink has taken a node from a running step, srun ends with
status 137 and ``srun: Force Terminated StepId=...`` even when every task that stayed ended
with 0 (seen on 22.05, 24.11 and 26.05: the step's part on the removed node counts as
killed).  :class:`StepReport` keeps what srun said about the step's tasks, so the launcher
can tell that end from a failed step (:meth:`StepReport.tasks_succeeded`).

And one of torchft's: a replica group's manager ends its process (``exit(1)``) on a kill
request, which anyone who reaches its port or the lighthouse's page can send (torchft 0.2
has no authentication), after the line ``[WARN] [torchft::manager] - got kill request: ...``
(the node agent keeps that level on: ``agent.node``).  :attr:`StepReport.kill_requests`
counts them, so the launcher can tell a step ended from outside the job from one that failed
(``agent.launcher``, ``OutsideKills``).  torch-free.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import structlog

log = structlog.get_logger("slurm_elastic.agent")

# srun's "%s: task %s: %s" about a task that ended (src/srun/srun_job.c): killed or
# terminated, as Slurm ends the task of a node taken from the job, or exit code 143, as the
# node agent (agent.torchrun) ends on the SIGTERM of a step that is stopped.
_TASK_ENDED = re.compile(
    rb"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[0-9,\-]+): "
    rb"(?P<how>Killed|Terminated|Exited with exit code 143)\s*$"
)

# Any other end of a task that srun reports (src/srun/srun_job.c): exit codes, signals.
_TASK_FAILED = re.compile(rb"^srun: error: [^\s:]+: tasks? [0-9,\-]+: ")
# srun's info() when slurmctld killed the step's part on a node (src/api/step_launch.c).
_FORCE_TERMINATED = re.compile(rb"^srun: Force Terminated ")
# torchft's manager before it exits on a kill request (src/manager.rs, ``kill``): its log
# line, after a timestamp, wherever the task's stderr puts it.
_KILL_REQUEST = re.compile(rb"\[torchft::manager\] - got kill request: ")


@dataclass
class StepReport:
    """What srun's stderr said about one step's tasks."""

    force_terminated: bool = False  # srun: Force Terminated (ends with status 137)
    task_failures: int = 0  # task ends that were not a planned shrink's
    kill_requests: int = 0  # replica groups a torchft kill request ended (module doc)
    on_kill_request: Callable[[], None] | None = None  # told of each, as it is read

    def tasks_succeeded(self) -> bool:
        """Whether srun's non-zero status is Slurm's count of a node taken from the step,
        not a task's failure: srun was force-terminated yet reported no task that ended
        badly, so every task that stayed ended with 0 (module doc)."""
        return self.force_terminated and self.task_failures == 0

    def note(self, line: bytes) -> None:
        """Count an unplanned line (one :func:`copy_stderr` passes through)."""
        if _FORCE_TERMINATED.match(line):
            self.force_terminated = True
        elif _TASK_FAILED.match(line):
            self.task_failures += 1
        elif _KILL_REQUEST.search(line):
            self.kill_requests += 1
            if self.on_kill_request is not None:
                self.on_kill_request()


class PlannedRemoval:
    """The nodes a shrink in progress removes, and until when (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._keep: frozenset[str] = frozenset()
        self._until = float("-inf")

    def open(self, keep_nodes: tuple[str, ...], seconds: float) -> None:
        """A shrink keeping ``keep_nodes`` (empty: not named) is applied within ``seconds``."""
        with self._lock:
            self._keep = frozenset(keep_nodes)
            self._until = self._clock() + seconds

    def close(self) -> None:
        with self._lock:
            self._until = float("-inf")

    def expects(self, node: str) -> bool:
        """Whether a task ending on ``node`` now is the shrink's doing."""
        with self._lock:
            return self._clock() < self._until and node not in self._keep


def planned_end(line: bytes, removal: PlannedRemoval) -> tuple[str, str] | None:
    """(node, tasks) when ``line`` is srun's report of a task the planned shrink ended."""
    match = _TASK_ENDED.match(line)
    if match is None:
        return None
    node = match["node"].decode(errors="replace")
    return (node, match["tasks"].decode()) if removal.expects(node) else None


def copy_stderr(
    stream: IO[bytes],
    removal: PlannedRemoval,
    out: IO[bytes],
    report: StepReport | None = None,
) -> None:
    """Copy srun's stderr to ``out`` line by line, a planned shrink's task ends as INFO;
    ``report`` counts the rest."""
    for line in iter(stream.readline, b""):
        ended = planned_end(line, removal)
        if ended is None:
            if report is not None:
                report.note(line)
            out.write(line)
            out.flush()
        else:
            node, tasks = ended
            log.info("agent.task_removed", node=node, tasks=tasks, reason="planned shrink")
