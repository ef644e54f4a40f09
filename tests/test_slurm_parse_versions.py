"""Parsers on the fixtures of every Slurm version in the matrix (22.05, 24.11, 26.05).

Each version's fixtures were captured from a real local cluster of that version; how, and
what each file holds, is in ``tests/fixtures/slurm/<version>/CAPTURED.md``.  The three
versions share one scenario (``scripts/capture_fixtures.sh``: run4, pend4, range24,
shared24, het1, requeue1, held23, dep1, done1 with the same job ids), so every version
and every JSON generation is held to the same expectations below, and the text paths
(``squeue -O``, ``scontrol -o show job``, ``sacct -P``) to the JSON of the same moment.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.errors import SlurmParseError, SlurmUnreachable
from slurm_elastic.slurm import convert as cv
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.parse_text import parse_scontrol_partitions
from slurm_elastic.types import JobHistory, JobState, JobView, NodeView, PartitionView

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")
SEP = parse_text.CAPTURE_SEPARATOR  # the text fixtures' separator (CAPTURED.md)
# The JSON generations each version writes (``--json=v0.0.NN``); a plain --json gives the last.
GENERATIONS = {
    "22.05": ("0.0.38",),
    "24.11": ("0.0.40", "0.0.41", "0.0.42"),
    "26.05": ("0.0.42", "0.0.43", "0.0.44", "0.0.45"),
}
DEFAULT = {version: gens[-1] for version, gens in GENERATIONS.items()}
ALL_GENERATIONS = [(v, g) for v, gens in GENERATIONS.items() for g in gens]
MOMENTS = ("pending", "resized", "drained")  # captured in every generation; "het" in the default
# Job ids of the scripted scenario (the same on every version: a fresh cluster each time).
RUN4, PEND4, RANGE24, SHARED24, HET1, HET1_1, REQUEUE1, HELD23, DEP1, NL1, DONE1 = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
)  # fmt: skip
COMMENT = "free text JobState=FAKE | pipe"


def read(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


def by_id(views: tuple[Any, ...]) -> dict[int, Any]:
    return {v.job_id: v for v in views}


def squeue(version: str, moment: str, generation: str) -> dict[int, JobView]:
    return by_id(parse_json.squeue(read(version, f"squeue-{moment}.{generation}.json")))


def nodes(version: str, moment: str, generation: str) -> dict[str, NodeView]:
    """The daemon's node read: sinfo --json on 22.05, scontrol --json show nodes after."""
    name = "sinfo" if version == "22.05" else "scontrol-nodes"
    views = parse_json.nodes(read(version, f"{name}-{moment}.{generation}.json"), name)
    return {n.name: n for n in views}


# --------------------------------------------------------------------------- every file


def _parser(name: str) -> Callable[[str], tuple[Any, ...]] | None:
    """The parser of a fixture file, from its name (None: not a parser fixture)."""
    if name.endswith(".json"):
        if name.startswith("squeue"):
            return parse_json.squeue
        if name.startswith("scontrol-show-job"):
            return parse_json.scontrol_jobs
        if name.startswith("scontrol-nodes"):
            return parse_json.scontrol_nodes
        if name.startswith("sinfo"):
            return parse_json.sinfo
        if name.startswith("sacct"):
            return parse_json.sacct
    table: dict[str, Callable[[str], tuple[Any, ...]]] = {
        "squeue-O-": functools.partial(parse_text.parse_squeue_text, separator=SEP),
        "scontrol-o-show-job-": parse_text.parse_scontrol_jobs,
        "scontrol-o-show-partition": parse_text.parse_scontrol_partitions,
        "sacct-P": functools.partial(parse_text.parse_sacct_text, separator=SEP),
    }
    return next((p for prefix, p in table.items() if name.startswith(prefix)), None)


VIEW_TYPES = (JobView, NodeView, JobHistory, PartitionView)
ALL_FILES = sorted(
    (version, path.name)
    for version in VERSIONS
    for path in (FIXTURES / version).iterdir()
    if _parser(path.name) is not None
)


