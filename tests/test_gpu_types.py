"""GPU types (issue 17 item 1): each node's from its gres, each partition's from its nodes.

The parser (``convert.gres_gpu_type``) on Slurm's gres forms and on garbage; every backend's
node read on fixtures captured from real clusters of every version with typed GPUs
(``tests/fixtures/slurm/<version>/gputypes/``, ``CAPTURED.md`` there, made by
``scripts/capture_gputype_fixtures.sh``) and on the untyped fixtures of the scripted scenario;
and ``cluster_state.partition_gpu_types``'s rules, with the ``cluster.gpu_types`` override.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurm_elastic.cluster_state import partition_gpu_types
from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.pyslurm_backend import _joined, node_view
from slurm_elastic.types import MIXED_GPU_TYPE, ClusterSnapshot, NodeView, PartitionView

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
# The JSON generations each version's node read was captured in (gputypes/CAPTURED.md).
GENERATIONS = {
    "22.05": ("0.0.38",),
    "24.11": ("0.0.40", "0.0.41", "0.0.42"),
    "26.05": ("0.0.42", "0.0.43", "0.0.44", "0.0.45"),
}
ALL = [(v, g) for v, gens in GENERATIONS.items() for g in gens]
# cluster.sh up --gpu-types a100:2,t4:2, at the captured moment: n1 allocated (4 GPUs in
# use), n3 mixed (2), n4 drained.
TYPES = {"n1": "a100", "n2": "a100", "n3": "t4", "n4": "t4"}
ALLOC_GPUS = {"n1": 4, "n2": 0, "n3": 2, "n4": 0}


def typed_nodes(version: str, generation: str) -> tuple[NodeView, ...]:
    """The CLI backend's node read of the typed cluster (sinfo on 22.05, scontrol after)."""
    name = "sinfo" if version == "22.05" else "scontrol-nodes"
    text = (FIXTURES / version / "gputypes" / f"{name}.{generation}.json").read_text()
    return parse_json.nodes(text, name)


def typed_partitions(version: str) -> tuple[PartitionView, ...]:
    text = (FIXTURES / version / "gputypes" / "scontrol-o-show-partition.txt").read_text()
    return parse_text.parse_scontrol_partitions(text)


def snapshot(nodes: tuple[NodeView, ...], partitions: tuple[PartitionView, ...]) -> ClusterSnapshot:
    return ClusterSnapshot(taken_at=0.0, jobs=(), nodes=nodes, partitions=partitions)


# --------------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:a100:4", "a100"),
        ("gpu:A100:2(S:0)", "a100"),  # read in lower case
        ("gpu:a100:4(IDX:0-3),mps:100", "a100"),  # other gres are not GPUs
        ("gpu:a100:2(IDX:0,2)", "a100"),  # a comma inside the suffix
        ("gpu:nvidia_a100_3g.20gb:1", "nvidia_a100_3g.20gb"),  # AutoDetect's MIG names
        ("gpu:a100", "a100"),  # no count: one GPU
        ("gres:gpu:t4:1", "t4"),  # 22.05's TRES-per-node form
        ("gres/gpu:t4:1", "t4"),  # 24.11+
        ("gpu:4", ""),  # untyped
        ("gpu:4(IDX:0-3)", ""),
        ("gpu:(null):4(IDX:0-3)", ""),  # Slurm's spelling of "no type"
        ("gpu", ""),
        ("", ""),
        ("(null)", ""),
        (None, ""),
        ("mps:100,shard:8", ""),  # no GPUs
        ("gpu:a100:0,gpu:t4:2", "t4"),  # a type with no GPUs is not there
        ("gpu:a100:2,gpu:t4:2", MIXED_GPU_TYPE),
        ("gpu:a100:2,gpu:2", MIXED_GPU_TYPE),  # typed beside untyped: unknown mix
        ("gpu:a100:2,gpu:A100:2", "a100"),  # one type, however spelt
    ],
)
def test_gres_gpu_type_forms(gres: str | None, expected: str) -> None:
    assert cv.gres_gpu_type(gres, "g") == expected


@pytest.mark.parametrize(
    "garbage",
    [
        "gpu:a100:x",  # count not a number
        "gpu:a:b:2",  # one field too many
        "gpu::4",  # empty type
        "gpu:",
        "gpu:a 100:2",  # a space in the type
        "gpu:a(b:2",
        "gpu:a100:2(S:0",  # unbalanced: the suffix is not one
        {"gpu": 4},
        ["gpu:4"],  # lists are pyslurm's, joined by its backend first (_joined)
    ],
)
def test_gres_gpu_type_refuses_garbage_by_name(garbage: object) -> None:
    """The neighbours' error: one-line SlurmParseError naming where, never a ValueError."""
    with pytest.raises(SlurmParseError, match=r"^sinfo --json: node n1: gres: ") as info:
        cv.gres_gpu_type(garbage, "sinfo --json: node n1: gres")
    assert "\n" not in str(info.value)


def test_pyslurm_comma_split_gres_is_joined_before_parsing() -> None:
    """pyslurm splits gres at every comma, inside the IDX suffix too."""
    split = ["gpu:a100:2(IDX:0", "2)", "mps:100"]
    assert cv.gres_gpu_type(_joined(split, "g"), "g") == "a100"
    assert cv.gres_gpus(_joined(split, "g"), "g") == 2
    record = {"name": "n9", "state": "IDLE", "cpus": 4, "gres": split, "gres_used": []}
    assert node_view(record).gpu_type == "a100"
    with pytest.raises(SlurmParseError, match=r"^pyslurm node n9: gres: bad GPU"):
        node_view({**record, "gres": ["gpu:a:b:1"]})


