"""Instructions from the daemon to jobs, and the jobs' acknowledgements.

The executor posts an ``Instruction`` (a ``protocol`` message; today only ``shrink``) for a
job; the job's agent fetches it through the HTTP API (``GET /v1/jobs/{id}/instruction``),
checkpoints, stops the workers on the nodes that will go, and acknowledges (``POST .../ack``)
with status ``ready`` (safe to shrink now) or ``failed``.  The board is the only place where
the API thread and the control loop meet, so every method takes the lock.

An instruction stays visible until the controller clears it (after the shrink, on
timeout, or when the job ends): an agent that polls again sees the same id and knows it
has already answered.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from slurm_elastic.protocol import AckStatus, Instruction


@dataclass(frozen=True, slots=True)
class Ack:
    """An acknowledgement as the daemon received it (its wire form: ``protocol.AckBody``)."""

    instruction_id: str
    job_id: int
    status: AckStatus
    step: int
    detail: str
    received_at: float


class InstructionBoard:
    """Thread-safe: at most one open instruction per job, and the first ack to each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, Instruction] = {}
        self._acks: dict[str, Ack] = {}

    def post(self, job_id: int, instruction: Instruction) -> None:
        """Open ``instruction`` for ``job_id``, replacing (and forgetting) any earlier one."""
        with self._lock:
            old = self._open.get(job_id)
            if old is not None:
                self._acks.pop(old.id, None)
            self._open[job_id] = instruction

    def pending_for(self, job_id: int) -> Instruction | None:
        with self._lock:
            return self._open.get(job_id)

    def ack(self, ack: Ack) -> bool:
        """Record ``ack``; False when it answers no open instruction of that job.

        A repeated ack is accepted but the first one stands: the controller may already
        have acted on it.
        """
        with self._lock:
            current = self._open.get(ack.job_id)
            if current is None or current.id != ack.instruction_id:
                return False
            self._acks.setdefault(ack.instruction_id, ack)
            return True

    def ack_for(self, instruction_id: str) -> Ack | None:
        with self._lock:
            return self._acks.get(instruction_id)

    def clear(self, job_id: int) -> None:
        with self._lock:
            old = self._open.pop(job_id, None)
            if old is not None:
                self._acks.pop(old.id, None)

    def open_jobs(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._open))