@pytest.mark.parametrize(("version", "name"), ALL_FILES)
def test_every_fixture_file_parses(version: str, name: str, utc: None) -> None:
    """Every parser fixture of every version and generation gives typed views, or the
    typed error its capture is known for (controller down; 24.11+'s grouped sinfo)."""
    parser = _parser(name)
    assert parser is not None
    text = read(version, name)
    if name.endswith("controller-down.json"):
        with pytest.raises(SlurmUnreachable):
            parser(text)
    elif name == "sacct-nothing-found.json":
        assert parser(text) == ()
    elif name.startswith("sinfo") and version != "22.05":
        with pytest.raises(SlurmParseError, match=r"^sinfo --json lists no nodes one by one"):
            parser(text)
    else:
        views = parser(text)
        assert views and all(isinstance(v, VIEW_TYPES) for v in views)


def test_every_generation_was_captured() -> None:
    for version, generation in ALL_GENERATIONS:
        for moment in MOMENTS:
            assert (FIXTURES / version / f"squeue-{moment}.{generation}.json").is_file()
        assert (FIXTURES / version / f"sacct.{generation}.json").is_file()
    assert len(ALL_FILES) > 120


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_generation_is_read_from_meta(version: str, generation: str) -> None:
    doc = json.loads(read(version, f"squeue-pending.{generation}.json"))
    expected = f"openapi/v{generation}" if version == "22.05" else f"data_parser/v{generation}"
    assert parse_json.plugin_type(doc, "squeue --json") == expected
    assert parse_json.slurm_release(doc, "squeue --json").startswith(f"{version}.")
    commands = parse_json.commands(doc, "squeue --json")
    if version == "22.05":  # sinfo lists nodes; scontrol has no --json
        assert commands == parse_json.Commands(nodes=("sinfo", "--json"), job=None)
    else:
        # Read with the version's pinned data_parser whatever generation the site's default.
        assert commands == parse_json.Commands(
            nodes=("scontrol", "--json", "show", "nodes"),
            job=("scontrol", "--json", "show", "job"),
            json=f"--json={parse_json.PINNED_PARSERS[version]}",
        )
        assert commands.named(commands.nodes)[1] == commands.json


@pytest.mark.parametrize("kind", ["openapi/v0.0.99", "data_parser/v0.0.39", ""])
def test_unknown_generation_is_one_line_naming_it(kind: str) -> None:
    doc = json.loads(read("24.11", "squeue-pending.0.0.42.json"))
    doc["meta"]["plugin"]["data_parser"] = kind
    with pytest.raises(SlurmParseError) as info:
        parse_json.squeue(doc)
    message = str(info.value)
    assert f"unsupported JSON generation {kind!r}" in message and "\n" not in message
    assert "data_parser/v0.0.45" in message  # says what is supported


