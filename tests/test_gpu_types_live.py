"""GPU types on real Slurm (issue 17 item 1): a cluster with two GPU generations.

The test's instance is restarted with ``cluster.sh up --gpu-types a100:2,t4:2`` (n1-n2
``gpu:a100:4`` in partition ``a100``, n3-n4 ``gpu:t4:4`` in partition ``t4``; ``batch`` and
``shared`` as always) through ``tests.slurm_cluster.configured``, and put back as the session
had it afterwards, so each leg of the matrix (22.05, 24.11, 26.05) runs it on its own
cluster without any option of its own.  What is read: the CLI backend's snapshot (the node
read of the version: ``sinfo --json`` on 22.05, ``scontrol --json show nodes`` after) and,
where the matrix has pyslurm on the host (22.05), the pyslurm backend's; the 24.11 pyslurm
leg runs inside the version's root, where cluster.sh cannot restart the instance, so there
the typed gres reach pyslurm's parser only through the fixtures (tests/test_gpu_types.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from slurm_elastic.cluster_state import partition_gpu_types
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend
from slurm_elastic.types import MIXED_GPU_TYPE, ActionKind
from tests.slurm_cluster import SlurmCluster, configured, site_settings
from tests.test_daemon_live import (  # noqa: F401  (live: a fixture)
    BLOCK,
    controller,
    cycle,
    ending,
    jobs,
    keep_jobs_off,
    live,
    live_config,
    running,
    sbatch,
    scontrol,
    wait_for,
)

pytestmark = pytest.mark.slurm

GPU_TYPES = "a100:2,t4:2"
NODE_TYPES = {"n1": "a100", "n2": "a100", "n3": "t4", "n4": "t4"}
PARTITION_TYPES = {"batch": MIXED_GPU_TYPE, "shared": MIXED_GPU_TYPE, "a100": "a100", "t4": "t4"}


@pytest.fixture(scope="module")
def typed_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's instance with typed GPUs, for this module's tests (one restart each way)."""
    if len(slurm_cluster.nodes) != 4:  # SLURM_ELASTIC_TEST_NODES; the matrix runs 4
        pytest.skip(f"--gpu-types {GPU_TYPES} is for 4 nodes, not {len(slurm_cluster.nodes)}")
    settings = [f"{key}={value}" for key, value in site_settings().items()]
    with configured(slurm_cluster, settings, gpu_types=GPU_TYPES) as cluster:
        yield cluster


def test_cli_snapshot_has_each_node_and_partition_type(typed_cluster: SlurmCluster) -> None:
    snapshot = CliBackend(slurm_conf=str(typed_cluster.conf), timeout_s=20).read_cluster()
    assert {n.name: n.gpu_type for n in snapshot.nodes} == NODE_TYPES
    assert all(n.gpus == 4 and n.is_usable for n in snapshot.nodes)
    assert partition_gpu_types(snapshot) == PARTITION_TYPES
    # A job on one type's partition holds that type's GPUs, and the types stay put.
    job = typed_cluster.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "t4", "-N1", "--gres=gpu:t4:1",
        "--wrap", "sleep 60",
    ).stdout.strip()  # fmt: skip
    try:
        out = typed_cluster.run("squeue", "-h", "-j", job, "-o", "%P|%b").stdout.strip()
        assert out.startswith("t4|") and "t4" in out
    finally:
        typed_cluster.run("scancel", job, check=False)


def test_pyslurm_reads_the_same_types(
    typed_cluster: SlurmCluster, pyslurm_module: ModuleType
) -> None:
    conf = str(typed_cluster.conf)
    cli = CliBackend(slurm_conf=conf, timeout_s=20).read_nodes()
    ours = PyslurmBackend(pyslurm_module, slurm_conf=conf, timeout_s=20).read_nodes()
    assert {n.name: n.gpu_type for n in ours} == NODE_TYPES
    assert {n.name: (n.gpus, n.gpu_type) for n in ours} == {
        n.name: (n.gpus, n.gpu_type) for n in cli
    }


def _partition_of(job_id: int) -> str:
    view = jobs()[job_id]
    return view.partition


def test_a_pending_job_starts_in_the_partition_and_size_the_plan_chose(
    typed_cluster: SlurmCluster,
    live: Path,  # noqa: F811
) -> None:
    """Issue 17's live test.  A job submitted to ``t4,a100`` (t4 first) while both are free:
    with a100 GPUs priced twice as fast, the MIP places it in a100 at 2 nodes, the daemon
    narrows it there (``Partition=a100 NumNodes=2-2``) and Slurm starts it on the a100
    nodes.  A second job of ``a100,t4`` then finds a100 full and is placed in t4; when a100
    frees up, it stays in t4: a running job is never moved between partitions."""
    everything = tuple(n.name for n in CliBackend().read_nodes())
    keep_jobs_off(everything)  # Slurm must not start them before the daemon places them
    first = sbatch("-p", "t4,a100", "-N1-2", "--comment=elastic", "--wrap", "sleep 600", cwd=live)
    config = live_config(
        live / "state",
        live / "fake-agent",
        cluster={"gpu_speeds": {"a100": 2.0, "t4": 1.0}},
        policy={"placement": "plan"},
    )
    ctl, _ = controller(config)
    result = cycle(ctl)
    assert result.gpu_types["a100"] == "a100" and result.gpu_types["t4"] == "t4"
    assert result.plan is not None
    decision = {d.job_id: d for d in result.plan.decisions}[first]
    assert (decision.partition, decision.target_nodes) == ("a100", 2)
    view = jobs()[first]
    assert view.is_pending and view.partition == "a100"
    assert (view.min_nodes, view.max_nodes) == (2, 2)
    (entry,) = ctl.journal.actions_for(first)
    assert entry.kind is ActionKind.START_AT_SIZE
    scontrol("delete", f"ReservationName={BLOCK}")
    started = wait_for(lambda: running(first), timeout_s=40)
    assert started.partition == "a100" and set(started.nodes) == {"n1", "n2"}

    second = sbatch("-p", "a100,t4", "-N1-2", "--comment=elastic", "--wrap", "sleep 600", cwd=live)
    cycle(ctl)
    placed = wait_for(lambda: running(second), timeout_s=40)
    assert placed.partition == "t4" and set(placed.nodes) <= {"n3", "n4"}
    subprocess.run(["scancel", str(first)], check=True, timeout=30)
    wait_for(lambda: ending(first), timeout_s=30)
    for _ in range(3):
        cycle(ctl)
        assert _partition_of(second) == "t4"
    assert all(
        dict(e.action.extra).get("partition") in (None, "t4")
        for e in ctl.journal.actions_for(second)
    )
