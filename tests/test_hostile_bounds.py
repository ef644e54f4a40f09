"""Hostile users against the real cluster: bounded work per job (issue 19, class 2).

se-bob writes the largest numbers the marker grammar allows, at submission and later with
``scontrol update``; se-alice runs an honest elastic job.  The daemon's cycle must stay
bounded by the cluster's size and the number of jobs: asserted on what the cycle builds
(the sizes offered to the solver, the outlooks), never on wall time (that is
``scripts/bench_hostile.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.config import Config
from slurm_elastic.daemon.controller import Controller, CycleResult
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import AllocationProblem, JobView
from tests.fakes import spying
from tests.slurm_cluster import ClusterUser, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def queue() -> dict[int, JobView]:
    return {j.job_id: j for j in CliBackend().read_jobs() if j.state.is_active}


def all_running(*job_ids: int) -> bool:
    views = queue()
    return all(j in views and views[j].is_running for j in job_ids)


def one_cycle(state_dir: Path) -> tuple[CycleResult, AllocationProblem]:
    """One shadow-mode cycle of a fresh daemon on the cluster; its result and its problem."""
    seen: list[AllocationProblem] = []
    config = Config.model_validate({"mode": "shadow", "state_dir": str(state_dir)})
    ctl = Controller(
        CliBackend(),
        config,
        reports=ReportStore(),
        journal=Journal.in_state_dir(config.state_dir),
        agents=InstructionBoard(),
        allocate=spying(seen),
    )
    result = ctl.run_once(ctl.backend.read_cluster().taken_at)
    assert result.ok, result.error
    (problem,) = seen
    return result, problem


def test_hostile_markers_keep_the_cycle_bounded_by_the_cluster(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    alice, bob = two_users
    nodes = len(clean_queue.nodes)
    honest = alice.sbatch("--nodes=1-2", "--comment=elastic", "--wrap", "sleep 120")
    # se-bob's first job takes the other nodes, so the rest stay pending (and eligible).
    first = bob.sbatch("--nodes=1-2", "--comment=elastic", "--wrap", "sleep 120")
    wait_until(lambda: all_running(honest, first), 30, "both first jobs running")
    # At submission: the plugin caps these at the cluster's nodes.
    submitted = bob.sbatch(
        "--nodes=1-999999", "--comment=elastic:min=1,max=999999", "--wrap", "sleep 60"
    )
    # After submission, where no plugin looks: scontrol update by the job's owner.
    updated = bob.sbatch("--nodes=1-2", "--comment=elastic", "--wrap", "sleep 60")
    bob.run("scontrol", "update", f"JobId={updated}", "Comment=elastic:min=1,max=999999")
    ranged = bob.sbatch("--nodes=1", "--comment=plain", "--wrap", "sleep 60")
    bob.run("scontrol", "update", f"JobId={ranged}", "Comment=elastic", "NumNodes=1-999999")
    bob.run("scontrol", "update", f"JobId={first}", "Comment=elastic:min=1,max=999999")
    views = queue()
    assert views[ranged].max_nodes == 999_999 and "999999" in views[updated].comment

    result, problem = one_cycle(tmp_path / "state")
    demands = {d.job_id: d for d in problem.elastic}
    assert set(demands) == {honest, first, submitted, updated, ranged}
    for job_id in (first, submitted, updated, ranged):
        assert demands[job_id].allowed_sizes == tuple(range(1, nodes + 1)), job_id
    assert demands[honest].allowed_sizes == (1, 2)
    # The bound: per job at most as many sizes as the cluster has nodes, in the solver's
    # input and in the model's outlooks alike.
    assert all(len(d.outlook.sizes) <= nodes for d in problem.elastic)
    assert sum(len(d.allowed_sizes) for d in problem.elastic) <= nodes * len(problem.elastic)
    rows = {r.job_id: r for r in result.jobs}
    assert {rows[j].max_nodes for j in (first, submitted, updated, ranged)} == {nodes}
    assert rows[honest].max_nodes == 2 and result.plan is not None
    assert result.plan.target(honest) is not None  # se-alice's job is planned as ever


def test_partition_max_nodes_bounds_growth_by_companions(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """A partition's MaxNodes limits one job; companions are separate jobs, so without the
    cap the daemon would grow a job past it (a lead of the review: confirmed).  The cap
    keeps every size the daemon plans for the job within MaxNodes, at submission and after
    ``scontrol update Comment=``."""
    alice, _ = two_users
    part = clean_queue.partitions[-1]  # "shared": the default stays as it is
    clean_queue.run("scontrol", "update", f"PartitionName={part}", "MaxNodes=2")
    try:
        capped = alice.sbatch(
            "-p", part, "--hold", "--nodes=1-4", "--comment=elastic", "--wrap", "true"
        )  # fmt: skip
        updated = alice.sbatch("-p", part, "--nodes=1", "--comment=plain", "--wrap", "sleep 60")
        alice.run("scontrol", "update", f"JobId={updated}", "Comment=elastic:min=1,max=4")
        views = queue()
        assert views[capped].comment == "elastic:min=1,max=2"
        wait_until(lambda: all_running(updated), 30, "the updated job running")
        result, problem = one_cycle(tmp_path / "state")
        demand = {d.job_id: d for d in problem.elastic}[updated]
        assert demand.max_nodes == 2  # never a companion beyond the partition's MaxNodes
        assert {r.job_id: r.max_nodes for r in result.jobs}[updated] == 2
    finally:
        clean_queue.run("scontrol", "update", f"PartitionName={part}", "MaxNodes=UNLIMITED")


def test_qos_node_limit_bounds_growth_by_companions(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """A QOS's MaxTRESPerJob node= limits each job of the QOS; companions are jobs of their
    own, so without the cap the daemon would grow past it (a lead of the review: confirmed).
    A QOS of this test's own (the version's slurmdbd is shared by its instances)."""
    alice, _ = two_users
    qos = f"se-{clean_queue.cluster_name}-nodes2"
    where = ("where", f"cluster={clean_queue.cluster_name}", f"user={alice.name}")
    clean_queue.run("sacctmgr", "-i", "add", "qos", qos, "MaxTRESPerJob=node=2")
    try:
        clean_queue.run("sacctmgr", "-i", "modify", "user", *where, "set", f"qos+={qos}")

        def submitted() -> int | None:
            proc = alice.run(
                "sbatch", "--parsable", "-o", "/dev/null", f"--qos={qos}", "--nodes=1",
                "--comment=plain", "--wrap", "sleep 60", check=False,
            )  # fmt: skip
            return int(proc.stdout.split(";")[0]) if proc.returncode == 0 else None

        deadline = time.monotonic() + 30  # slurmctld learns the new QOS from slurmdbd
        while (job_id := submitted()) is None:
            if time.monotonic() > deadline:
                pytest.fail(f"sbatch --qos={qos} still refused after 30s")
            time.sleep(0.5)
        alice.run("scontrol", "update", f"JobId={job_id}", "Comment=elastic:min=1,max=4")
        wait_until(lambda: all_running(job_id), 30, "the job running")
        result, problem = one_cycle(tmp_path / "state")
        assert {d.job_id: d for d in problem.elastic}[job_id].max_nodes == 2
        assert {r.job_id: r.max_nodes for r in result.jobs}[job_id] == 2
    finally:
        clean_queue.run("scancel", "-u", alice.name, check=False)
        clean_queue.run("sacctmgr", "-i", "modify", "user", *where, "set", f"qos-={qos}",
                        check=False)  # fmt: skip
        clean_queue.run("sacctmgr", "-i", "delete", "qos", qos, check=False)


def bounded_to_two(alice: ClusterUser, bob: ClusterUser, tmp_path: Path, *partition: str) -> None:
    """se-alice's elastic ``-N1-4`` job runs on the one node se-bob's exclusive 3-node job
    leaves (this cluster does not enforce accounting limits: AccountingStorageEnforce=none);
    every size the daemon plans for it stays within 2, the limit Slurm would hold it to.
    Without the cap, companions would grow it to 4."""
    rigid = bob.sbatch(*partition, "--exclusive", "--nodes=3", "--wrap", "sleep 60")
    wait_until(lambda: all_running(rigid), 30, "se-bob's 3-node job running")
    job_id = alice.sbatch(*partition, "--nodes=1-4", "--comment=elastic", "--wrap", "sleep 60")
    wait_until(lambda: all_running(job_id), 30, "se-alice's job running")
    assert queue()[job_id].node_count == 1
    result, problem = one_cycle(tmp_path / "state")
    demand = {d.job_id: d for d in problem.elastic}[job_id]
    assert (demand.max_nodes, demand.allowed_sizes) == (2, (1, 2))
    assert {r.job_id: r.max_nodes for r in result.jobs}[job_id] == 2


def test_partition_qos_node_limit_bounds_growth_by_companions(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """A partition's own QOS (``scontrol update PartitionName=X QOS=name``) holds every job
    of the partition to its per-job limits, whatever the job's QOS (here "normal", with
    none).  A QOS of this test's own (the version's slurmdbd is shared by its instances)."""
    alice, bob = two_users
    part = clean_queue.partitions[-1]  # "shared": the default stays as it is
    qos = f"se-{clean_queue.cluster_name}-part2"
    clean_queue.run("sacctmgr", "-i", "add", "qos", qos, "MaxTRESPerJob=node=2")
    try:
        deadline = time.monotonic() + 30  # slurmctld learns the new QOS from slurmdbd
        while clean_queue.run(
            "scontrol", "update", f"PartitionName={part}", f"QOS={qos}", check=False
        ).returncode:
            if time.monotonic() > deadline:
                pytest.fail(f"scontrol update PartitionName={part} QOS={qos} still refused")
            time.sleep(0.5)
        assert CliBackend().read_partitions()[-1].qos == qos
        bounded_to_two(alice, bob, tmp_path, "-p", part)
    finally:
        clean_queue.run("scancel", "-u", alice.name, check=False)
        clean_queue.run("scancel", "-u", bob.name, check=False)
        clean_queue.run("scontrol", "update", f"PartitionName={part}", "QOS=", check=False)
        clean_queue.run("sacctmgr", "-i", "delete", "qos", qos, check=False)


def test_association_node_limit_bounds_growth_by_companions(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """An association's MaxNodes (``sacctmgr modify user ... set MaxNodes=2``) holds each
    job of that user to it; only this cluster's association (slurmdbd serves every
    instance of the version, and another instance's se-alice keeps no limit)."""
    alice, bob = two_users
    where = ("where", f"cluster={clean_queue.cluster_name}", f"name={alice.name}")
    clean_queue.run("sacctmgr", "-i", "modify", "user", *where, "set", "MaxNodes=2")
    try:
        bounded_to_two(alice, bob, tmp_path)
    finally:
        clean_queue.run("scancel", "-u", alice.name, check=False)
        clean_queue.run("scancel", "-u", bob.name, check=False)
        clean_queue.run("sacctmgr", "-i", "modify", "user", *where, "set", "MaxNodes=-1",
                        check=False)  # fmt: skip