# --------------------------------------------------------------------------- squeue --json


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_running_and_pending_jobs(version: str, generation: str) -> None:
    jobs = squeue(version, "pending", generation)
    assert set(jobs) == {RUN4, PEND4, RANGE24, SHARED24}
    run4 = jobs[RUN4]
    assert run4.state is JobState.RUNNING and run4.nodes == ("n1", "n2", "n3", "n4")
    assert (run4.node_count, run4.min_nodes, run4.max_nodes) == (4, 4, None)
    assert (run4.batch_host, run4.gpus_per_node, run4.user, run4.user_id) == ("n1", 4, "root", 0)
    assert run4.comment == "elastic:min=4,max=4"  # the test clusters' job_submit.lua writes it
    assert run4.time_limit_s is None and run4.end_time is None  # unlimited: no end
    assert run4.start_time is not None and run4.submit_time is not None
    assert run4.het_job_id is None and run4.het_job_offset is None
    assert (run4.partition, run4.account, run4.qos, run4.work_dir) == (
        "batch",
        "root",
        "normal",
        "/tmp",
    )
    pend4 = jobs[PEND4]
    assert pend4.state is JobState.PENDING and pend4.nodes == () and pend4.batch_host is None
    assert (pend4.node_count, pend4.min_nodes, pend4.max_nodes) == (4, 4, 4)
    assert (pend4.state_reason, pend4.comment) == ("Resources", "")  # "" in 24.11+, null before
    assert pend4.start_time is None and pend4.end_time is None  # the scheduler's guesses
    # priority/basic (22.05's clusters) counts down from 2^32 - 2^16 by submit order;
    # 24.11+ clusters run priority/multifactor with every weight 0: 1 for every job.
    if version == "22.05":
        assert (run4.priority, pend4.priority) == (4294901759, 4294901758)
    else:
        assert run4.priority == pend4.priority == 1


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_pending_range_takes_min_from_request_not_estimate(version: str, generation: str) -> None:
    """-N2-4 shows node_count 4 and max_nodes 4 once the scheduler looked at it, on every
    version; the requested minimum is node=2 in tres_req_str."""
    doc = json.loads(read(version, f"squeue-pending.{generation}.json"))
    raw = {j["job_id"]: j for j in doc["jobs"]}
    assert cv.number(raw[RANGE24]["node_count"], "node_count") == 4
    assert "node=2" in raw[RANGE24]["tres_req_str"]
    jobs = squeue(version, "pending", generation)
    range24, shared24 = jobs[RANGE24], jobs[SHARED24]
    assert (range24.node_count, range24.min_nodes, range24.max_nodes) == (2, 2, 4)
    assert (range24.comment, range24.time_limit_s) == (COMMENT, 1800.0)
    assert range24.state_reason == "Priority"
    assert (shared24.min_nodes, shared24.max_nodes, shared24.partition) == (2, 3, "shared")
    assert shared24.comment == "elastic:min=2,max=3"


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_resized_job_and_ended_jobs(version: str, generation: str) -> None:
    jobs = squeue(version, "resized", generation)
    run4, range24 = jobs[RUN4], jobs[RANGE24]
    assert run4.state is JobState.RUNNING and run4.nodes == ("n1", "n2")
    assert (run4.node_count, run4.min_nodes, run4.gpus_per_node) == (2, 2, 4)
    assert run4.resize_time is not None and run4.start_time is not None
    assert run4.resize_time >= run4.start_time
    assert range24.state is JobState.RUNNING and range24.nodes == ("n3", "n4")
    assert (range24.node_count, range24.max_nodes, range24.gpus_per_node) == (2, None, 4)
    assert range24.end_time is not None  # a 30-minute limit: a real end
    # -t all: 24.11+ list ended jobs only when asked, as 22.05 always did.
    assert jobs[PEND4].state is JobState.CANCELLED and jobs[SHARED24].state is JobState.CANCELLED


@pytest.mark.parametrize("version", VERSIONS)
def test_het_requeued_held_and_dependent_jobs(version: str) -> None:
    jobs = squeue(version, "het", DEFAULT[version])
    first, second = jobs[HET1], jobs[HET1_1]
    assert (first.het_job_id, first.het_job_offset) == (HET1, 0)
    assert (second.het_job_id, second.het_job_offset) == (HET1, 1)
    assert first.state is second.state is JobState.RUNNING
    assert len(first.nodes) == len(second.nodes) == 1 and first.nodes != second.nodes
    assert not jobs[REQUEUE1].is_het and jobs[RUN4].state is JobState.CANCELLED
    requeued = jobs[REQUEUE1]
    assert requeued.state is JobState.PENDING and requeued.restart_count == 1
    assert requeued.state_reason == "BeginTime"
    held = jobs[HELD23]
    assert (held.state_reason, held.min_nodes, held.max_nodes) == ("JobHeldUser", 2, 3)
    assert held.priority == 0  # what a hold does
    # A requeued job waits out a begin time: Slurm's eligible time, after its submission.
    assert requeued.eligible_time is not None and requeued.submit_time is not None
    assert requeued.eligible_time > requeued.submit_time
    assert jobs[HET1].eligible_time is None  # running: no longer means anything
    dependent = jobs[DEP1]
    assert dependent.state_reason == "Dependency"
    assert dependent.dependency == f"afterok:{HET1}(unfulfilled)"
    assert jobs[NL1].comment == "two\nlines" and jobs[NL1].state_reason == "JobHeldUser"


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_scontrol_json_show_job(version: str) -> None:
    """scontrol --json show job <het leader> (the backend's read_job from 24.11 on): both
    components, as squeue --json shows them."""
    jobs = by_id(
        parse_json.scontrol_jobs(read(version, f"scontrol-show-job-het1.{DEFAULT[version]}.json"))
    )
    assert set(jobs) == {HET1, HET1_1}
    het = squeue(version, "het", DEFAULT[version])
    assert jobs[HET1] == het[HET1] and jobs[HET1_1] == het[HET1_1]


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_generations_of_a_version_agree(version: str, generation: str) -> None:
    """v0.0.40 to v0.0.45 differ in fields the parsers do not read: the same views."""
    for moment in MOMENTS:
        assert squeue(version, moment, generation) == squeue(version, moment, DEFAULT[version])
        assert nodes(version, moment, generation) == nodes(version, moment, DEFAULT[version])
    assert parse_json.sacct(read(version, f"sacct.{generation}.json")) == parse_json.sacct(
        read(version, f"sacct.{DEFAULT[version]}.json")
    )


