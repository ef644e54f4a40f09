"""Test fakes shared by the unit tests: a Slurm backend, Slurm command runners, allocators.

``RecordingBackend`` implements every method of ``slurm.backend.SlurmBackend`` with its
exact signature (``tests/test_fakes.py`` checks it against the protocol): reads hand out a
prepared snapshot, actions are recorded in ``calls``.  The runners answer Slurm commands
from text instead of running them, through ``SlurmRunner``'s one process seam (``_run``).
Real Slurm behaviour is tested against the local clusters, not here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_elastic.errors import SlurmRejected, SlurmUnreachable
from slurm_elastic.policy.fixed import fixed_plan
from slurm_elastic.slurm.runner import CommandResult, SlurmRunner, slurm_error
from slurm_elastic.types import (
    AllocationProblem,
    Capabilities,
    ClusterSnapshot,
    JobHistory,
    JobView,
    NodeView,
    PartitionView,
    Plan,
)

# The calls ``RecordingBackend.actions`` leaves out: reads, not actions.
_READS = ("read_history", "read_qos", "read_assoc", "probe")


@dataclass
class RecordingBackend:
    """Hands out prepared snapshots and records every action call."""

    snap: ClusterSnapshot
    calls: list[tuple[str, object]] = field(default_factory=list)
    fail_reads: bool = False
    fail_history: bool = False
    fresh: bool = False
    next_job_id: int = 500
    leaks: bool = True  # probe: the Slurm 22.05 node leak after a shrink
    fail_probe: bool = False
    refuse_reconfigure: bool = False
    qos_nodes: dict[str, int] = field(default_factory=dict)  # per-job node limits of QOS
    # (account, user, partition) -> an association's per-job node limit
    assoc_nodes: dict[tuple[str, str, str], int] = field(default_factory=dict)
    fail_limits: bool = False  # sacctmgr fails
    private_data: tuple[str, ...] = ()  # probe: slurm.conf's PrivateData
    # Slurm refuses these actions ("pin", "shrink", "submit") with this message, the job
    # being as the action needs it (what the CLI backend checks before it calls Slurm);
    # typed as the runner types Slurm's answer (``runner.slurm_error``: "try again" answers are
    # ``SlurmBusy``).
    refuse: dict[str, str] = field(default_factory=dict)

    # ---------------------------------------------------------------- reads
    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        if self.fail_reads:
            raise SlurmUnreachable("squeue: Unable to contact slurm controller")
        if self.fresh and now is not None:
            return replace(self.snap, taken_at=now)  # read now, as the CLI backend does
        return self.snap

    def read_jobs(self) -> tuple[JobView, ...]:
        return self.read_cluster().jobs

    def read_nodes(self) -> tuple[NodeView, ...]:
        return self.read_cluster().nodes

    def read_partitions(self) -> tuple[PartitionView, ...]:
        return self.read_cluster().partitions

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        self.calls.append(("read_history", since))
        if self.fail_history:
            raise SlurmUnreachable("sacct: error: Problem talking to the database")
        return ()

    def read_qos_node_limits(self) -> Mapping[str, int]:
        self.calls.append(("read_qos", None))
        if self.fail_limits:
            raise SlurmUnreachable("sacctmgr: error: Problem talking to the database")
        return dict(self.qos_nodes)

    def read_assoc_node_limits(self) -> Mapping[tuple[str, str, str], int]:
        self.calls.append(("read_assoc", None))
        if self.fail_limits:
            raise SlurmUnreachable("sacctmgr: error: Problem talking to the database")
        return dict(self.assoc_nodes)

    def probe(self) -> Capabilities:
        self.calls.append(("probe", None))
        if self.fail_probe:
            raise SlurmUnreachable("scontrol: Unable to contact slurm controller")
        return Capabilities(
            "22.05.8", "openapi/v0.0.38", False, True, self.leaks, private_data=self.private_data
        )

    # ---------------------------------------------------------------- actions
    def pin_pending_size(
        self,
        job_id: int,
        nodes: int,
        partition: str | None = None,
        submitted: Collection[str] = (),
    ) -> None:
        self.calls.append(
            ("pin", (job_id, nodes) if partition is None else (job_id, nodes, partition))
        )
        self._refuse("pin", job_id)

    def shrink(self, job_id: int, nodes: int) -> None:
        self.calls.append(("shrink", (job_id, nodes)))
        self._refuse("shrink", job_id)

    def _refuse(self, verb: str, job_id: int) -> None:
        if verb in self.refuse:
            raise slurm_error(f"scontrol update JobId={job_id}", self.refuse[verb])

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        self.calls.append(("signal", (job_id, signal, batch_only)))

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self.calls.append(("admin_comment", (job_id, text)))

    def requeue(self, job_id: int) -> None:
        self.calls.append(("requeue", job_id))

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))

    def reconfigure(self) -> None:
        self.calls.append(("reconfigure", None))
        if self.refuse_reconfigure:
            raise SlurmRejected(
                "scontrol reconfigure rejected: Access/permission denied",
                slurm_message="Access/permission denied",
            )

    def submit(
        self,
        script: str,
        *,
        user: str,
        nodes: int,
        partition: str,
        account: str | None = None,
        qos: str | None = None,
        name: str | None = None,
        comment: str | None = None,
        work_dir: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> int:
        if "submit" in self.refuse:
            self.calls.append(("submit", {"user": user, "refused": True}))
            raise slurm_error("sbatch", self.refuse["submit"])
        self.next_job_id += 1
        options = {
            "user": user,
            "nodes": nodes,
            "partition": partition,
            "account": account,
            "qos": qos,
            "name": name,
            "comment": comment,
            "work_dir": work_dir,
            "extra_args": extra_args,
        }
        self.calls.append(("submit", options))
        return self.next_job_id

    # ---------------------------------------------------------------- for the tests
    def actions(self) -> list[tuple[str, object]]:
        """The recorded calls that change something in Slurm, in order."""
        return [c for c in self.calls if c[0] not in _READS]


class AnsweringRunner(SlurmRunner):
    """A ``SlurmRunner`` that runs nothing: ``answer(argv)`` is each command's
    ``(stdout, stderr)``, exit status 0; every argv is kept in ``argvs``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.argvs: list[tuple[str, ...]] = []

    def answer(self, argv: tuple[str, ...]) -> tuple[str, str]:
        raise NotImplementedError

    def _run(
        self,
        argv: tuple[str, ...],
        *,
        timeout_s: float | None,
        stdin: str | None,
        label: str | None = None,
    ) -> CommandResult:
        self.calls += 1
        self.argvs.append(argv)
        stdout, stderr = self.answer(argv)
        return CommandResult(argv, 0, stdout, stderr, 0.0)


