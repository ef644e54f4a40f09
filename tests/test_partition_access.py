"""Who may use a partition, read from real Slurm (issue 17: placement by partition).

Fixtures: ``tests/fixtures/slurm/access/scontrol-o-show-partition-<V>.txt``, the output of
``scontrol -o show partition`` on local clusters of each version started with
``cluster.sh up --instance 7 --conf "PartitionName=private Nodes=n[1-2]
AllowGroups=root,wheel AllowQos=normal State=UP" --conf "PartitionName=open Nodes=n[3-4]
DenyAccounts=guest DenyQos=low State=UP"`` (2026-11-27; 26.05 refuses a DenyQos naming no
QOS, ``fatal: Partition open has an invalid DenyQOS (low)``, so it was given ``normal``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.cluster_state import may_use
from slurm_elastic.slurm.parse_text import parse_scontrol_partitions
from slurm_elastic.types import PartitionView
from tests.test_daemon_controller_data import pending

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "access"
DENIED_QOS = {"22.05": "low", "24.11": "low", "26.05": "normal"}


def _partitions(version: str) -> dict[str, PartitionView]:
    text = (FIXTURES / f"scontrol-o-show-partition-{version}.txt").read_text()
    return {p.name: p for p in parse_scontrol_partitions(text)}


@pytest.mark.parametrize("version", sorted(DENIED_QOS))
def test_allow_and_deny_lists_read_on_every_version(version: str) -> None:
    parts = _partitions(version)
    assert (parts["batch"].allow_groups, parts["batch"].allow_accounts) == (None, None)
    assert (parts["batch"].allow_qos, parts["batch"].deny_accounts) == (None, ())
    private = parts["private"]
    assert private.allow_groups == ("root", "wheel") and private.allow_qos == ("normal",)
    assert private.allow_accounts is None and private.deny_qos == ()
    open_ = parts["open"]
    assert open_.allow_groups is None and open_.allow_accounts is None
    assert open_.deny_accounts == ("guest",) and open_.deny_qos == (DENIED_QOS[version],)


def test_may_use_follows_every_list() -> None:
    parts = _partitions("22.05")
    job = replace(pending(1), account="research", qos="normal")
    assert may_use(job, parts["batch"], groups=("se-alice",))
    assert not may_use(job, parts["private"], groups=("se-alice",))  # AllowGroups
    assert may_use(job, parts["private"], groups=("se-alice", "wheel"))
    assert not may_use(replace(job, qos="high"), parts["private"], groups=("wheel",))  # AllowQos
    assert may_use(job, parts["open"], groups=())
    assert not may_use(replace(job, account="guest"), parts["open"], groups=())  # DenyAccounts
    assert not may_use(replace(job, qos="low"), parts["open"], groups=())  # DenyQos
    only_research = replace(parts["batch"], allow_accounts=("research",))
    assert may_use(job, only_research, groups=())
    assert not may_use(replace(job, account="other"), only_research, groups=())  # AllowAccounts