# --------------------------------------------------------------------------- nodes


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_drained_node(version: str, generation: str) -> None:
    found = nodes(version, "drained", generation)
    assert list(found) == ["n1", "n2", "n3", "n4"]
    n4 = found["n4"]
    assert (n4.state, n4.flags, n4.reason) == ("allocated", ("DRAIN",), "fixture drain")
    assert not n4.is_usable
    for node in ("n1", "n2", "n3"):
        assert found[node].state == "allocated" and found[node].flags == ()
        assert found[node].is_usable
    assert all(
        (n.cpus, n.alloc_cpus, n.gpus, n.alloc_gpus, n.partitions)
        == (4, 4, 4, 4, ("batch", "shared"))
        for n in found.values()
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_idle_and_mixed_nodes(version: str) -> None:
    """het1 holds one CPU of a shared node (mixed) and a whole batch node."""
    found = nodes(version, "het", DEFAULT[version])
    assert sorted(n.state for n in found.values()) == ["allocated", "idle", "idle", "mixed"]
    mixed = next(n for n in found.values() if n.state == "mixed")
    assert (mixed.alloc_cpus, mixed.alloc_gpus) == (1, 0)
    assert all(n.is_usable for n in found.values())


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("idle", ["DRAIN"], ("idle", ("DRAIN",))),  # v0.0.38
        (["IDLE", "DRAIN"], None, ("idle", ("DRAIN",))),  # v0.0.40+
        (["DRAIN", "ALLOCATED"], None, ("allocated", ("DRAIN",))),
        (["MIXED"], None, ("mixed", ())),
        (["DOWN", "NOT_RESPONDING"], None, ("down", ("NOT_RESPONDING",))),
        (["PLANNED"], None, ("unknown", ("PLANNED",))),
    ],
)
def test_node_state_forms(state: Any, flags: Any, expected: tuple[str, tuple[str, ...]]) -> None:
    assert cv.node_state(state, flags, "node") == expected


# --------------------------------------------------------------------------- sacct


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_sacct_records(version: str, generation: str) -> None:
    """The raw records: a resize leaves a RESIZING record (24.11+: ["PENDING",
    "RESIZING"]), a requeue a REQUEUED one (["PENDING", "REQUEUED"], with sacct -D)."""
    doc = json.loads(read(version, f"sacct.{generation}.json"))
    records = parse_json.generation(doc, "sacct").parse_sacct_records(doc)
    states: dict[int, list[JobState]] = {}
    for record in records:
        states.setdefault(record.job_id, []).append(record.state)
    assert sorted(states[RUN4]) == [JobState.CANCELLED, JobState.RESIZING]
    assert sorted(states[REQUEUE1]) == [JobState.CANCELLED, JobState.REQUEUED]
    assert states[DONE1] == [JobState.COMPLETED]


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_over_a_window_without_jobs_is_no_history(version: str) -> None:
    """22.05 answers an empty window with error 9003 ("Nothing found with query") and no
    jobs; 24.11+ with no jobs alone.  Both are no history, not an unreadable one."""
    text = read(version, "sacct-nothing-found.json")
    assert parse_json.sacct(text) == ()
    doc = json.loads(text)
    if version == "22.05":
        assert [e["error_number"] for e in doc["errors"]] == [9003]


