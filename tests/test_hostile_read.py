"""Hostile jobs in every read the daemon makes, on outputs captured from real Slurm (pure).

The fixtures under ``tests/fixtures/slurm/<version>/hostile/`` were captured by
``scripts/capture_hostile_fixtures.sh`` (see CAPTURED.md there): se-bob's jobs with bytes
that are not UTF-8 in a comment and a name, a newline and a '|' in a name and a comment,
and comments whose next lines are whole old-style ``squeue -O``/``sacct -P`` rows of a job
4242 of se-alice; se-alice's honest elastic jobs.  The live counterpart is
``tests/test_hostile_read_live.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_elastic.agent.allocation import effective_nodes
from slurm_elastic.cluster_state import classify
from slurm_elastic.errors import SlurmParseError
from slurm_elastic.marker import resolve_spec, untrusted
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.runner import CommandResult, SlurmRunner
from slurm_elastic.types import ClusterSnapshot, JobState, JobView

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")
SEP = parse_text.CAPTURE_SEPARATOR
FORGED_ID = 4242


def hostile_dir(version: str) -> Path:
    return FIXTURES / version / "hostile"


def captured_ids(version: str) -> dict[str, int]:
    """badbytes, newline, forged, honest, forgedone, alicedone -> job id (CAPTURED.md)."""
    text = (hostile_dir(version) / "CAPTURED.md").read_text()
    return {name: int(job) for name, job in re.findall(r"(\w+)=(\d+)", text)}


def read(version: str, name: str) -> str:
    """A fixture decoded as the runner decodes Slurm's output (invalid bytes replaced)."""
    return (hostile_dir(version) / name).read_bytes().decode("utf-8", errors="replace")


def by_id(views: tuple[JobView, ...]) -> dict[int, JobView]:
    return {v.job_id: v for v in views}


@pytest.mark.parametrize("version", VERSIONS)
def test_fixtures_hold_the_raw_bytes(version: str) -> None:
    raw = (hostile_dir(version) / "squeue.json").read_bytes()
    assert b"elastic\xfe\xff" in raw and b"bad\xfename" in raw
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")


@pytest.mark.parametrize("version", VERSIONS)
def test_runner_decodes_undecodable_bytes_per_field(version: str) -> None:
    """The real runner over the captured bytes: the bad bytes spoil only their fields."""
    path = hostile_dir(version) / "squeue.json"
    out = SlurmRunner().read(("cat", str(path))).stdout
    jobs = by_id(parse_json.squeue(out))
    ids = captured_ids(version)
    assert jobs[ids["badbytes"]].comment == "elastic\ufffd\ufffd"
    assert jobs[ids["badbytes"]].name == "bad\ufffdname"
    assert jobs[ids["honest"]].comment == "elastic:min=1,max=3"
    assert jobs[ids["honest"]].user == "se-alice"


@pytest.mark.parametrize("version", VERSIONS)
def test_json_and_text_job_reads_agree_and_forge_nothing(version: str, utc: None) -> None:
    ids = captured_ids(version)
    by_json = by_id(parse_json.squeue(read(version, "squeue.json")))
    by_text = by_id(parse_text.parse_squeue_text(read(version, "squeue-O.txt"), separator=SEP))
    assert set(by_json) == set(by_text) == set(ids.values())
    for job_id in ids.values():
        a, b = by_json[job_id], by_text[job_id]
        assert (a.user, a.name, a.comment, a.work_dir) == (b.user, b.name, b.comment, b.work_dir)
    assert by_text[ids["newline"]].name == "na\nme|x"
    assert by_text[ids["newline"]].comment == "elastic:min=1,max=2\nX"
    assert by_text[ids["forged"]].comment.startswith(f"forged\n{FORGED_ID}|N/A|N/A|RUNNING|")
    assert {v.user for v in by_text.values()} == {"se-alice", "se-bob"}


