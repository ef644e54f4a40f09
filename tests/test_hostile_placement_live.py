"""A user's partition list cannot steer root's placement (issue 17, users untrusted).

Slurm accepts ``sbatch -p shared,batch`` from a user who may not run in ``shared``
(AllowGroups) and only refuses the job there when it is scheduled; root's narrowing of the
pending job to ``shared`` would apply and strand it, pending for good (docs/design.md).  Here
``shared`` is made the more attractive partition -- its GPUs priced four times as fast
(``cluster.gpu_types``/``gpu_speeds``), with the policy choosing partitions
(``policy.placement: plan``) -- and closed to every group but root's and wheel's.
se-alice lists it first; se-bob submits to ``batch`` only.  The daemon (enforce mode, real
MIP) must plan se-alice's job in ``batch``, never narrow it to ``shared``, and start both
jobs; se-bob's job is planned as if se-alice's list named nothing unusual.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.errors import SlurmUnreachable
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import ActionKind
from tests.slurm_cluster import ClusterUser, SlurmCluster
from tests.test_daemon_live import (
    BLOCK,
    controller,
    cycle,
    jobs,
    keep_jobs_off,
    live_config,
    running,
    scontrol,
    wait_for,
)
from tests.test_daemon_live import live as live_fixture

pytestmark = pytest.mark.slurm
live = live_fixture  # a clean instance, the companion stand-in, reservations removed after

# The policy chooses partitions (``policy.placement: plan``): the mode that narrows jobs, and
# so the one a user's list could steer.
TYPED = {
    "cluster": {
        "gpu_types": {"shared": "a100", "batch": "t4"},
        "gpu_speeds": {"a100": 4.0, "t4": 1.0},
    },
    "policy": {"placement": "plan"},
}


@pytest.fixture
def shared_closed(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """``shared`` open to root and wheel only (a runtime update, undone by reconfigure)."""
    slurm_cluster.run("scontrol", "update", "PartitionName=shared", "AllowGroups=root,wheel")
    try:
        yield
    finally:
        slurm_cluster.run("scontrol", "reconfigure")
        cli = CliBackend()

        def reopened() -> bool:
            try:
                return all(p.allow_groups is None for p in cli.read_partitions())
            except SlurmUnreachable:  # 24.11 on: reconfigure restarts slurmctld
                return False

        wait_for(reopened, timeout_s=30)


def test_a_partition_the_user_may_not_use_is_never_planned_for_their_job(
    live: Path,
    shared_closed: None,
    two_users: tuple[ClusterUser, ClusterUser],
) -> None:
    alice, bob = two_users
    keep_jobs_off(tuple(n.name for n in CliBackend().read_nodes()))
    common = ("-N1-2", "--comment=elastic", "--wrap", "sleep 600")
    listed = alice.sbatch("-p", "shared,batch", *common)  # accepted: batch is hers
    plain = bob.sbatch("-p", "batch", *common)
    ctl, _ = controller(live_config(live / "state", live / "fake-agent", **TYPED))
    result = cycle(ctl)
    assert result.plan is not None
    decisions = {d.job_id: d for d in result.plan.decisions}
    # Planned in batch, the only partition of her list she may use: no placement among
    # partitions is left to choose, so no partition is named.
    assert decisions[listed].partition is None and decisions[listed].target_nodes >= 1
    assert decisions[plain].target_nodes >= 1
    assert decisions[listed].target_nodes + decisions[plain].target_nodes <= 4
    for job in (listed, plain):
        for entry in ctl.journal.actions_for(job):
            assert entry.kind is ActionKind.START_AT_SIZE
            assert dict(entry.action.extra).get("partition") in (None, "batch")
    assert jobs()[listed].partition == "shared,batch"  # her list as she wrote it
    scontrol("delete", f"ReservationName={BLOCK}")
    started = wait_for(lambda: running(listed), timeout_s=40)
    assert started.partition == "batch"
    assert started.node_count == decisions[listed].target_nodes
    assert wait_for(lambda: running(plain), timeout_s=40).partition == "batch"
