"""The HTTP API over real HTTP on 127.0.0.1 with the machine's real MUNGE.

Credentials for "another user" are made as ``nobody`` with ``runuser``, so munged really
vouches for a different UID; nothing about authentication is faked.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import structlog

from slurm_elastic import protocol
from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.daemon.api import MAX_BODY_BYTES, ApiContext, ApiServer
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.visibility import Privacy
from slurm_elastic.protocol import Instruction, InstructionKind

NOBODY_UID = 65534
NOBODY_JOB = 101  # owned by nobody
OTHER_JOB = 102  # owned by a uid that is neither nobody nor root
OWNERS = {NOBODY_JOB: NOBODY_UID, OTHER_JOB: 4242}
SIZES = {NOBODY_JOB: 2, OTHER_JOB: 1}  # Slurm's view: the job's nodes in the last cycle


def _munge_works() -> bool:
    probe = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def munge() -> None:
    """munged as the cluster runs it; started here (as user munge) when it is not up yet."""
    if shutil.which("munge") is None or shutil.which("munged") is None:
        pytest.fail("munge is not installed (scripts/install-deps.sh installs it)")
    if _munge_works():
        return
    run = Path("/run/munge")
    run.mkdir(parents=True, exist_ok=True)
    shutil.chown(run, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, timeout=30)
    for _ in range(50):
        if _munge_works():
            return
        time.sleep(0.1)
    pytest.fail("munged did not come up")


class _Health:
    def __init__(self) -> None:
        self.healthy = True

    def __call__(self, now: float) -> tuple[bool, str]:
        return self.healthy, "test"


wakeups: list[float] = []  # on_ack calls: an accepted ack asks the loop for a cycle now


def _context(health: _Health) -> ApiContext:
    return ApiContext(
        reports=ReportStore(),
        board=InstructionBoard(),
        metrics=DaemonMetrics(),
        owner_of=OWNERS.get,
        size_of=SIZES.get,
        status_document=lambda: {"version": 1, "cycle": {"count": 3}},
        health=health,
        clock=time.time,
        on_ack=lambda: wakeups.append(time.time()),
    )


@pytest.fixture
def server(munge: None) -> Iterator[tuple[ApiServer, ApiContext, _Health]]:
    health = _Health()
    wakeups.clear()
    context = _context(health)
    api = ApiServer(context, "127.0.0.1", 0)
    api.start()
    try:
        yield api, context, health
    finally:
        api.stop()


def _credential_as(user: str | None, payload: str) -> str:
    cmd = ["munge", "-s", payload]
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, check=True, timeout=10).stdout.decode().strip()


def _post(url: str, body: bytes, credential: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if credential is not None:
        headers[protocol.HEADER] = credential
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


REPORT = json.dumps({"step": 120, "nodes": 2, "loss": 1.5, "samples_per_s": 800.0}).encode()


def test_owner_report_accepted(server) -> None:
    api, context, _ = server
    cred = _credential_as("nobody", protocol.body_digest(REPORT))
    status, body = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, cred)
    assert (status, body) == (200, {"accepted": True})
    report = context.reports.latest(NOBODY_JOB)
    assert report is not None
    assert (report.job_id, report.step, report.nodes, report.loss) == (NOBODY_JOB, 120, 2, 1.5)
    assert abs(report.time - time.time()) < 30


def test_report_time_and_size_are_the_daemons(server) -> None:
    """The job's clock and size are claims: recorded are the arrival time and Slurm's size."""
    api, context, _ = server
    body = json.dumps({"step": 5, "nodes": 3, "time": 1.0}).encode()
    before = time.time()
    assert protocol.post_authenticated(f"{api.url}/v1/jobs/{OTHER_JOB}/report", body).status == 200
    report = context.reports.latest(OTHER_JOB)
    assert report is not None
    assert (report.nodes, report.claimed_nodes) == (SIZES[OTHER_JOB], 3)
    assert before <= report.time <= time.time()


def test_missing_credential_is_401(server) -> None:
    api, context, _ = server
    status, body = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, None)
    assert status == 401 and "X-Slurm-Elastic-Munge" in body["error"]
    assert context.reports.latest(NOBODY_JOB) is None


def test_garbage_credential_is_401(server) -> None:
    api, _, _ = server
    status, _ = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, "MUNGE:not-a-credential:")
    assert status == 401


def test_credential_for_another_body_is_401(server) -> None:
    api, context, _ = server
    cred = _credential_as("nobody", protocol.body_digest(b'{"step": 1, "nodes": 1}'))
    status, body = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, cred)
    assert status == 401 and "sha256" in body["error"]
    assert context.reports.latest(NOBODY_JOB) is None


def test_replayed_credential_is_401(server) -> None:
    api, _, _ = server
    cred = _credential_as("nobody", protocol.body_digest(REPORT))
    assert _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, cred)[0] == 200
    status, body = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, cred)
    assert status == 401 and "Replayed" in body["error"]


def test_report_forged_for_another_users_job_is_403(server) -> None:
    api, context, _ = server
    cred = _credential_as("nobody", protocol.body_digest(REPORT))
    status, body = _post(f"{api.url}/v1/jobs/{OTHER_JOB}/report", REPORT, cred)
    assert status == 403 and "uid 65534" in body["error"]
    assert context.reports.latest(OTHER_JOB) is None
    metrics = _get(f"{api.url}/metrics")[1].decode()
    assert 'slurm_elastic_auth_failures_total{reason="not_owner"} 1.0' in metrics


def test_root_may_report_for_any_job(server) -> None:
    api, context, _ = server
    result = protocol.post_authenticated(f"{api.url}/v1/jobs/{OTHER_JOB}/report", REPORT)
    assert result.status == 200
    assert context.reports.latest(OTHER_JOB) is not None


def test_unknown_job_is_404(server) -> None:
    api, _, _ = server
    result = protocol.post_authenticated(f"{api.url}/v1/jobs/999/report", REPORT)
    assert result.status == 404


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\x00\xffnot json{", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"step": -1, "nodes": 2}', "step"),
        (b'{"step": 1}', "nodes"),
        (b'{"step": 1, "nodes": 2, "samples_per_s": "fast"}', "samples_per_s"),
        (b'{"step": 1, "nodes": 2, "bogus": 1}', "bogus"),
        (b'{"step": 1, "nodes": 2, "job_id": 5}', "job_id"),
        (b"[" * 30_000 + b"]" * 30_000, "not JSON"),  # nesting deeper than the parser allows
        (b" " * (MAX_BODY_BYTES + 1), "body over"),
        (b'{"step": 1' + b"0" * 400 + b', "nodes": 2}', "step"),
        (b'{"step": 1, "nodes": 2, "loss": 1e308}', "loss"),
        (b'{"step": 1, "nodes": 2, "loss": NaN}', "loss"),
        (b'{"step": 1, "nodes": 2, "samples_per_s": Infinity}', "samples_per_s"),
        (b'{"step": 1, "nodes": 2, "epoch": 1e400}', "epoch"),
    ],
    ids=[
        "binary",
        "list",
        "negative",
        "missing",
        "type",
        "unknown",
        "job_id",
        "deep",
        "big",
        "step-10e400",
        "loss-1e308",
        "nan",
        "infinity",
        "overflow",
    ],
)
def test_malformed_body_is_400(server, body: bytes, needle: str) -> None:
    api, context, _ = server
    cred = _credential_as(None, protocol.body_digest(body))
    status, answer = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", body, cred)
    expected = 413 if len(body) > MAX_BODY_BYTES else 400
    assert status == expected and needle in answer["error"]
    assert context.reports.latest(NOBODY_JOB) is None
    assert _get(f"{api.url}/healthz")[0] == 200  # still serving


def test_raw_garbage_on_the_socket_does_not_kill_the_server(server) -> None:
    api, _, _ = server
    with socket.create_connection(api.address, timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        raw.recv(4096)
    with socket.create_connection(api.address, timeout=5) as raw:
        raw.sendall(b"POST /v1/jobs/101/report HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 411 " in raw.recv(4096)
    assert _get(f"{api.url}/healthz")[0] == 200


def test_instruction_and_ack_round_trip(server) -> None:
    api, context, _ = server
    url = f"{api.url}/v1/jobs/{NOBODY_JOB}"
    assert json.loads(_get(f"{url}/instruction")[1]) == {"instruction": None}
    instruction = Instruction(
        id="i-1",
        kind=InstructionKind.SHRINK,
        target_nodes=1,
        keep_nodes=("n1",),
        deadline=time.time() + 60,
    )
    context.board.post(NOBODY_JOB, instruction)
    got = json.loads(_get(f"{url}/instruction")[1])["instruction"]
    assert got["id"] == "i-1" and got["kind"] == "shrink" and got["keep_nodes"] == ["n1"]

    ack = json.dumps({"instruction_id": "i-1", "status": "ready", "step": 300}).encode()
    cred = _credential_as("nobody", protocol.body_digest(ack))
    assert _post(f"{url}/ack", ack, cred)[0] == 200
    recorded = context.board.ack_for("i-1")
    assert recorded is not None and recorded.step == 300 and recorded.status == "ready"
    assert len(wakeups) == 1  # the loop is woken so the shrink follows the ack at once

    stale = json.dumps({"instruction_id": "old", "status": "ready"}).encode()
    cred = _credential_as("nobody", protocol.body_digest(stale))
    assert _post(f"{url}/ack", stale, cred)[0] == 409
    assert len(wakeups) == 1  # a rejected ack wakes nothing

    # Another user cannot acknowledge for this job.
    other_ack = json.dumps({"instruction_id": "i-1", "status": "failed"}).encode()
    cred = _credential_as("nobody", protocol.body_digest(other_ack))
    context.board.post(OTHER_JOB, instruction)
    assert _post(f"{api.url}/v1/jobs/{OTHER_JOB}/ack", other_ack, cred)[0] == 403


def test_an_ack_detail_over_its_limit_is_400_and_not_recorded(server) -> None:
    """An ack's detail is the job's own words in the journal, status and explain: a job
    may not write more than ``MAX_DETAIL`` characters of them."""
    api, context, _ = server
    url = f"{api.url}/v1/jobs/{NOBODY_JOB}"
    instruction = Instruction(
        id="i-9",
        kind=InstructionKind.SHRINK,
        target_nodes=1,
        keep_nodes=("n1",),
        deadline=time.time() + 60,
    )
    context.board.post(NOBODY_JOB, instruction)
    long_detail = "x" * (protocol.MAX_DETAIL + 1)
    ack = json.dumps({"instruction_id": "i-9", "status": "ready", "detail": long_detail})
    cred = _credential_as("nobody", protocol.body_digest(ack.encode()))
    status, answer = _post(f"{url}/ack", ack.encode(), cred)
    assert status == 400 and "detail" in answer["error"]
    assert context.board.ack_for("i-9") is None


def test_status_metrics_health(server) -> None:
    api, context, health = server
    status, body = _get(f"{api.url}/v1/status")
    assert status == 200 and json.loads(body)["cycle"]["count"] == 3
    status, body = _get(f"{api.url}/metrics")
    assert status == 200 and b"slurm_elastic_cycles_total" in body
    assert _get(f"{api.url}/healthz")[0] == 200
    health.healthy = False
    status, body = _get(f"{api.url}/healthz")
    assert status == 503 and json.loads(body)["healthy"] is False
    assert _get(f"{api.url}/nope")[0] == 404
    context.status_document = lambda: None
    assert _get(f"{api.url}/v1/status")[0] == 503


STATUS_DOC = {
    "version": 1,
    "cycle": {"count": 3},
    "jobs": [
        {"job_id": NOBODY_JOB, "user": "nobody", "loan": 1},
        {"job_id": OTHER_JOB, "user": "somebody", "loan": 2},
    ],
    "plan": {"decisions": [{"job_id": NOBODY_JOB}, {"job_id": OTHER_JOB}], "objective": 3.0},
    "actions": [{"job_id": OTHER_JOB, "kind": "shrink"}],
    "nodes_on_loan": 3,
}


def _status_as(api: ApiServer, user: str | None, payload: bytes | None = None) -> tuple[int, dict]:
    """GET /v1/status with a credential made as ``user`` (None: as root) over ``payload``
    (default: protocol.STATUS_REQUEST)."""
    digest = protocol.body_digest(protocol.STATUS_REQUEST if payload is None else payload)
    headers = {protocol.HEADER: _credential_as(user, digest)}
    request = urllib.request.Request(f"{api.url}/v1/status", method="GET", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_status_follows_slurms_private_data_for_each_reader(server) -> None:
    """Issue 38, class 2: with PrivateData=jobs an unauthenticated reader sees no job, a
    user with a MUNGE credential only his own, root everything; without it, everyone
    everything."""
    api, context, _ = server
    context.status_document = lambda: STATUS_DOC
    context.privacy = lambda: Privacy.of(["jobs"])
    status, body = _get(f"{api.url}/v1/status")
    anyone = json.loads(body)
    assert status == 200 and anyone["jobs"] == [] and anyone["actions"] == []
    assert anyone["cycle"] == {"count": 3} and anyone["nodes_on_loan"] == 0
    status, mine = _status_as(api, "nobody")
    assert status == 200 and [r["job_id"] for r in mine["jobs"]] == [NOBODY_JOB]
    assert [d["job_id"] for d in mine["plan"]["decisions"]] == [NOBODY_JOB]
    assert mine["actions"] == [] and mine["nodes_on_loan"] == 1
    status, everything = _status_as(api, None)
    assert status == 200 and everything == STATUS_DOC
    context.privacy = lambda: Privacy.of([])
    assert json.loads(_get(f"{api.url}/v1/status")[1]) == STATUS_DOC


def test_a_status_credential_for_anything_else_is_401(server) -> None:
    api, context, _ = server
    context.status_document = lambda: STATUS_DOC
    context.privacy = lambda: Privacy.of(["jobs"])
    status, body = _status_as(api, "nobody", payload=b"GET /v1/jobs/101/instruction")
    assert status == 401 and "not the sha256" in body["error"]


def test_get_status_reads_as_the_calling_user(server) -> None:
    """protocol.get_status (what ``slurm-elastic status`` calls) sends the caller's
    credential: root here, so everything."""
    api, context, _ = server
    context.status_document = lambda: STATUS_DOC
    context.privacy = lambda: Privacy.of(["jobs"])
    answer = protocol.get_status(f"{api.url}/v1/status")
    assert answer.status == 200 and answer.body == STATUS_DOC
    nothing = protocol.get_status(f"{api.url}/v1/status", munge="/nonexistent/munge")
    assert nothing.status == 200 and nothing.body["jobs"] == []  # no credential: anyone


def test_post_authenticated_reports_unreachable_daemon() -> None:
    from slurm_elastic.errors import AgentError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AgentError, match="cannot reach"):
        protocol.get_json(f"http://127.0.0.1:{port}/healthz", timeout_s=2)


def test_too_many_concurrent_credentials_is_503_then_recovers(server) -> None:
    api, context, _ = server
    context.auth_wait_s = 0.1
    held = 0
    while context.auth_slots.acquire(blocking=False):  # every slot busy
        held += 1
    try:
        cred = _credential_as(None, protocol.body_digest(REPORT))
        status, body = _post(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT, cred)
        assert status == 503 and "busy" in body["error"]
    finally:
        for _ in range(held):
            context.auth_slots.release()
    assert held == 16
    assert (
        protocol.post_authenticated(f"{api.url}/v1/jobs/{NOBODY_JOB}/report", REPORT).status == 200
    )


def test_unread_body_closes_the_connection(server) -> None:
    """A body the server did not read (404) must not be taken for the next request."""
    import http.client

    api, _, _ = server
    host, port = api.address
    connection = http.client.HTTPConnection(host, port, timeout=5)
    smuggled = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
    connection.request("POST", "/healthz", body=smuggled)
    response = connection.getresponse()
    assert response.status == 404 and response.getheader("Connection") == "close"
    response.read()
    connection.close()
    assert _get(f"{api.url}/healthz")[0] == 200


# --------------------------------------------------------------------------- resources


def _credentials(bodies: list[bytes]) -> list[str]:
    """One credential per body, made up front (root's: accepted for any job)."""
    return [_credential_as(None, protocol.body_digest(b)) for b in bodies]


def test_a_burst_of_60_reports_is_answered_without_resets(server) -> None:
    """More concurrent reports than the stdlib's backlog of 5 and than the 16 credential
    checks at once: each one connects, is queued, and gets 200."""
    api, context, _ = server
    bodies = [json.dumps({"step": i, "nodes": 1}).encode() for i in range(60)]
    creds = _credentials(bodies)
    url = f"{api.url}/v1/jobs/{OTHER_JOB}/report"
    start = threading.Barrier(len(bodies))

    def send(i: int) -> int | str:
        start.wait()
        try:
            return _post(url, bodies[i], creds[i])[0]
        except OSError as exc:  # a reset or refused connection
            return f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(send, range(len(bodies))))
    assert results == [200] * len(bodies)
    assert len(context.reports.history(OTHER_JOB)) == len(bodies)


