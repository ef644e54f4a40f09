"""Who may use a partition, read from real Slurm (issue 17: placement by partition).

Fixtures in ``tests/fixtures/slurm/access/``:

* ``scontrol-o-show-partition-<V>.txt``, the output of ``scontrol -o show partition`` on
  local clusters of each version started with ``cluster.sh up --instance 7 --conf
  "PartitionName=private Nodes=n[1-2] AllowGroups=root,wheel AllowQos=normal State=UP"
  --conf "PartitionName=open Nodes=n[3-4] DenyAccounts=guest DenyQos=low State=UP"``
  (2026-11-27; 26.05 refuses a DenyQos naming no QOS, ``fatal: Partition open has an
  invalid DenyQOS (low)``, so it was given ``normal``).
* ``pyslurm-partitions-<V>.json`` for 22.05 and 24.11: pyslurm's partitions on clusters
  started the same way on instance 6 (2026-11-27), each beside a ``scontrol -o show
  partition`` of the same moment that was byte for byte the ``.txt`` above.  22.05:
  ``pyslurm.partition().get()`` (pyslurm 22.5.3, ``PYTHONPATH=
  /var/lib/slurm-elastic/pyslurm/22.05``), each record cut to the keys
  ``name nodes flags max_time state max_nodes qos_char allow_groups allow_accounts
  allow_qos deny_accounts deny_qos``.  24.11: inside the root (``cluster.sh exec --slurm
  24.11 --instance 6 -- python3 ...``, pyslurm 24.11.0), the attributes ``name nodes
  is_default oversubscribe max_time state max_nodes qos allowed_groups allowed_accounts
  allowed_qos denied_accounts denied_qos`` of every ``pyslurm.Partitions.load()`` object.
  Both stored with ``json.dumps(..., indent=1, sort_keys=True)``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_elastic.cluster_state import may_use
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm.parse_text import parse_scontrol_partitions
from slurm_elastic.slurm.pyslurm_backend import deny_qos_lost, partition_record, partition_view
from slurm_elastic.types import PartitionView
from tests.test_daemon_controller_data import pending

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "access"
DENIED_QOS = {"22.05": "low", "24.11": "low", "26.05": "normal"}


def _scontrol(version: str) -> tuple[PartitionView, ...]:
    return parse_scontrol_partitions(
        (FIXTURES / f"scontrol-o-show-partition-{version}.txt").read_text(encoding="utf-8")
    )


def _partitions(version: str) -> dict[str, PartitionView]:
    return {p.name: p for p in _scontrol(version)}


def _pyslurm(version: str) -> Any:
    return json.loads((FIXTURES / f"pyslurm-partitions-{version}.json").read_text("utf-8"))


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


def test_pyslurm_24_access_lists_equal_scontrol() -> None:
    """pyslurm 24.11 reads an unset Deny list as ["ALL"]; the views still equal scontrol's."""
    attrs = _pyslurm("24.11")
    assert {tuple(a["denied_accounts"]) for a in attrs if a["name"] != "open"} == {("ALL",)}
    views = tuple(partition_view(partition_record(SimpleNamespace(**a))) for a in attrs)
    assert views == _scontrol("24.11")


def test_pyslurm_24_ignores_a_deny_list_beside_an_allow_list_as_scontrol_does() -> None:
    (batch,) = (a for a in _pyslurm("24.11") if a["name"] == "batch")
    both = dict(batch, allowed_qos=["normal"], denied_qos=["low"], denied_accounts=["guest"])
    view = partition_view(partition_record(SimpleNamespace(**both)))
    assert (view.allow_qos, view.deny_qos, view.deny_accounts) == (("normal",), (), ("guest",))


def test_pyslurm_22_loses_deny_qos_and_says_so() -> None:
    """pyslurm 22.5 fills deny_qos from the unset AllowQos: [] where DenyQos=low is set.
    ``deny_qos_lost`` flags exactly that record (the backend then reads scontrol)."""
    records = _pyslurm("22.05")
    assert records["open"]["deny_qos"] == [] and records["open"]["allow_qos"] is None
    assert [name for name, r in records.items() if deny_qos_lost(r)] == ["open"]
    ours = {name: partition_view(r) for name, r in records.items()}
    cli = _partitions("22.05")
    assert ours["open"] == replace(cli["open"], deny_qos=())
    assert all(ours[name] == cli[name] for name in ("batch", "shared", "private"))