def test_sacct_other_errors_still_mean_unreadable() -> None:
    doc = json.loads(read("22.05", "sacct-nothing-found.json"))
    doc["errors"][0]["error_number"] = 1007  # any other error: the data could not be read
    with pytest.raises(SlurmUnreachable, match="Nothing found"):
        parse_json.sacct(doc)
    doc["errors"].append({"error_number": 9003})
    with pytest.raises(SlurmUnreachable):
        parse_json.sacct(doc)


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_sacct_history(version: str, generation: str) -> None:
    history = by_id(parse_json.sacct(read(version, f"sacct.{generation}.json")))
    assert set(history) == {RUN4, PEND4, RANGE24, HET1, HET1_1, REQUEUE1, HELD23, NL1, DONE1}
    run4 = history[RUN4]
    assert run4.state is JobState.CANCELLED and run4.comment == "elastic:min=4,max=4"
    assert [(a.node_count, a.nodes) for a in run4.allocations] == [
        (4, ("n1", "n2", "n3", "n4")),
        (2, ("n1", "n2")),
    ]
    first, second = run4.allocations
    assert second.start == first.end and run4.start_time == first.start
    assert first.start is not None and first.end is not None and second.end is not None
    assert run4.node_seconds == 4 * (first.end - first.start) + 2 * (second.end - second.start)
    assert history[PEND4].allocations == () and history[PEND4].start_time is None
    assert history[RANGE24].comment == COMMENT
    assert [a.nodes for a in history[RANGE24].allocations] == [("n3", "n4")]
    assert (history[HET1].het_job_id, history[HET1].het_job_offset) == (HET1, 0)
    assert (history[HET1_1].het_job_id, history[HET1_1].het_job_offset) == (HET1, 1)
    requeued = history[REQUEUE1]
    assert requeued.state is JobState.CANCELLED and len(requeued.allocations) == 1
    assert history[HELD23].allocations == () and history[HELD23].comment == "elastic:min=2,max=3"
    assert history[NL1].comment == "two\nlines"  # sacct -P prints it on two lines
    done1 = history[DONE1]
    assert done1.state is JobState.COMPLETED and done1.comment == "elastic:min=1,max=1"
    assert [a.node_count for a in done1.allocations] == [1]
    assert (done1.name, done1.partition, done1.work_dir) == ("done1", "batch", "/tmp")


@pytest.mark.parametrize(("version", "generation"), ALL_GENERATIONS)
def test_sacct_text_matches_json(version: str, generation: str, utc: None) -> None:
    text = by_id(parse_text.parse_sacct_text(read(version, "sacct-P.txt"), separator=SEP))
    assert text == by_id(parse_json.sacct(read(version, f"sacct.{generation}.json")))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["PENDING", "RESIZING"], JobState.RESIZING),  # shown as RESIZING by sacct -P
        (["PENDING", "REQUEUED"], JobState.REQUEUED),
        (["RUNNING", "COMPLETING"], JobState.COMPLETING),
        (["RUNNING", "CONFIGURING"], JobState.CONFIGURING),
        (["PENDING", "REQUEUE_HOLD"], JobState.PENDING),  # a flag JobState lacks: the base
        (["RUNNING", "SIGNALING"], JobState.RUNNING),
        (["COMPLETED"], JobState.COMPLETED),
        (["SOMETHING_NEW"], JobState.UNKNOWN),
        ("CANCELLED by 0", JobState.CANCELLED),  # sacct -P
    ],
)
def test_job_state_forms(value: Any, expected: JobState) -> None:
    assert cv.job_state(value, "state") is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"set": True, "infinite": False, "number": 4}, 4),
        ({"set": False, "infinite": False, "number": 0}, None),  # not set
        ({"set": False, "infinite": True, "number": 0}, None),  # unlimited
        ({"set": True, "infinite": True, "number": 7}, None),
        (4294967294, None),  # v0.0.38's NO_VAL
        (12, 12),
        (None, None),
    ],
)
def test_number_forms(value: Any, expected: int | None) -> None:
    assert cv.number(value, "n") == expected


@pytest.mark.parametrize(
    "value",
    [{"set": True, "number": 4}, {"set": "yes", "infinite": False, "number": 4}, {"number": 1}],
)
def test_bad_number_object_is_typed(value: Any) -> None:
    with pytest.raises(SlurmParseError, match=r"^n: expected \{set, infinite, number\}"):
        cv.number(value, "n")


def test_unlimited_time_limit_forms() -> None:
    """24.11+ rewrite a running unlimited job's limit to a year (525600 minutes)."""
    unlimited = {"set": False, "infinite": True, "number": 0}
    year = {"set": True, "infinite": False, "number": 525600}
    assert cv.limit_minutes(unlimited, "t") is None and cv.limit_minutes(year, "t") is None
    assert cv.duration_text("365-00:00:00", "t") is None
    assert cv.limit_minutes({"set": True, "infinite": False, "number": 30}, "t") == 1800.0