@pytest.fixture
def small_server(munge: None) -> Iterator[ApiServer]:
    """A server with 2 connection slots, each held at most 1 s."""
    api = ApiServer(_context(_Health()), "127.0.0.1", 0, max_connections=2, max_connection_s=1.0)
    api.start()
    try:
        yield api
    finally:
        api.stop()


def _closed_by_server(raw: socket.socket, deadline_s: float) -> bool:
    raw.settimeout(deadline_s)
    try:
        return raw.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _held_report(api: ApiServer, source: str = "127.0.0.1") -> socket.socket:
    """A report whose head has come and whose body never will: it holds a report slot (its
    thread waits for the body) until the connection's time is up."""
    raw = socket.create_connection(api.address, timeout=5, source_address=(source, 0))
    raw.sendall(b"POST /v1/jobs/7/report HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
    return raw


def _turned_away(url: str) -> bool:
    status, body = _get(url)
    return status == 503 and b"too many connections" in body


def test_past_the_connection_cap_is_503_health_still_answers_then_recovers(
    small_server: ApiServer,
) -> None:
    """Two reports waiting for their bodies hold both report slots: the next request is
    turned away at once, while /healthz and /metrics (threads of their own) answer."""
    api = small_server
    instruction = f"{api.url}/v1/jobs/7/instruction"
    with structlog.testing.capture_logs() as logs:
        held = [_held_report(api) for _ in range(2)]
        try:
            deadline = time.monotonic() + 10
            while not _turned_away(instruction):
                assert time.monotonic() < deadline, "never turned away"
                time.sleep(0.05)
            assert _get(f"{api.url}/healthz")[0] == 200
            assert _get(f"{api.url}/metrics")[0] == 200
        finally:
            for raw in held:
                raw.close()
    assert any(e["event"] == "api.busy" for e in logs)
    deadline = time.monotonic() + 10
    while _get(instruction)[0] != 200:  # the slots are freed as their threads end
        assert time.monotonic() < deadline, "slots never freed"
        time.sleep(0.05)


def test_health_answers_in_under_a_second_while_200_idle_connections_are_held(
    server: tuple[ApiServer, ApiContext, object],
) -> None:
    """Issue 38, class 6: 120 idle connections made every /healthz probe 503 (one thread
    each, 64 at most).  Now an idle connection holds no thread, only its descriptor, for
    HEADER_TIMEOUT_S: probes keep answering 200, fast, while 200 are held."""
    api, _, _ = server
    idle = [socket.create_connection(api.address, timeout=5) for _ in range(200)]
    try:
        times = []
        for _ in range(10):
            started = time.monotonic()
            status, _body = _get(f"{api.url}/healthz")
            times.append(time.monotonic() - started)
            assert status == 200
        assert max(times) < 1.0, times
    finally:
        for raw in idle:
            raw.close()


def test_an_idle_connection_is_closed_after_the_header_timeout(munge: None) -> None:
    api = ApiServer(_context(_Health()), "127.0.0.1", 0, header_timeout_s=0.5)
    api.start()
    try:
        with socket.create_connection(api.address, timeout=5) as raw:
            raw.sendall(b"GET /healthz HTTP/1.1\r\n")  # the head never ends
            started = time.monotonic()
            answer = raw.recv(4096)
            assert time.monotonic() - started < 3.0
            assert answer.startswith(b"HTTP/1.1 408 ") and b"not complete in time" in answer
    finally:
        api.stop()


def test_a_head_past_its_limit_is_431_and_costs_one_line(server) -> None:
    api, _, _ = server
    with (
        structlog.testing.capture_logs() as logs,
        socket.create_connection(api.address, timeout=5) as raw,
    ):
        # Just past the limit: the whole head is in before the daemon sees it is too long.
        raw.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 65_536)
        answer = raw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert [e["event"] for e in logs] == ["api.head_too_large"]
    assert _get(f"{api.url}/healthz")[0] == 200


