"""daemon.visibility: each reader sees of the status document what Slurm's PrivateData lets
them see (issue 38, class 2).  The document is a real one, from a controller cycle."""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.daemon.visibility import ANYONE, Privacy, Viewer, visible
from tests.test_daemon_controller import make
from tests.test_daemon_controller_data import job, pending, snapshot

PRIVATE = Privacy.of(["jobs"], slurm_user="slurm", admins=["ops"])


def document() -> dict:
    """A status document's job parts: alice's running job (planned 2 -> 1), bob's pending
    one (pinned to 2)."""
    alice = job(8, nodes=("n1", "n2"), user="se-alice")
    bob = replace(pending(7), user="se-bob")
    ctl, _, _, _ = make(snapshot([alice, bob]), {8: 1, 7: 2}, mode="shadow", agents=(8,))
    wire = ctl.run_once(1000.0).to_json()
    wire["reclaims"] = [{"borrower": 8, "waiting_job": 7, "nodes": 1}]
    wire["nodes_on_loan"] = 3
    wire["gpu_types"] = {"batch": ""}
    return wire


def ids(doc: dict) -> dict[str, list[int]]:
    return {
        "jobs": sorted(r["job_id"] for r in doc["jobs"]),
        "decisions": sorted(d["job_id"] for d in doc["plan"]["decisions"]),
        "actions": sorted(a["job_id"] for a in doc["actions"]),
        "reclaims": sorted(r["borrower"] for r in doc["reclaims"]),
    }


def test_nothing_private_everyone_sees_everything() -> None:
    doc = document()
    assert visible(doc, ANYONE, Privacy.of([])) == doc
    assert visible(doc, ANYONE, Privacy.of(["accounts", "usage", "nodes"])) == doc


def test_private_jobs_a_user_sees_only_his_own() -> None:
    doc = document()
    bob = visible(doc, Viewer(1002, "se-bob"), PRIVATE)
    assert ids(bob) == {"jobs": [7], "decisions": [7], "actions": [7], "reclaims": []}
    assert bob["nodes_on_loan"] == 0 and bob["plan"]["objective"] is None
    assert "se-alice" not in repr(bob)
    alice = visible(doc, Viewer(1001, "se-alice"), PRIVATE)
    assert ids(alice) == {"jobs": [8], "decisions": [8], "actions": [8], "reclaims": []}
    assert ids(doc)["jobs"] == [7, 8]  # the document itself is untouched


def test_private_jobs_anyone_sees_no_job_root_and_operators_see_all() -> None:
    doc = document()
    anyone = visible(doc, ANYONE, PRIVATE)
    assert ids(anyone) == {"jobs": [], "decisions": [], "actions": [], "reclaims": []}
    assert anyone["ok"] == doc["ok"] and anyone["mode"] == doc["mode"]
    for who in (Viewer(0, "root"), Viewer(64030, "slurm"), Viewer(1003, "ops")):
        assert visible(doc, who, PRIVATE) == doc, who


def test_an_unknown_privacy_is_as_private_as_can_be() -> None:
    doc = document()
    assert ids(visible(doc, ANYONE, Privacy.unknown()))["jobs"] == []
    assert "gpu_types" not in visible(doc, ANYONE, Privacy.unknown())


def test_private_partitions_hide_the_partitions_gpu_types() -> None:
    doc = document()
    shown = visible(doc, Viewer(1002, "se-bob"), Privacy.of(["partitions"]))
    assert "gpu_types" not in shown and ids(shown)["jobs"] == [7, 8]