def test_a_time_limit_slurm_does_not_know_reads_as_none() -> None:
    """``squeue -O TimeLimit`` prints NOT_SET for a job whose partition was removed from
    slurm.conf while the job was still listed (22.05, seen when a test restarted its cluster
    without the partition a cancelled job had used); one such job must not fail the read."""
    assert cv.duration_text("NOT_SET", "t") is None
    with pytest.raises(SlurmParseError, match="bad duration"):
        cv.duration_text("NOT_A_TIME", "t")


def test_gres_forms() -> None:
    assert cv.gres_gpus("gres:gpu:1", "g") == 1  # 22.05's tres_per_node
    assert cv.gres_gpus("gres/gpu:2", "g") == 2  # 24.11+
    assert cv.gres_gpus("gpu:4(IDX:0-3)", "g") == 4


# --------------------------------------------------------------------------- text paths


JOB_FIELDS = tuple(f.name for f in fields(JobView))
# What Slurm's text shows for shared24's reason where JSON has the code "Resources": the
# job's state description (JSON: state_description), which text prefers when set.
DESCRIPTION = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
DESCRIPTION += "partitions"


def known_differences(
    path: str, version: str, job: JobView, text: JobView
) -> dict[str, tuple[Any, Any]]:
    """Where a text path is allowed to differ from the JSON of the same moment, and how."""
    known: dict[str, tuple[Any, Any]] = {}
    if job.job_id == SHARED24:
        shown = DESCRIPTION.replace(" ", "_") if path == "scontrol" else DESCRIPTION
        known["state_reason"] = ("Resources", shown)
    if job.state.is_finished and job.max_nodes is not None:
        known["max_nodes"] = (job.max_nodes, None)  # text has a maximum only while pending
    if path == "squeue -O" and job.resize_time is not None:
        known["resize_time"] = (job.resize_time, None)  # -O ResizeTime prints "INVALID"
    if path == "squeue -O" and job.priority is not None:
        # squeue_format prints no priority: the text path orders the queue by submit time.
        known["priority"] = (job.priority, None)
    if path == "squeue -O" and job.eligible_time is not None:
        known["eligible_time"] = (job.eligible_time, None)  # nor an eligible time
    if path == "squeue -O" and version == "22.05" and job.job_id == REQUEUE1:
        known["max_nodes"] = (None, 1)  # 22.05's JSON forgets a requeued job's maximum
    return known


@pytest.mark.parametrize("moment", [*MOMENTS, "het"])
@pytest.mark.parametrize("version", VERSIONS)
def test_text_paths_match_json(version: str, moment: str, utc: None) -> None:
    """squeue -O and scontrol -o show job give the JSON's JobView, field by field, but for
    the differences listed in ``known_differences`` (each checked exactly)."""
    from_json = squeue(version, moment, DEFAULT[version])
    paths = {
        "squeue -O": parse_text.parse_squeue_text(
            read(version, f"squeue-O-{moment}.txt"), separator=SEP
        ),
        "scontrol": parse_text.parse_scontrol_jobs(
            read(version, f"scontrol-o-show-job-{moment}.txt")
        ),
    }
    for path, views in paths.items():
        text = by_id(views)
        assert set(text) == set(from_json), path
        for job_id, job in from_json.items():
            other = text[job_id]
            differences = {
                name: (getattr(job, name), getattr(other, name))
                for name in JOB_FIELDS
                if getattr(job, name) != getattr(other, name)
            }
            assert differences == known_differences(path, version, job, other), (path, job_id)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_text_pending_range_min_and_max(version: str, utc: None) -> None:
    """The old `squeue -o` showed -N2-4 as min 4 and no max (%D is the scheduler's
    estimate); -O's tres-alloc (the request while pending) and MaxNodes fix both."""
    text = read(version, "squeue-O-pending.txt").replace(SEP, "|")
    line = next(line for line in text.splitlines() if "|range24|" in line)
    assert "|4|4|" in line and "node=2" in line  # NumNodes 4, MaxNodes 4, tres-alloc node=2
    jobs = by_id(parse_text.parse_squeue_text(read(version, "squeue-O-pending.txt"), separator=SEP))
    assert (jobs[RANGE24].min_nodes, jobs[RANGE24].max_nodes) == (2, 4)
    assert (jobs[SHARED24].min_nodes, jobs[SHARED24].max_nodes) == (2, 3)
    assert jobs[RANGE24].comment == COMMENT  # a "|" inside a field survives


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_text_pending_range(version: str, utc: None) -> None:
    """NumNodes=4-4 for a pending -N2-4 job; the minimum is node=2 of TRES= (22.05) or
    ReqTRES= (24.11+)."""
    text = read(version, "scontrol-o-show-job-pending.txt")
    line = next(line for line in text.splitlines() if "JobName=range24 " in line)
    assert " NumNodes=4-4 " in line
    assert (" TRES=" if version == "22.05" else " ReqTRES=") in line
    jobs = by_id(parse_text.parse_scontrol_jobs(text))
    assert (jobs[RANGE24].min_nodes, jobs[RANGE24].max_nodes) == (2, 4)
    assert jobs[RANGE24].comment == COMMENT