@pytest.mark.parametrize("version", VERSIONS)
def test_untrusted_comments_leave_only_their_own_jobs_alone(version: str) -> None:
    ids = captured_ids(version)
    jobs = parse_json.squeue(read(version, "squeue.json"))
    snapshot = ClusterSnapshot(taken_at=0.0, jobs=jobs, nodes=(), partitions=())
    cls = classify(snapshot, lambda j: resolve_spec(j.comment, j.min_nodes, j.max_nodes))
    assert set(cls.elastic) == {ids["honest"], ids["alicedone"]}
    reasons = {name: cls.not_elastic[ids[name]] for name in ("badbytes", "newline", "forged")}
    assert reasons == {
        "badbytes": "comment not trusted, job left alone: "
        "the comment holds bytes that are not UTF-8",
        "newline": "comment not trusted, job left alone: "
        "the comment holds control or format character U+000A",
        "forged": "comment not trusted, job left alone: "
        "the comment holds control or format character U+000A",
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("source", ["sacct-p.txt", "sacct.json"])
def test_history_has_no_forged_row(version: str, source: str, utc: None) -> None:
    ids = captured_ids(version)
    text = read(version, source)
    if source == "sacct.json":
        history = parse_json.sacct(text)
    else:
        history = parse_text.parse_sacct_text(text, separator=SEP)
    jobs = {h.job_id: h for h in history}
    assert FORGED_ID not in jobs
    assert set(jobs) == set(ids.values())
    forged = jobs[ids["forgedone"]]
    assert (forged.user, forged.state) == ("se-bob", JobState.COMPLETED)
    assert forged.comment.startswith(f"forged\n{FORGED_ID}|N/A|")
    assert jobs[ids["alicedone"]].user == "se-alice"


def test_a_field_cannot_make_a_row_without_the_separator() -> None:
    """Whatever a field holds (newlines, '|', a whole row in another separator), the
    rows are exactly those Slurm printed; output cut short is an error, not a guess."""
    sep = parse_text.new_separator()
    fields = ["7", "a|b\nc", f"x\n8{SEP}y{SEP}z{SEP}\n"]
    text = "".join(f + sep for f in fields) + "\n" + "".join(f + sep for f in ["9", "", ""]) + "\n"
    assert parse_text.split_rows(text, sep, 3, "t") == [fields, ["9", "", ""]]
    assert parse_text.split_rows("", sep, 3, "t") == []
    with pytest.raises(SlurmParseError, match="does not end with a whole row"):
        parse_text.split_rows(text + "10", sep, 3, "t")
    with pytest.raises(SlurmParseError, match="do not make whole rows of 3"):
        parse_text.split_rows(f"1{sep}2{sep}\n", sep, 3, "t")
    with pytest.raises(SlurmParseError, match="does not start a line"):
        parse_text.split_rows(f"1{sep}2{sep}3{sep}4{sep}5{sep}6{sep}\n", sep, 3, "t")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_row_that_does_not_parse_costs_only_that_row(version: str, utc: None) -> None:
    """History: a row with a bad field is left out, one without an owner's name too;
    the other rows stay (one job must not take the look-back window from everyone)."""
    ids = captured_ids(version)
    rows = read(version, "sacct-p.txt").split(f"{SEP}\n")
    broken = []
    for row in rows:
        fields = row.split(SEP)
        if fields[0] == str(ids["forgedone"]):
            fields[3] = "many"  # nnodes
        if fields[0] == str(ids["alicedone"]):
            fields[8] = ""  # user
        broken.append(SEP.join(fields))
    history = parse_text.parse_sacct_text(f"{SEP}\n".join(broken), separator=SEP)
    kept = {h.job_id for h in history}
    assert kept == set(ids.values()) - {ids["forgedone"], ids["alicedone"]}
    doc = json.loads(read(version, "sacct.json"))
    for job in doc["jobs"]:
        if job["job_id"] == ids["forgedone"]:
            job["time"] = "garbage"
    assert {h.job_id for h in parse_json.sacct(doc)} == set(ids.values()) - {ids["forgedone"]}


def test_an_empty_sacct_json_window_is_empty() -> None:
    """22.05 reports an empty window as error 9003 (measured); other errors still fail."""
    doc = json.loads((FIXTURES / "22.05" / "sacct-completed.json").read_text())
    doc["jobs"] = []
    doc["errors"] = [
        {
            "description": "Nothing found",
            "error_number": 9003,
            "error": "Nothing found with query",
            "source": "slurmdb_jobs_get",
        }
    ]
    assert parse_json.sacct(doc) == ()


@pytest.mark.parametrize(
    ("comment", "why"),
    [
        ("elastic", None),
        ("elastic:min=1,max=4\tnightly run", None),
        ("élastique 日本語 elastic", None),
        ("elastic\ufffd", "bytes that are not UTF-8"),
        ("elastic\nJobId=1", "U+000A"),
        ("elastic\x1b]0;title\x07", "U+001B"),
        ("elastic \u202eevil", "U+202E"),
        ("elastic\u2028x", "U+2028"),
        ("elastic\x85", "U+0085"),
    ],
)
def test_untrusted_comments(comment: str, why: str | None) -> None:
    found = untrusted(comment)
    assert (found is None) if why is None else (found is not None and why in found)


class QueueRunner(SlurmRunner):
    """Answers the agent's queue read with rows in the separator it asked for."""

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows
        self.argv: tuple[str, ...] = ()

    def read(self, argv: Sequence[str], **_: object) -> CommandResult:
        self.argv = argv = tuple(argv)
        sep = argv[-1].removeprefix("%i").split("%D")[0]
        out = "".join("".join(f + sep for f in row) + "\n" for row in self.rows)
        return CommandResult(argv, 0, out, "", 0.0)


def test_agent_counts_only_its_owners_companions() -> None:
    """A comment whose next line reads as another companion row adds no node."""
    forged = "x\n999|4|slurm-elastic:companion-of=10"
    runner = QueueRunner(
        [("10", "2", "elastic"), ("11", "1", "slurm-elastic:companion-of=10"), ("12", "1", forged)]
    )
    assert effective_nodes(10, runner) == 3
    assert "--me" in runner.argv