@pytest.mark.parametrize(
    ("value", "names", "allowed"),
    [
        ("ALL", ("ALL",), None),
        ("all", ("all",), None),
        (None, (), None),
        ("", (), None),
        ("(null)", (), None),
        ("root,wheel", ("root", "wheel"), ("root", "wheel")),
        (["root", " wheel "], ("root", "wheel"), ("root", "wheel")),
        (["ALL"], ("ALL",), None),
        ("ALL,wheel", ("ALL", "wheel"), ("ALL", "wheel")),
    ],
)
def test_name_lists(value: Any, names: tuple[str, ...], allowed: tuple[str, ...] | None) -> None:
    assert cv.names(value, "here") == names
    assert cv.allow_list(value, "here") == allowed


def test_may_use_follows_every_list() -> None:
    parts = _partitions("22.05")
    job = replace(pending(1), user="se-alice", user_id=1001, account="research", qos="normal")
    assert may_use(job, parts["batch"], groups=("se-alice",))
    assert not may_use(job, parts["private"], groups=("se-alice",))  # AllowGroups
    assert may_use(job, parts["private"], groups=("se-alice", "wheel"))
    assert not may_use(replace(job, qos="high"), parts["private"], groups=("wheel",))  # AllowQos
    assert not may_use(replace(job, qos=""), parts["private"], groups=("wheel",))  # no QOS
    assert may_use(job, parts["open"], groups=())
    assert not may_use(replace(job, account="guest"), parts["open"], groups=())  # DenyAccounts
    assert not may_use(replace(job, qos="low"), parts["open"], groups=())  # DenyQos
    assert not may_use(replace(job, qos="LOW"), parts["open"], groups=())  # lower case
    only_research = replace(parts["batch"], allow_accounts=("research",))
    assert may_use(job, only_research, groups=())
    assert not may_use(replace(job, account="other"), only_research, groups=())  # AllowAccounts
    assert not may_use(replace(job, account=""), only_research, groups=())  # no account


def test_root_and_slurm_user_pass_allow_groups_only() -> None:
    """validate_group lets root and SlurmUser anywhere; the QOS and account lists bind them
    too (a root job with an unlisted QOS stayed pending on 22.05 and 24.11)."""
    private = _partitions("24.11")["private"]
    root = replace(pending(1), user="root", user_id=0, qos="normal")
    assert may_use(root, private, groups=())
    assert not may_use(replace(root, qos="high"), private, groups=())
    slurm = replace(root, user="slurm", user_id=64030)
    assert not may_use(slurm, private, groups=())
    assert may_use(slurm, private, groups=(), slurm_user="slurm")
    nobody = replace(root, user="", user_id=None)
    assert not may_use(nobody, private, groups=())  # no SlurmUser given: "" is no one


def test_an_allow_list_overrides_its_deny_list() -> None:
    """Slurm enforces a Deny list only while its kind's Allow list is unset."""
    job = replace(pending(1), user="se-alice", user_id=1001, account="guest", qos="low")
    both = replace(
        _partitions("22.05")["batch"],
        allow_accounts=("guest",),
        deny_accounts=("guest",),
        allow_qos=("low",),
        deny_qos=("low",),
    )
    assert may_use(job, both, groups=())


def test_sub_accounts_of_a_listed_account() -> None:
    """From 24.11 on AllowAccounts/DenyAccounts cover sub-accounts: the caller passes the
    account's ancestors."""
    batch = _partitions("24.11")["batch"]
    job = replace(pending(1), user="se-alice", user_id=1001, account="physics-lab")
    allow = replace(batch, allow_accounts=("physics",))
    assert not may_use(job, allow, groups=())
    assert may_use(job, allow, groups=(), parent_accounts=("physics", "root"))
    deny = replace(batch, deny_accounts=("physics",))
    assert may_use(job, deny, groups=())
    assert not may_use(job, deny, groups=(), parent_accounts=("physics", "root"))