def test_scontrol_submit_line_is_free_text(utc: None) -> None:
    """26.05 prints SubmitLine=<the sbatch command line>, here holding the comment's
    "JobState=FAKE": it neither ends Command= nor sets JobState."""
    text = read("26.05", "scontrol-o-show-job-pending.txt")
    assert "SubmitLine=sbatch" in text and "JobState=FAKE" in text
    fields_of = parse_text.parse_keyvalue_line(
        next(line for line in text.splitlines() if "JobName=range24 " in line),
        parse_text.JOB_KEYS,
        "line",
    )
    assert fields_of["Command"] == "(null)" and fields_of["JobState"] == "PENDING"
    assert fields_of["SubmitLine"].startswith("sbatch ") and fields_of["WorkDir"] == "/tmp"


def test_squeue_format_fields() -> None:
    """Width 0 and the call's separator after every field, the last one too."""
    separator = parse_text.new_separator()
    parts = parse_text.squeue_format(separator).split(",")
    assert parts[-1] == f"Comment:0{separator}"
    assert all(p.endswith(f":0{separator}") for p in parts)
    assert {f"MaxNodes:0{separator}", f"tres-alloc:0{separator}"} <= set(parts)
    assert separator.isalpha() and len(separator) == parse_text.SEPARATOR_LENGTH
    assert parse_text.new_separator() != separator
    with pytest.raises(ValueError, match="letters only"):
        parse_text.squeue_format("a1")


# --------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_whole_node_flag_on_every_version(version: str) -> None:
    """``batch`` is OverSubscribe=EXCLUSIVE in slurm.conf; 26.05 shows it as Exclusive=NODE."""
    text = (FIXTURES / version / "scontrol-o-show-partition.txt").read_text()
    views = {p.name: p for p in parse_scontrol_partitions(text)}
    assert set(views) == {"batch", "shared"}
    assert views["batch"].exclusive and views["batch"].is_default
    assert not views["shared"].exclusive and not views["shared"].is_default
    assert views["batch"].nodes == ("n1", "n2", "n3", "n4")


def test_a_release_outside_the_matrix_is_read_in_the_generation_it_first_answered() -> None:
    """A site on a release the project has no captures of (25.05, say): its reads keep the
    generation of the first document, so a later change of the site's default does not
    change what is read; 22.05's openapi takes no name."""
    doc = json.loads(read("24.11", "squeue-pending.0.0.41.json"))
    doc["meta"]["slurm"]["release"] = "25.05.3"
    assert parse_json.json_flag(doc, "squeue --json") == "--json=v0.0.41"
    old = json.loads(read("22.05", "squeue-pending.0.0.38.json"))
    assert parse_json.json_flag(old, "squeue --json") == "--json"


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_a_job_under_the_step_manager_is_told_from_its_flags(version: str) -> None:
    """``STEPMGR_ENABLED`` in a job's ``flags`` (measured on 24.11 with
    SlurmctldParameters=enable_stepmgr): the daemon will not shrink it (guards.stepmgr_bars)."""
    generation = {"24.11": "0.0.42", "26.05": "0.0.45"}[version]
    doc = json.loads(read(version, f"squeue-pending.{generation}.json"))
    assert not any(v.stepmgr for v in parse_json.squeue(doc))
    doc["jobs"][0]["flags"] = [*doc["jobs"][0].get("flags", []), "STEPMGR_ENABLED"]
    views = parse_json.squeue(doc)
    assert views[0].stepmgr and not any(v.stepmgr for v in views[1:])
    doc["jobs"][0]["flags"] = "STEPMGR_ENABLED"
    with pytest.raises(SlurmParseError, match="flags: not a list"):
        parse_json.squeue(doc)