def test_one_address_gets_its_share_of_the_report_slots(munge: None) -> None:
    """Requests from one address hold at most ``max_per_peer`` report slots; another
    address is still served (127.0.0.2 is another peer on the loopback)."""
    api = ApiServer(_context(_Health()), "127.0.0.1", 0, max_connections=8, max_per_peer=2)
    api.start()
    held = [_held_report(api) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while not _turned_away(f"{api.url}/v1/jobs/7/instruction"):
            assert time.monotonic() < deadline, "one address took more than its share"
            time.sleep(0.05)
        other = _held_report(api, "127.0.0.2")
        other.sendall(b"0123456789")  # its body: it is served, not turned away
        assert other.recv(4096).startswith(b"HTTP/1.1 401 ")
        other.close()
    finally:
        for raw in held:
            raw.close()
        api.stop()


def test_a_connection_is_closed_after_its_time_whatever_it_sends(small_server: ApiServer) -> None:
    """A client trickling one header byte at a time holds its slot for at most 1 s here."""
    api = small_server
    with socket.create_connection(api.address, timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed = False
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            try:
                raw.sendall(b"X")
            except OSError:
                closed = True
                break
            closed = _closed_by_server(raw, 0.2)
        assert closed, "a trickling client kept its connection past max_connection_s"


def _reset(raw: socket.socket) -> None:
    """Close with a TCP reset, as a client that crashes does."""
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


def test_aborted_and_malformed_requests_are_one_line_each(server, capfd) -> None:
    api, context, _ = server
    with structlog.testing.capture_logs() as logs:
        # Dropped in the middle of the body: 10 of 100 bytes, then a reset.
        raw = socket.create_connection(api.address, timeout=5)
        raw.sendall(
            f"POST /v1/jobs/{NOBODY_JOB}/report HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 100\r\n\r\n".encode()
            + b'{"step": 1'
        )
        time.sleep(0.2)
        _reset(raw)
        # Dropped in the middle of the request line.
        raw = socket.create_connection(api.address, timeout=5)
        raw.sendall(b"POST /v1/jo")
        time.sleep(0.2)
        _reset(raw)
        # Not HTTP at all.
        with socket.create_connection(api.address, timeout=5) as raw:
            raw.sendall(b"\x16\x03\x01garbage\r\n\r\n")
            assert b" 400 " in raw.recv(4096)
        deadline = time.monotonic() + 10
        while len(logs) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _get(f"{api.url}/healthz")[0] == 200
    events = sorted(e["event"] for e in logs)
    assert events == ["api.aborted", "api.aborted", "api.bad_request"], logs
    assert not any("exc_info" in e or "exception" in e for e in logs)
    assert context.reports.latest(NOBODY_JOB) is None
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
