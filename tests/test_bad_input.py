"""Bad input from users and from Slurm (issue 16, items 3 and 5): each gets one clear line
-- the job's REASON, the cycle's error, the request's answer -- and nothing else changes.

Pure where the behaviour is: the controller's own cycle over hand-written snapshots (the
REASON a hostile job of se-bob gets, and se-alice's job planned exactly as without it), the
companion's batch script run by bash with a hostile work dir, the daemon's cycle over
garbled Slurm output (hypothesis), and http.server's own refusals on an in-process API
server.  The live counterparts: tests/test_hostile_*.py (hostile users on real Slurm),
tests/test_marker_submit.py (the plugin inside slurmctld), tests/test_api_abuse_live.py
(the API of a running daemon), tests/test_daemon_service_faults.py (the state directory).
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from slurm_elastic.actuate.companion import companion_comment, companion_script
from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.config import Config
from slurm_elastic.daemon.api import ApiContext, ApiServer
from slurm_elastic.daemon.commands import status
from slurm_elastic.daemon.controller import Controller
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.result import JobStatusRow
from slurm_elastic.daemon.status import STATUS_FILE
from slurm_elastic.errors import SlurmError
from slurm_elastic.protocol import MAX_STEP, AckBody
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import CycleErrorKind, JobView
from tests.fakes import AnsweringRunner, targets
from tests.test_daemon_controller import make
from tests.test_daemon_controller_data import job, pending, snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
ALICE, BOB = 10, 20  # se-alice's honest elastic job, se-bob's hostile one
MAX_REASON = 250  # characters: a REASON is one line of `slurm-elastic status`


# --------------------------------------------------------------------------- REASONs


def _cycle(*others: JobView) -> tuple[dict[int, JobStatusRow], list[tuple[str, object]]]:
    """One enforcing cycle over se-alice's pending ``elastic`` job (planned at 2 nodes)
    and ``others``: the status rows by job, and what was done in Slurm."""
    alice = pending(ALICE, lo=1, hi=2, comment="elastic", user="se-alice")
    ctl, backend, _, _ = make(snapshot([alice, *others]), {ALICE: 2})
    result = ctl.run_once(1000.0)
    assert result.ok, result.error
    return {r.job_id: r for r in result.jobs}, backend.actions()


NOT_ELASTIC = "not elastic"
MARKER = "malformed marker: invalid elastic marker '"
UNTRUSTED = "comment not trusted, job left alone: the comment holds control or format character"

# case -> se-bob's comment, the start and the end of its REASON (None: an elastic job, 1-2)
REASON_CASES: dict[str, tuple[str, str | None, str]] = {
    # malformed or huge markers
    "a marker of a million digits": (
        "elastic:min=" + "9" * 1_000_000,
        MARKER + "elastic:min=999",
        "...': min is too large (1000000 digits, at most 6)",
    ),
    "100000 options": (
        "elastic:" + ",".join(["gpus=1"] * 100_000),
        MARKER + "elastic:gpus=1,gpus=1",
        "duplicate key 'gpus'",
    ),
    "100000 markers": ("elastic " * 100_000, MARKER, "more than one elastic marker in the comment"),
    "a megabyte of text, then a marker": ("x" * 1_000_000 + " elastic:min=1,max=2", None, ""),
    "min greater than max": ("elastic:min=4,max=2", MARKER, "min=4 is greater than max=2"),
    "a step that does not divide": (
        "elastic:min=1,max=2,step=3",
        MARKER,
        "step=3 does not divide max-min=1 (min=1, max=2)",
    ),
    # shell metacharacters: free text around the marker, never a value
    "shell around a marker": ("elastic:min=1,max=2 $(rm -rf ~);`id`|&>/etc/passwd", None, ""),
    "shell in a value": (
        "elastic:min=$(id),max=2",
        MARKER,
        "min must be a whole number, got '$(id)'",
    ),
    "a quote in a key": (
        "elastic:mi'n=1",
        MARKER,
        "unknown key 'mi'n' (known: min, max, step, gpus, cost)",
    ),
    # odd unicode
    "emoji around a marker": ("\U0001f680 elastic:min=1,max=2 \U0001f525", None, ""),
    "a Cyrillic e": ("\u0435lastic:min=1,max=2", NOT_ELASTIC, ""),
    "fullwidth letters": ("\uff45\uff4c\uff41\uff53\uff54\uff49\uff43", NOT_ELASTIC, ""),
    "a no-break space": ("elastic\u00a0min=1", NOT_ELASTIC, ""),
    "a zero-width joiner": ("elas\u200dtic:min=1,max=2", UNTRUSTED, " U+200D"),
    "a bidi override": ("elastic:min=1,max=2 \u202e8=xam", UNTRUSTED, " U+202E"),
    "a combining accent": ("elastic\u0301:min=1,max=2", NOT_ELASTIC, ""),
    # companion tokens
    # No companion of the daemon's (its journal's word, never a comment): a plain job.
    "a companion token naming se-alice's job": (companion_comment(ALICE), NOT_ELASTIC, ""),
    "a companion token that is not a job id": (
        "slurm-elastic:companion-of=1e3",
        MARKER + "slurm-elastic:companion-of=1e3'",
        "companion token must be slurm-elastic:companion-of=<PARENT_JOBID>",
    ),
    "a companion token of 5000 digits": (
        "slurm-elastic:companion-of=" + "9" * 5000,
        MARKER + "slurm-elastic:companion-of=999",
        "companion token must be slurm-elastic:companion-of=<PARENT_JOBID>",
    ),
}


@pytest.fixture(scope="module")
def alone() -> tuple[dict[int, JobStatusRow], list[tuple[str, object]]]:
    """The cycle without se-bob's job: what his job must change nothing of."""
    return _cycle()


