"""Issue 20, item 4, on real Slurm: a grow racing a preemption.

The instance is brought up with partition-priority preemption (a partition ``urgent`` over
the same nodes, ``PriorityTier=10``) in each of the two modes sites use, ``REQUEUE`` and
``CANCEL``, and put back as the session had it afterwards.  An elastic job runs on 2 of the
4 nodes and a rigid job on the other 2; the daemon grows the elastic job to 3, so its
companion waits in the queue; then a 4-node job in ``urgent`` preempts both.  Then:

* no companion of the preempted job is left, running or pending (the daemon cancels a
  companion whose parent no longer runs; a running one's launcher also ends its step);
* in no cycle does the daemon's problem count more nodes held than the cluster has, while
  the parent, its companion and the urgent job come and go;
* REQUEUE: the configured policy (mip) takes over; while the urgent job holds every node
  the requeued job is pinned to the size last planned for it (3: the grow), not its
  parent's own pin of 2, and once the urgent job ends it runs again at the size the policy
  pinned last; CANCEL: it is gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.actuate.journal import ActionStatus
from slurm_elastic.cluster_state import pinned_to
from slurm_elastic.daemon.drill import ResizeDrill
from slurm_elastic.marker import companion_parent, format_marker
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import ActionKind, AllocationProblem, ElasticSpec, Plan
from tests.slurm_cluster import SlurmCluster, configured, wait_until

pytestmark = [pytest.mark.slurm]

URGENT = "PartitionName=urgent Nodes=n[1-4] PriorityTier=10 OverSubscribe=EXCLUSIVE State=UP"


def preemption(mode: str) -> list[str]:
    return ["PreemptType=preempt/partition_prio", f"PreemptMode={mode}", URGENT]


@pytest.fixture(params=["REQUEUE", "CANCEL"])
def preempting(request: pytest.FixtureRequest, clean_queue: SlurmCluster) -> Iterator[str]:
    with configured(clean_queue, preemption(request.param)):
        yield request.param


class RecordingDrill(ResizeDrill):
    """The drill, keeping every problem the daemon's cycle posed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.problems: list[AllocationProblem] = []
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _allocate(self, problem: AllocationProblem, policy: str) -> Plan:
        self.problems.append(problem)
        return super()._allocate(problem, policy)


def companions_of(cluster: SlurmCluster, parent: int) -> dict[int, str]:
    """The active companions of ``parent``: job id -> state."""
    out = cluster.run("squeue", "-h", "-a", "-o", "%i|%T|%k").stdout
    found = {}
    for line in out.splitlines():
        job, state, comment = line.split("|", 2)
        if companion_parent(comment) == parent:
            found[int(job)] = state
    return found


def test_a_grow_racing_a_preemption_leaves_no_companion_and_counts_no_node_twice(
    preempting: str, clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    backend = CliBackend()

    def submit(*args: str) -> int:
        out = clean_queue.run(
            "sbatch", "--parsable", "-o", "/dev/null", f"--chdir={tmp_path}", *args,
            "--wrap", "sleep 600",
        ).stdout  # fmt: skip
        return int(out.strip().split(";")[0])

    def size(job: int) -> tuple[str, int]:
        view = backend.read_job(job)
        return ("GONE", 0) if view is None else (view.state.value, len(view.nodes))

    def pinned(job: int, nodes: int) -> bool:
        # As the daemon reads it: after this update Slurm 22.05's squeue -O and scontrol
        # still show the old NumNodes and MaxNodes (2), its JSON the new request (node=3).
        view = next(j for j in backend.read_cluster().jobs if j.job_id == job)
        return view.is_pending and pinned_to(view, nodes)

    # The range in the marker: pinning the job's size erases it from Slurm.
    marker = format_marker(ElasticSpec(1, 3))
    job_id = submit("--hold", "--nodes=1-3", f"--comment={marker}", "-p", "batch")
    backend.pin_pending_size(job_id, 2)
    clean_queue.run("scontrol", "release", str(job_id))
    wait_until(lambda: size(job_id) == ("RUNNING", 2), 30, "the elastic job on 2 nodes")
    # The other two nodes busy, so the grow's companion waits in the queue; not requeued
    # when preempted (cancelled instead), so only the elastic job comes back.
    rigid = submit("-N2", "-p", "batch", "--no-requeue")
    wait_until(lambda: size(rigid) == ("RUNNING", 2), 30, "the rigid job on 2 nodes")
    with RecordingDrill(backend, tmp_path / "state", ack_timeout_s=60.0) as drill:
        grow = drill.resize(job_id, 3, timeout_s=60)
        assert grow.outcome == "applied" and grow.companion_id is not None, grow
        assert companions_of(clean_queue, job_id) == {grow.companion_id: "PENDING"}
        urgent = submit("-p", "urgent", "-N4")
        wait_until(lambda: size(urgent) == ("RUNNING", 4), 60, "the urgent job on 4 nodes")
        # The parent no longer runs: its companion goes before it can start anywhere.
        wait_until(lambda: not companions_of(clean_queue, job_id), 30, "no companion left")
        if preempting == "REQUEUE":
            assert size(job_id)[0] in {"PENDING", "REQUEUED"}, size(job_id)
            # From here the configured policy decides, as the deployed daemon does.  While
            # the urgent job holds every node it starts the job nowhere, and Slurm would
            # start it the moment the nodes free at its parent's own pin (2), before a cycle
            # could pin another: so it is pinned to the size last planned for it (3).
            drill.hand_over()
            wait_until(lambda: pinned(job_id, 3), 30, "the job pinned to 3")
            clean_queue.run("scancel", str(urgent))
            wait_until(lambda: size(job_id)[0] == "RUNNING", 120, "the job again")
            # At that size, or at the one the policy pinned when the nodes freed.
            pins = [
                e.action.to_nodes
                for e in drill.journal.actions_for(job_id)
                if e.action.kind is ActionKind.START_AT_SIZE and e.status is ActionStatus.APPLIED
            ]
            assert size(job_id)[1] == pins[-1], (size(job_id), pins)
        else:
            ended = {"PREEMPTED", "CANCELLED", "GONE"}  # Slurm names it PREEMPTED
            wait_until(lambda: size(job_id)[0] in ended, 30, "the job cancelled")
        time.sleep(1.0)  # a cycle or two more
        problems = list(drill.problems)
    # The preempted run's companion is gone for good (a requeued job's new run may be grown).
    assert grow.companion_id not in companions_of(clean_queue, job_id)
    # What each cycle took as held: never more than the cluster's nodes.
    for problem in problems:
        held = sum(r.nodes for r in problem.rigid if r.running)
        held += sum(e.current_nodes for e in problem.elastic)
        assert held <= len(clean_queue.nodes), problem
