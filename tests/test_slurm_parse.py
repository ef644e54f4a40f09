"""Parser unit tests on outputs captured from the real 22.05 cluster.

Fixtures and the command behind each: tests/fixtures/slurm/22.05/CAPTURED.md.  The
``squeue -O`` text path is tested on every version in test_slurm_parse_versions.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_elastic.errors import SlurmParseError, SlurmUnreachable
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.history import AcctRecord, collapse
from slurm_elastic.types import JobState

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "22.05"
SEP = parse_text.CAPTURE_SEPARATOR  # the text fixtures' separator (CAPTURED.md)


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_id(views):  # type: ignore[no-untyped-def]
    return {v.job_id: v for v in views}


# --------------------------------------------------------------------------- squeue --json


def test_squeue_json_running_and_pending() -> None:
    jobs = by_id(parse_json.squeue(read("squeue-running-pending.json")))
    assert set(jobs) == {1, 2, 3, 4, 5}  # squeue --json also lists recently ended jobs
    running = jobs[1]
    assert running.state is JobState.RUNNING
    assert running.nodes == ("n1", "n2", "n3", "n4")
    assert (running.node_count, running.batch_host, running.comment) == (4, "n1", "elastic")
    assert running.gpus_per_node == 4  # from the allocation (exclusive partition)
    assert running.time_limit_s is None  # UNLIMITED
    assert running.het_job_id is None and running.het_job_offset is None
    assert running.work_dir == "/tmp/bejobs"
    pending = jobs[2]
    assert pending.state is JobState.PENDING and pending.nodes == ()
    assert (pending.min_nodes, pending.max_nodes, pending.state_reason) == (4, 4, "Resources")
    assert pending.start_time is None and pending.end_time is None  # estimates dropped
    assert running.end_time is None  # unlimited: Slurm says start + 1 year


def test_squeue_json_pending_range_takes_min_from_request_not_estimate() -> None:
    # Slurm reports node_count=4 for `-N2-4` once it has looked at the job; the request
    # (node=2) survives only in tres_req_str.
    job = by_id(parse_json.squeue(read("squeue-running-pending.json")))[5]
    assert (job.node_count, job.min_nodes, job.max_nodes) == (2, 2, 4)
    assert job.comment == "free text JobState=FAKE | pipe"
    assert job.time_limit_s == 30 * 60


def test_squeue_json_resized_job() -> None:
    jobs = by_id(parse_json.squeue(read("squeue-resized.json")))
    assert jobs[1].nodes == ("n1", "n2") and jobs[1].node_count == 2
    assert jobs[1].resize_time is not None and jobs[1].start_time is not None
    assert jobs[1].resize_time > jobs[1].start_time
    assert jobs[1].gpus_per_node == 4
    assert jobs[5].state is JobState.RUNNING and jobs[5].nodes == ("n3", "n4")


def test_squeue_json_requeued_job() -> None:
    jobs = by_id(parse_json.squeue(read("squeue-requeued.json")))
    assert jobs[5].state is JobState.PENDING
    assert jobs[5].restart_count == 1
    assert jobs[5].state_reason == "BeginTime"
    assert jobs[1].admin_comment == "slurm-elastic: shrunk 4->2"


def test_squeue_json_hetjob_components_have_raw_ids() -> None:
    jobs = by_id(parse_json.squeue(read("squeue-hetjob.json")))
    first, second = jobs[10], jobs[11]
    assert (first.het_job_id, first.het_job_offset) == (10, 0)
    assert (second.het_job_id, second.het_job_offset) == (10, 1)
    assert first.is_het and second.is_het
    assert first.state is JobState.RUNNING and len(first.nodes) == 1
    assert {first.nodes[0], second.nodes[0]} == {"n4", "n1"}
    assert not jobs[1].is_het


# --------------------------------------------------------------------------- sinfo --json


def test_sinfo_json_allocated() -> None:
    nodes = parse_json.sinfo(read("sinfo-allocated.json"))
    assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"]
    assert all(n.state == "allocated" and n.gpus == 4 and n.alloc_gpus == 4 for n in nodes)
    assert all(n.partitions == ("batch", "shared") for n in nodes)


def test_sinfo_json_mixed_and_drained() -> None:
    nodes = {n.name: n for n in parse_json.sinfo(read("sinfo-mixed-drained.json"))}
    assert nodes["n1"].state == "mixed" and nodes["n1"].alloc_cpus == 1
    assert nodes["n4"].flags == ("DRAIN",) and nodes["n4"].reason == "fixture drain"
    assert not nodes["n4"].is_usable
    assert nodes["n2"].is_usable and nodes["n2"].state == "idle"


# --------------------------------------------------------------------------- sacct


def test_sacct_json_collapses_resize_records() -> None:
    history = by_id(parse_json.sacct(read("sacct-resized-requeued-het.json")))
    job = history[1]
    assert job.state is JobState.CANCELLED
    assert [a.node_count for a in job.allocations] == [4, 2]
    assert job.allocations[0].nodes == ("n1", "n2", "n3", "n4")
    assert job.allocations[1].nodes == ("n1", "n2")
    # Periods chain: the second starts when the RESIZING record ended.
    assert job.allocations[1].start == job.allocations[0].end
    assert job.start_time == job.allocations[0].start
    assert job.comment == "elastic"
    assert job.node_seconds == pytest.approx(
        4 * (1795242105 - 1795242068) + 2 * (1795242160 - 1795242105)
    )


def test_sacct_json_requeued_and_het() -> None:
    history = by_id(parse_json.sacct(read("sacct-resized-requeued-het.json")))
    requeued = history[5]
    assert len(requeued.allocations) == 1  # one run before the requeue; never ran again
    assert requeued.allocations[0].nodes == ("n3", "n4")
    assert requeued.comment == "free text JobState=FAKE | pipe"
    assert (history[11].het_job_id, history[11].het_job_offset) == (10, 1)
    # Failed het start attempts (PENDING records) are not allocations.
    assert history[6].allocations == () and history[6].start_time is None


def test_sacct_json_completed() -> None:
    (job,) = parse_json.sacct(read("sacct-completed.json"))
    assert job.job_id == 12 and job.state is JobState.COMPLETED
    assert job.comment == "elastic"
    assert [a.nodes for a in job.allocations] == [("n1",)]


def test_sacct_text_matches_json(utc: None) -> None:
    from_json = by_id(parse_json.sacct(read("sacct-resized-requeued-het.json")))
    from_text = by_id(parse_text.parse_sacct_text(read("sacct-P-all.txt"), separator=SEP))
    assert set(from_text) == set(range(1, 12))
    for job_id, history in from_json.items():
        assert from_text[job_id] == history
    (completed,) = parse_text.parse_sacct_text(read("sacct-P-completed.txt"), separator=SEP)
    assert completed == parse_json.sacct(read("sacct-completed.json"))[0]


# --------------------------------------------------------------------------- text forms


def test_scontrol_partitions() -> None:
    parts = {
        p.name: p
        for p in parse_text.parse_scontrol_partitions(read("scontrol-o-show-partition.txt"))
    }
    assert parts["batch"].is_default and parts["batch"].exclusive
    assert not parts["shared"].is_default and not parts["shared"].exclusive
    assert parts["batch"].nodes == ("n1", "n2", "n3", "n4")
    assert parts["batch"].state == "UP" and parts["batch"].max_time_s is None
    assert parts["batch"].max_nodes is None  # MaxNodes=UNLIMITED
    limited = read("scontrol-o-show-partition.txt").replace("MaxNodes=UNLIMITED", "MaxNodes=2")
    (first, *_) = parse_text.parse_scontrol_partitions(limited)
    assert first.max_nodes == 2 and first.job_capacity == 2


def test_qos_node_limits() -> None:
    # sacctmgr -n -P show qos format=Name,MaxTRESPerJob, as 22.05 prints it.
    text = "normal|\nse-h19-probe|cpu=8,node=2\nwide|gres/gpu=8\n"
    assert parse_text.parse_qos_node_limits(text) == {"se-h19-probe": 2}
    with pytest.raises(SlurmParseError, match="line 1"):
        parse_text.parse_qos_node_limits("no separator\n")


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_partition_qos_and_association_limits(version: str) -> None:
    """Captured with a partition QOS, a user's, a partition's and an account's MaxNodes
    (tests/fixtures/slurm/<version>/CAPTURED.md, "Node limits")."""
    limits = FIXTURES.parent / version / "limits"
    parts = {
        p.name: p
        for p in parse_text.parse_scontrol_partitions(
            (limits / "scontrol-o-show-partition.txt").read_text()
        )
    }
    assert (parts["batch"].qos, parts["shared"].qos) == ("", "se-cluster3-part2")
    qos = parse_text.parse_qos_node_limits((limits / "sacctmgr-show-qos.txt").read_text())
    assert qos == {"se-cluster3-part2": 2}
    assoc = parse_text.parse_assoc_node_limits((limits / "sacctmgr-show-assoc.txt").read_text())
    # The account's MaxNodes=4 reaches its users' rows (inherited); its own row is skipped.
    assert assoc == {
        ("default", "root", ""): 4,
        ("default", "se-alice", ""): 2,
        ("default", "se-bob", ""): 4,
        ("default", "se-bob", "shared"): 3,
    }


def test_assoc_node_limits_refuse_a_row_of_another_shape() -> None:
    with pytest.raises(SlurmParseError, match="line 2: expected Account"):
        parse_text.parse_assoc_node_limits("root|||\ndefault|se-alice|2\n")
    with pytest.raises(SlurmParseError, match="se-alice: MaxNodes"):
        parse_text.parse_assoc_node_limits("default|se-alice||many\n")


def test_scontrol_jobs_match_json(utc: None) -> None:
    text = by_id(parse_text.parse_scontrol_jobs(read("scontrol-o-show-job-running-pending.txt")))
    from_json = by_id(parse_json.squeue(read("squeue-running-pending.json")))
    for job_id in (1, 2, 5):
        t, j = text[job_id], from_json[job_id]
        for name in ("state", "nodes", "batch_host", "min_nodes", "max_nodes", "comment",
                     "user", "user_id", "partition", "submit_time", "start_time", "end_time",
                     "time_limit_s", "work_dir", "restart_count", "gpus_per_node"):  # fmt: skip
            assert getattr(t, name) == getattr(j, name), (job_id, name)
    # A comment containing spaces, "Key=" and "|" survives the key=value split.
    assert text[5].comment == "free text JobState=FAKE | pipe"
    assert text[5].state is JobState.PENDING


def test_scontrol_jobs_resized_requeued_het(utc: None) -> None:
    (resized,) = parse_text.parse_scontrol_jobs(read("scontrol-o-show-job-1-resized.txt"))
    assert resized.nodes == ("n1", "n2") and resized.resize_time is not None
    (requeued,) = parse_text.parse_scontrol_jobs(read("scontrol-o-show-job-requeued.txt"))
    assert requeued.restart_count == 1 and requeued.state is JobState.PENDING
    het = by_id(parse_text.parse_scontrol_jobs(read("scontrol-o-show-job-hetjob.txt")))
    assert (het[11].het_job_id, het[11].het_job_offset) == (10, 1)


def test_scontrol_config() -> None:
    config = parse_text.parse_scontrol_config(read("scontrol-show-config.txt"))
    assert config["ClusterName"] == "cluster2"
    assert config["MULTIPLE_SLURMD"] == "Yes"
    assert "permit_job_expansion" not in config["SchedulerParameters"]


# --------------------------------------------------------------------------- bad input


def test_unknown_json_generation_is_named() -> None:
    doc = json.loads(read("sinfo-allocated.json"))
    doc["meta"]["plugin"]["type"] = "openapi/v0.0.99"
    with pytest.raises(SlurmParseError, match=r"unsupported JSON generation 'openapi/v0.0.99'"):
        parse_json.sinfo(json.dumps(doc))


def test_missing_field_says_what_and_where() -> None:
    doc = json.loads(read("squeue-running-pending.json"))
    del doc["jobs"][0]["job_state"]
    with pytest.raises(SlurmParseError, match=r"squeue --json: job 1: missing field 'job_state'"):
        parse_json.squeue(doc)


def test_bad_node_list() -> None:
    doc = json.loads(read("squeue-running-pending.json"))
    doc["jobs"][0]["nodes"] = "n[1-"
    with pytest.raises(SlurmParseError, match=r"job 1: nodes: bad node list"):
        parse_json.squeue(doc)


def test_truncated_json() -> None:
    text = read("squeue-running-pending.json")
    with pytest.raises(SlurmParseError, match=r"^squeue --json: not valid JSON"):
        parse_json.squeue(text[: len(text) // 2])


def test_controller_down_documents_are_unreachable_not_empty() -> None:
    # With slurmctld down, squeue/sinfo --json exit 0 with an empty list and an error.
    with pytest.raises(SlurmUnreachable, match=r"squeue --json: .*Failed while looking for jobs"):
        parse_json.squeue(read("squeue-controller-down.json"))
    with pytest.raises(SlurmUnreachable, match=r"sinfo --json: .*Unspecified error"):
        parse_json.sinfo(read("sinfo-controller-down.json"))


def test_text_garbage() -> None:
    with pytest.raises(SlurmParseError, match=r"3 fields do not make whole rows of 25"):
        parse_text.parse_squeue_text("1|2|RUNNING|\n", separator="|")
    with pytest.raises(SlurmParseError, match=r"no Key=Value pairs"):
        parse_text.parse_scontrol_partitions("garbage line\n")
    with pytest.raises(SlurmParseError, match=r"missing State"):
        parse_text.parse_scontrol_partitions("PartitionName=x Nodes=n1\n")


def test_a_running_job_of_a_year_or_more_has_no_end_in_every_parser(utc: None) -> None:
    # A partition default of 365 days: Slurm prints start + 1 year, as for UNLIMITED.
    line = (
        read("scontrol-o-show-job-1-resized.txt")
        .replace("TimeLimit=UNLIMITED", "TimeLimit=365-00:00:00")
        .replace("EndTime=Unknown", "EndTime=2027-11-21T06:21:08")
    )
    assert "TimeLimit=365-00:00:00" in line and "EndTime=2027-11-21T06:21:08" in line
    (job,) = parse_text.parse_scontrol_jobs(line)
    assert job.state is JobState.RUNNING
    assert (job.time_limit_s, job.end_time) == (None, None)
    (limited,) = parse_text.parse_scontrol_jobs(line.replace("365-00:00:00", "1-00:00:00"))
    assert limited.end_time is not None  # a real limit keeps Slurm's end time


# --------------------------------------------------------------------------- one job per history


def _row(
    job_id: int, state: JobState, submit: float, end: float, nodes: int, sluid: str = ""
) -> AcctRecord:
    return AcctRecord(
        job_id=job_id,
        name="train",
        user="alice",
        account="a",
        partition="batch",
        state=state,
        submit_time=submit,
        start_time=submit,  # a resized record keeps the original start: not read after one
        end_time=end,
        node_count=nodes,
        nodes=tuple(f"n{i}" for i in range(1, nodes + 1)),
        original_sluid=sluid,
    )


def test_a_job_resized_twice_and_requeued_is_one_history() -> None:
    """Issue 20: each resize (and requeue) leaves a record; the next record is created when
    the previous one ends (22.05, 24.11 and 26.05 alike), and 26.05 names the resized job."""
    for sluid in ("", "s1"):
        (history,) = collapse(
            [
                _row(4, JobState.RESIZING, 100.0, 160.0, 3, sluid),
                _row(4, JobState.RESIZING, 160.0, 220.0, 2, sluid),
                # A requeued run gets a new SLUID on 26.05: the times join it.
                _row(4, JobState.REQUEUED, 220.0, 300.0, 1, sluid),
                _row(4, JobState.COMPLETED, 300.0, 400.0, 1, sluid and "s2"),
            ]
        )
        assert [(a.start, a.end, a.node_count) for a in history.allocations] == [
            (100.0, 160.0, 3), (160.0, 220.0, 2), (220.0, 300.0, 1), (300.0, 400.0, 1)
        ]  # fmt: skip
        assert history.submit_time == 100.0 and history.state is JobState.COMPLETED


def test_a_job_id_that_names_two_jobs_keeps_the_newest_never_joins_them() -> None:
    """Slurm's job counter reset with its state (or wrapped at MaxJobId): one id, two jobs
    in one window.  Priors must not read them as one job that ran twice."""
    older = _row(9, JobState.COMPLETED, 100.0, 200.0, 4)
    newer = _row(9, JobState.CANCELLED, 5000.0, 6000.0, 1)
    (history,) = collapse([newer, older])
    assert history.submit_time == 5000.0
    assert [(a.start, a.node_count) for a in history.allocations] == [(5000.0, 1)]
    # A resize record followed, at the same second, by another job of the same id: 26.05's
    # OriginalSLUID tells them apart where the times cannot.
    resized = _row(9, JobState.RESIZING, 100.0, 200.0, 4, "sA")
    other = _row(9, JobState.RUNNING, 200.0, 300.0, 2, "sB")
    (history,) = collapse([resized, other])
    assert [a.node_count for a in history.allocations] == [2]
    # A resize whose next record comes long after it ended is another job too.
    (history,) = collapse([_row(9, JobState.RESIZING, 100.0, 200.0, 4), newer])
    assert history.submit_time == 5000.0