# --------------------------------------------------------------------------- real clusters


@pytest.mark.parametrize(("version", "generation"), ALL)
def test_typed_gres_of_every_version_and_generation(version: str, generation: str) -> None:
    nodes = {n.name: n for n in typed_nodes(version, generation)}
    assert {name: n.gpu_type for name, n in nodes.items()} == TYPES
    assert {name: n.alloc_gpus for name, n in nodes.items()} == ALLOC_GPUS
    assert all(n.gpus == 4 for n in nodes.values())
    assert not nodes["n4"].is_usable and nodes["n3"].state == "mixed"


@pytest.mark.parametrize(("version", "generation"), ALL)
def test_partition_types_of_every_version(version: str, generation: str) -> None:
    """Each type's own partition has its type, even with one of its nodes drained (n4);
    batch and shared span both types."""
    snap = snapshot(typed_nodes(version, generation), typed_partitions(version))
    expected = {"batch": MIXED_GPU_TYPE, "shared": MIXED_GPU_TYPE, "a100": "a100", "t4": "t4"}
    assert partition_gpu_types(snap) == expected


def test_pyslurm_reads_the_types_the_cli_reads() -> None:
    """pyslurm 22.5's node().get() of the same moment (22.05/gputypes/CAPTURED.md): the
    views equal sinfo --json's, types included."""
    raw = json.loads((FIXTURES / "22.05" / "gputypes" / "pyslurm-nodes.json").read_text())
    ours = tuple(sorted((node_view(r) for r in raw.values()), key=lambda n: n.name))
    assert ours == tuple(sorted(typed_nodes("22.05", "0.0.38"), key=lambda n: n.name))
    assert {n.name: n.gpu_type for n in ours} == TYPES


@pytest.mark.parametrize(("version", "generation"), ALL)
def test_untyped_clusters_read_no_type(version: str, generation: str) -> None:
    """The scripted scenario's clusters (Gres=gpu:4): no node and no partition has a type."""
    name = "sinfo" if version == "22.05" else "scontrol-nodes"
    text = (FIXTURES / version / f"{name}-pending.{generation}.json").read_text()
    nodes = parse_json.nodes(text, name)
    partitions = parse_text.parse_scontrol_partitions(
        (FIXTURES / version / "scontrol-o-show-partition.txt").read_text()
    )
    assert nodes and all(n.gpus == 4 and n.gpu_type == "" for n in nodes)
    assert set(partition_gpu_types(snapshot(nodes, partitions)).values()) == {""}


# --------------------------------------------------------------------------- partition rules


def node(name: str, gpu_type: str, *, gpus: int = 4, state: str = "idle") -> NodeView:
    return NodeView(name, state, (), 4, 0, gpus, 0, (), gpu_type=gpu_type)


def part(name: str, *nodes: str, state: str = "UP") -> PartitionView:
    return PartitionView(name, nodes, is_default=False, exclusive=True, state=state)


def test_partition_rules() -> None:
    nodes = (
        node("a1", "a100"),
        node("a2", "a100"),
        node("u1", ""),
        node("c1", "", gpus=0),  # CPU only
        node("m1", MIXED_GPU_TYPE),
        node("t1", "t4"),
        node("t2", "v100", state="down"),
    )
    partitions = (
        part("a100", "a1", "a2", "c1"),  # CPU-only nodes do not count
        part("untyped", "u1"),
        part("cpu", "c1"),
        part("typed_and_untyped", "a1", "u1"),  # an untyped node's type is unknown
        part("two", "a1", "t1"),
        part("holds_mixed", "m1"),
        part("t4", "t1", "t2"),  # a down v100 does not make it mixed
        part("down_only", "t2"),  # nothing usable: nothing to say
        part("inactive", "a1", state="INACTIVE"),  # hardware, whatever the state
        part("ghost", "nosuch"),  # a member Slurm does not list as a node
    )
    assert partition_gpu_types(snapshot(nodes, partitions)) == {
        "a100": "a100",
        "untyped": "",
        "cpu": "",
        "typed_and_untyped": MIXED_GPU_TYPE,
        "two": MIXED_GPU_TYPE,
        "holds_mixed": MIXED_GPU_TYPE,
        "t4": "t4",
        "down_only": "",
        "inactive": "a100",
        "ghost": "",
    }


def test_configured_types_decide_for_their_partitions() -> None:
    """cluster.gpu_types: supplies the type of an untyped partition, settles a mixed one,
    overrides a typed one; a partition Slurm does not list is not invented."""
    nodes = (node("u1", ""), node("a1", "a100"), node("t1", "t4"))
    partitions = (part("old", "u1"), part("both", "a1", "t1"), part("a100", "a1"), part("t4", "t1"))
    configured = {"old": "v100", "both": "a100", "t4": "t4x", "gone": "k80"}
    assert partition_gpu_types(snapshot(nodes, partitions), configured) == {
        "old": "v100",
        "both": "a100",
        "a100": "a100",
        "t4": "t4x",
    }


def test_node_view_default_is_untyped() -> None:
    """Every NodeView built without a type (simulator, fakes) is untyped, never "mixed"."""
    assert NodeView("n", "idle", (), 4, 0, 4, 0, ()).gpu_type == ""
    assert "gpu_type" in {f.name for f in dataclasses.fields(NodeView)}