@pytest.mark.parametrize("case", list(REASON_CASES))
def test_a_hostile_comment_gets_one_clear_reason_and_changes_nothing_else(
    case: str, alone: tuple[dict[int, JobStatusRow], list[tuple[str, object]]]
) -> None:
    comment, start, end = REASON_CASES[case]
    rows, actions = _cycle(pending(BOB, lo=1, hi=2, comment=comment, user="se-bob"))
    bob = rows[BOB]
    if start is None:  # the marker is read through the noise: an ordinary elastic job
        assert (bob.min_nodes, bob.max_nodes) == (1, 2), bob.reason
    else:
        assert bob.reason.startswith(start) and bob.reason.endswith(end), bob.reason
        assert (bob.min_nodes, bob.max_nodes, bob.target) == (None, None, None)
        assert bob.reason.isprintable() and len(bob.reason) <= MAX_REASON
    assert rows[ALICE] == alone[0][ALICE]
    assert actions == alone[1] == [("pin", (ALICE, 2))]


def test_a_hostile_job_name_is_data() -> None:
    """Escape sequences, a bidi override and shell in a name: the job is an ordinary
    elastic job, its name kept exact (the CLI escapes it when it shows it)."""
    name = "$(reboot);`id`\x1b]0;owned\x07\x1b[2J\u202egnp.exe\n|x"
    hostile = replace(pending(BOB, lo=1, hi=2, comment="elastic", user="se-bob"), name=name)
    rows, actions = _cycle(hostile)
    assert rows[BOB].name == name and (rows[BOB].min_nodes, rows[BOB].max_nodes) == (1, 2)
    assert actions == [("pin", (ALICE, 2))]


def test_a_forged_companion_token_on_a_running_job_is_not_counted_for_its_target() -> None:
    """se-bob's running job names se-alice's running job as its parent: her size is her own
    nodes, nothing of his is cancelled, and it is a plain job (the daemon's companions are
    its journal's, never what a comment claims)."""
    alice = job(ALICE, nodes=("n1",), lo=1, hi=2, user="se-alice")
    forged = job(BOB, nodes=("n2",), comment=companion_comment(ALICE), user="se-bob")
    ctl, backend, _, _ = make(snapshot([alice, forged]), {})
    result = ctl.run_once(1000.0)
    rows = {r.job_id: r for r in result.jobs}
    assert rows[ALICE].nodes == 1
    assert rows[BOB].reason == NOT_ELASTIC
    assert backend.actions() == []


# --------------------------------------------------------------------------- companions


def test_a_hostile_work_dir_reaches_the_companion_script_as_one_path(tmp_path: Path) -> None:
    """A user chooses their job's work dir, and a companion's script ``cd``s into it: run by
    bash, the script goes into exactly that directory, and nothing in its name runs."""
    work = tmp_path / "w $(touch PWNED1) `touch PWNED2`; touch PWNED3 'q\"\n#x"
    work.mkdir()
    out = tmp_path / "cwd.txt"
    agent = (
        f"{shlex.quote(sys.executable)} -c "
        + shlex.quote("import os, sys; open(sys.argv[1], 'w').write(os.getcwd())")
        + f" {shlex.quote(str(out))}"
    )
    parent = replace(job(30, nodes=("n1",), user="se-bob"), work_dir=str(work))
    script = tmp_path / "companion.sh"
    script.write_text(companion_script(parent, agent))
    done = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == str(work)
    made = {p.name for p in (*tmp_path.iterdir(), *work.iterdir())}
    assert not made & {"PWNED1", "PWNED2", "PWNED3"}


# --------------------------------------------------------------------------- Slurm output

SQUEUE = (FIXTURES / "22.05" / "squeue-running-pending.json").read_text()