class ScriptedRunner(AnsweringRunner):
    """Answers each command by its first two words (``"squeue --json"``); any other
    command fails the test."""

    def __init__(self, outputs: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outputs = outputs

    def answer(self, argv: tuple[str, ...]) -> tuple[str, str]:
        key = " ".join(argv[:2])
        assert key in self.outputs, f"unexpected command: {' '.join(argv)}"
        return self.outputs[key], ""


Allocate = Callable[[AllocationProblem, str], Plan]


def targets(mapping: dict[int, int]) -> Allocate:
    """A fixed plan: the listed jobs go to the given size, every other keeps its own."""

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        return fixed_plan(problem, mapping, solver="test-plan")

    return allocate


def fitting(mapping: dict[int, int], seen: list[AllocationProblem]) -> Allocate:
    """A fixed plan as a policy would make it: the listed jobs go to the given size while
    the sizes fit the nodes; when the frozen jobs' sizes leave too few, every job keeps
    its own.  Keeps every problem it is given."""

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        seen.append(problem)
        plan = fixed_plan(problem, mapping, solver="test-plan")
        taken = sum(d.target_nodes for d in plan.decisions) + sum(r.nodes for r in problem.rigid)
        if taken > sum(p.nodes for p in problem.pools):
            return fixed_plan(problem, {}, solver="test-plan")
        return plan

    return allocate


def spying(seen: list[AllocationProblem]) -> Allocate:
    """The daemon's own policy, keeping every problem it is given."""
    from slurm_elastic.daemon.controller import _policy_allocate

    def allocate(problem: AllocationProblem, policy: str) -> Plan:
        seen.append(problem)
        return _policy_allocate(problem, policy)

    return allocate