class GarbledQueue(AnsweringRunner):
    """Answers the queue read with ``out``; any other command fails the test (a cycle
    whose queue read failed must run no other)."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out

    def answer(self, argv: tuple[str, ...]) -> tuple[str, str]:
        assert argv[0] == "squeue", f"ran {argv} after a failed queue read"
        return self.out, ""


def _garbled_cycle(out: str, job_format: str) -> tuple[Any, GarbledQueue, Journal]:
    runner = GarbledQueue(out)
    journal = Journal()
    ctl = Controller(
        CliBackend(runner, job_format=job_format),
        Config.model_validate({"mode": "enforce"}),
        reports=ReportStore(),
        journal=journal,
        agents=InstructionBoard(),
        allocate=targets({}),
    )
    return ctl.run_once(time.time()), runner, journal


garbled = (
    st.integers(0, len(SQUEUE) - 2).map(lambda n: SQUEUE[:n])  # truncated
    | st.text(max_size=300)  # garbage
    | st.tuples(st.integers(0, len(SQUEUE) - 1), st.text(min_size=1, max_size=20)).map(
        lambda cut: SQUEUE[: cut[0]] + cut[1] + SQUEUE[cut[0] + 1 :]  # a spliced-in fragment
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(out=garbled, job_format=st.sampled_from(["json", "text"]))
def test_garbled_queue_output_fails_the_cycle_in_one_line(out: str, job_format: str) -> None:
    """Truncated, random or spliced ``squeue`` output (the JSON read, or the text read,
    which finds no separator in it): the queue read fails with a typed error, and the
    cycle with one ``observe:`` line; it runs no other command, acts on nothing and writes
    nothing to the journal.  (Output that still parses, such as an empty text queue or a
    splice inside a string, is a queue: nothing to check here.)"""
    try:
        CliBackend(GarbledQueue(out), job_format=job_format).read_jobs()
    except SlurmError:
        pass
    else:
        return
    result, runner, journal = _garbled_cycle(out, job_format)
    assert not result.ok and result.error_kind is CycleErrorKind.OBSERVE, result.error
    assert result.error is not None and result.error.startswith("observe: squeue")
    assert "\n" not in result.error
    assert len(runner.argvs) == 1 and result.actions == () and journal.all_actions() == ()


# --------------------------------------------------------------------------- state dir


@pytest.mark.parametrize(
    "content",
    [b'{"version": 1, "cyc', b"\xff\xfe\x00", b"[]", b'{"version": 99}', b""],
    ids=["truncated", "binary", "a list", "another version", "empty"],
)
def test_status_on_a_spoiled_status_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    """A status.json the daemon did not write whole (a full disk, a hand edit): ``status``
    says so in one line, exit 1, whatever is in it (the daemon writes it atomically, so
    this is what only something else can leave there)."""
    (tmp_path / STATUS_FILE).write_bytes(content)
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path}\napi: {{port: 1}}\n")  # no API answers
    result = CliRunner().invoke(status, ["--config", str(config_file)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: no daemon status: ")
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


# --------------------------------------------------------------------------- the API


def test_an_acks_step_is_bounded_like_a_reports() -> None:
    """Regression (issue 16): an ack's step had no upper bound, so a job could put a number
    of 4300 digits into its shrink's REASON (``agent ready at step N``), the journal and
    ``explain``.  It is now bounded like a report's step (10^15): past it, 400."""
    assert AckBody.model_validate({"instruction_id": "i", "status": "ready", "step": MAX_STEP})
    for step in (MAX_STEP + 1, 10**4000):
        with pytest.raises(ValidationError, match="step"):
            AckBody.model_validate({"instruction_id": "i", "status": "ready", "step": step})


@pytest.fixture
def api() -> Iterator[ApiServer]:
    """An API server that knows no job (http.server's refusals come before any)."""
    context = ApiContext(
        reports=ReportStore(),
        board=InstructionBoard(),
        metrics=DaemonMetrics(),
        owner_of=lambda _job: None,
        size_of=lambda _job: None,
        status_document=lambda: None,
        health=lambda _now: (True, "test"),
        clock=time.time,
    )
    server = ApiServer(context, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400),  # TLS
        (b"\x01" * 60_000 + b"\r\n\r\n", 400),  # a request line of control bytes
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n", 431),
        (b"PATCH /healthz HTTP/1.1\r\n\r\n", 501),
    ],
    ids=["tls-hello", "60kb-junk", "http2", "long-line", "101-headers", "patch"],
)
def test_http_servers_own_refusals_are_a_short_json_answer_and_one_short_line(
    api: ApiServer, request_bytes: bytes, status: int
) -> None:
    """Regression (issue 16): http.server answered a request line it could not parse as
    HTTP/0.9 (an HTML page with no status line) and quoted the whole line, up to 64 KiB
    (256 KiB escaped), in its answer and in the ``api.bad_request`` log line."""
    with structlog.testing.capture_logs() as logs:
        with socket.create_connection(api.address, timeout=10) as raw:
            raw.sendall(request_bytes)
            reply = b""
            while chunk := raw.recv(65536):
                reply += chunk
        deadline = time.monotonic() + 5
        while not logs and time.monotonic() < deadline:
            time.sleep(0.02)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), reply[:200]
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert len(body) < 512 and "error" in json.loads(body)
    (event,) = logs
    assert event["event"] == "api.bad_request" and len(event["detail"]) <= 200
