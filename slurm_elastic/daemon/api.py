"""The daemon's HTTP API (docs/CONTRACTS.md): job reports and acks in, instructions, status,
metrics and health out.

Stdlib ``ThreadingHTTPServer``: a handful of small JSON requests per job per minute needs no
framework.  Every request is answered with JSON (or Prometheus text) and a status code; no
input can crash the server: bodies are bounded, parsed with pydantic (every number bounded
and finite), and every rejection is a log line (``report.rejected``) and a metric.  A
client that drops or stalls mid-request costs one JSON log line, never a traceback.

The server's own resources are bounded, and nobody can make health look bad by holding
connections (docs/security.md, "The API's limits"):

* one thread (``_HeadReader``) takes every accepted connection and reads its request head,
  without a thread per connection: a connection that has not sent its whole head
  ``HEADER_TIMEOUT_S`` after it was accepted is closed (408), idle or trickling.  At most
  ``MAX_OPEN`` connections are open at once, ``MAX_OPEN_PER_PEER`` from one address; past
  either, 503 at once;
* a complete head goes to one of two pools of threads: ``GET /healthz`` and ``GET /metrics``
  to ``HEALTH_SLOTS`` threads of their own, every other request to ``MAX_CONNECTIONS``
  (``MAX_CONNECTIONS_PER_PEER`` from one address).  A full pool answers 503; so saturated
  report traffic never turns a health probe away;
* one request per connection (``Connection: close``), none served longer than
  ``MAX_CONNECTION_S`` after accept (a health request ``HEALTH_CONNECTION_S``); a listen
  backlog of ``LISTEN_BACKLOG``.

The API never calls Slurm.  Who owns a job, and its size, come from the latest snapshot the
loop took (``owner_of``, ``size_of``), so a burst of reports costs no Slurm calls.  What a
report says is recorded as a claim, never as a fact the daemon can see for itself: its time
is when it arrived, its size Slurm's (docs/security.md, "What a report can claim").
"""

from __future__ import annotations

import contextlib
import io
import json
import pwd
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from slurm_elastic.actuate.instructions import Ack, InstructionBoard
from slurm_elastic.daemon import auth
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.visibility import ANYONE, Privacy, Viewer, visible
from slurm_elastic.errors import AuthError, Forbidden, ReportRejected, Unauthenticated
from slurm_elastic.protocol import HEADER, STATUS_REQUEST, AckBody, ReportBody
from slurm_elastic.types import ProgressReport

MAX_BODY_BYTES = 64 * 1024
MAX_CONCURRENT_AUTH = 16
# Connections served at once, one thread each: a burst of reports from every job of a large
# allocation fits (each is short; the credential checks queue on MAX_CONCURRENT_AUTH).
MAX_CONNECTIONS = 64
# Connections the kernel queues before accept (the stdlib's default of 5 reset 7 of a burst
# of 60); Linux caps it at net.core.somaxconn (4096 by default).
LISTEN_BACKLOG = 256
MAX_CONNECTION_S = 30.0  # a connection is closed this long after accept, whatever it does
_REQUEST_TIMEOUT_S = 10.0  # a client that stalls mid-body frees its thread after this
# A request head (request line and headers) must be complete this long after accept: an
# idle or trickling connection costs a file descriptor for 2 s, never a thread.
HEADER_TIMEOUT_S = 2.0
MAX_HEAD_BYTES = 64 * 1024  # what http.server accepts of a request line (and then some)
MAX_OPEN = 1024  # connections open at once (file descriptors), heads being read included
MAX_OPEN_PER_PEER = 512  # ... from one address
# Report/ack/status requests served at once for one address: another always has 16 left.
MAX_CONNECTIONS_PER_PEER = 48
# Threads of their own for GET /healthz and /metrics: a probe is answered however busy the
# report traffic, and a client that does not read its answer holds one for 2 s at most.
HEALTH_SLOTS = 8
HEALTH_CONNECTION_S = 2.0
_HEALTH_PATHS = frozenset({"/healthz", "/metrics"})


def _canned(status: str, error: str) -> bytes:
    """A whole JSON answer that closes the connection, written without a handler."""
    body = json.dumps({"error": error}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


_BUSY = _canned("503 Service Unavailable", "busy: too many connections at once")
_TIMED_OUT = _canned("408 Request Timeout", "request head not complete in time")
_HEAD_TOO_LARGE = _canned("431 Request Header Fields Too Large", "request head too large")
_JOB_PATH = re.compile(r"^/v1/jobs/(\d{1,12})/(report|ack|instruction)$")
# Characters of http.server's own refusal message kept in its log line and its answer: the
# message quotes the client's request line, which may be 64 KiB (256 KiB once escaped).
_DETAIL_CHARS = 200

log = structlog.get_logger("slurm_elastic.api")


def parse_report(
    job_id: int, payload: Mapping[str, Any], *, received_at: float, slurm_nodes: int | None
) -> ProgressReport:
    """The report the daemon records from ``payload`` (the HTTP handler's pure core).

    ``received_at`` becomes its time and ``slurm_nodes`` (the job's size in the latest
    snapshot; None when it was not a running elastic job) its size; the size the job
    claimed is kept beside it, so that the model takes no rate from a disputed report.
    """
    try:
        body = ReportBody.model_validate(payload)
    except ValidationError as exc:
        raise ReportRejected(_first_error(exc)) from None
    if body.job_id is not None and body.job_id != job_id:
        raise ReportRejected("job_id in the body differs from the path")
    fields = body.model_dump(exclude={"job_id", "time", "nodes"})
    return ProgressReport(
        job_id=job_id,
        time=received_at,
        nodes=slurm_nodes or 0,
        claimed_nodes=body.nodes,
        **fields,
    )


@dataclass
class ApiContext:
    """What the handlers read and write; owned by the service, shared with the loop."""

    reports: ReportStore
    board: InstructionBoard
    metrics: DaemonMetrics
    owner_of: Callable[[int], int | None]  # job id -> owner uid, from the latest snapshot
    size_of: Callable[[int], int | None]  # job id -> its nodes in the latest cycle (running)
    status_document: Callable[[], dict[str, Any] | None]
    health: Callable[[float], tuple[bool, str]]  # now -> (healthy, why)
    clock: Callable[[], float]
    unmunge: str = "unmunge"
    # At most this many credentials checked at once: each is an unmunge process, and a
    # burst of reports must not fork without bound.  Past it, callers get 503 and retry.
    auth_slots: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_CONCURRENT_AUTH)
    )
    auth_wait_s: float = 5.0
    # Called after an accepted ack: the loop runs its next cycle now instead of at the next
    # tick, so a job that has checkpointed is shrunk at once rather than up to interval_s later.
    on_ack: Callable[[], None] = lambda: None
    # What Slurm keeps private (PrivateData): what /v1/status shows each reader
    # (daemon.visibility).  Unknown until Slurm has said: as private as can be.
    privacy: Callable[[], Privacy] = Privacy.unknown


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or status.phrase.lower().replace(" ", "_")


class _Handler(BaseHTTPRequestHandler):
    server_version = "slurm-elastic"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = _REQUEST_TIMEOUT_S
    context: ApiContext  # set on the subclass made per server

    # http.server writes every request to stderr; our own log line per rejection suffices.
    def log_message(self, format: str, *args: Any) -> None:
        return

    def log_error(self, format: str, *args: Any) -> None:
        """A request http.server itself refused (bad request line or headers, a timeout
        before the request was complete): one bounded line, no traceback."""
        log.warning(
            "api.bad_request", detail=_bounded(format % args), client=self.client_address[0]
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (request line, headers, version, method) answered like
        every other request: a status line and a short JSON body.  The stdlib answers a
        request line it cannot parse as HTTP/0.9, an HTML page without a status line, and
        quotes the whole request line in it and in the log line."""
        self.log_error("code %d, message %s", code, message)
        try:
            status = HTTPStatus(code)
        except ValueError:
            status = HTTPStatus.BAD_REQUEST
        data = json.dumps({"error": _bounded(message or status.phrase)}).encode()
        self.request_version = self.protocol_version  # a status line, whatever was sent
        self.close_connection = True  # what follows on the connection is not a request
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def handle(self) -> None:
        """One request per connection: the head reader admitted the connection for its
        first request, and an idle keep-alive connection would hold a thread."""
        self.close_connection = True
        self.handle_one_request()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ------------------------------------------------------------------ routing

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        self._body_read = False
        self.close_connection = True  # one request per connection (``handle``)
        try:
            if method == "GET" and path == "/healthz":
                self._healthz()
            elif method == "GET" and path == "/metrics":
                self._send(HTTPStatus.OK, self.context.metrics.exposition(), CONTENT_TYPE_LATEST)
            elif method == "GET" and path == "/v1/status":
                self._status()
            elif match := _JOB_PATH.match(path):
                self._job(method, int(match.group(1)), match.group(2))
            else:
                raise _HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {path}")
        except _HttpError as exc:
            self._reject(exc, path)
        except OSError as exc:
            # The client dropped or stalled mid-request (a reset, a timeout): nobody is left
            # to answer, and it is the client's doing, not a bug.
            self.close_connection = True
            log.warning(
                "api.aborted", path=path, error=_describe(exc), client=self.client_address[0]
            )
        except Exception as exc:  # a bug must cost one request, not the server
            log.exception("api.error", path=path, error=str(exc))
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

    def _job(self, method: str, job_id: int, what: str) -> None:
        if what == "instruction":
            if method != "GET":
                raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET for instructions")
            instruction = self.context.board.pending_for(job_id)
            self._json(
                HTTPStatus.OK, {"instruction": instruction.to_json() if instruction else None}
            )
            return
        if method != "POST":
            raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"use POST for {what}")
        body = self._read_body()
        if not self.context.auth_slots.acquire(timeout=self.context.auth_wait_s):
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "busy: too many reports at once")
        try:
            self._authenticate(job_id, body)
        finally:
            self.context.auth_slots.release()
        payload = _parse_json(body)
        if what == "report":
            self._report(job_id, payload)
        else:
            self._ack(job_id, payload)

    # ------------------------------------------------------------------ endpoints

    def _healthz(self) -> None:
        healthy, why = self.context.health(self.context.clock())
        status = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
        self._json(status, {"healthy": healthy, "detail": why})

    def _status(self) -> None:
        """The status document as Slurm's PrivateData lets this reader see it: a reader who
        sends a MUNGE credential over ``protocol.STATUS_REQUEST`` is that user; one who sends
        none is anyone (``daemon.visibility``)."""
        viewer = self._viewer()
        document = self.context.status_document()
        if document is None:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "no cycle has completed yet")
        self._json(HTTPStatus.OK, visible(document, viewer, self.context.privacy()))

    def _viewer(self) -> Viewer:
        credential = self.headers.get(HEADER)
        if not credential:
            return ANYONE
        if not self.context.auth_slots.acquire(timeout=self.context.auth_wait_s):
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "busy: too many reports at once")
        try:
            decoded = auth.decode_credential(credential.strip(), unmunge=self.context.unmunge)
            auth.verify_body(decoded, STATUS_REQUEST)
        except AuthError as exc:
            raise _HttpError(HTTPStatus.UNAUTHORIZED, str(exc), reason="unauthenticated") from None
        finally:
            self.context.auth_slots.release()
        return Viewer(decoded.uid, _user_name(decoded.uid))

    def _report(self, job_id: int, payload: dict[str, Any]) -> None:
        try:
            report = parse_report(
                job_id,
                payload,
                received_at=self.context.clock(),
                slurm_nodes=self.context.size_of(job_id),
            )
        except ReportRejected as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, str(exc), reason="bad_body") from None
        self.context.reports.add(report)
        self.context.metrics.reports.inc()
        self._json(HTTPStatus.OK, {"accepted": True})

    def _ack(self, job_id: int, payload: dict[str, Any]) -> None:
        try:
            body = AckBody.model_validate(payload)
        except ValidationError as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, _first_error(exc), reason="bad_body") from None
        ack = Ack(
            instruction_id=body.instruction_id,
            job_id=job_id,
            status=body.status,
            step=body.step,
            detail=body.detail,
            received_at=self.context.clock(),
        )
        if not self.context.board.ack(ack):
            raise _HttpError(
                HTTPStatus.CONFLICT,
                f"job {job_id} has no open instruction {body.instruction_id!r}",
                reason="stale_ack",
            )
        self.context.metrics.acks.labels(status=body.status).inc()
        self.context.on_ack()
        log.info(
            "ack.received", job_id=job_id, instruction_id=body.instruction_id, status=body.status
        )
        self._json(HTTPStatus.OK, {"accepted": True})

    # ------------------------------------------------------------------ helpers

    def _read_body(self) -> bytes:
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            length = int(raw_length)
        except ValueError:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        if length > MAX_BODY_BYTES:
            raise _HttpError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"
            )
        body = self.rfile.read(length)
        self._body_read = True
        if len(body) != length:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "body shorter than Content-Length")
        return body

    def _authenticate(self, job_id: int, body: bytes) -> None:
        credential = self.headers.get(HEADER)
        try:
            if not credential:
                raise Unauthenticated(f"no {HEADER} header")
            decoded = auth.decode_credential(credential.strip(), unmunge=self.context.unmunge)
            auth.verify_body(decoded, body)
            owner = self.context.owner_of(job_id)
            if owner is None:
                raise _HttpError(HTTPStatus.NOT_FOUND, f"job {job_id} is not known to the daemon")
            auth.authorize(decoded, owner, job_id)
        except Forbidden as exc:
            raise _HttpError(HTTPStatus.FORBIDDEN, str(exc), reason="not_owner") from None
        except AuthError as exc:
            raise _HttpError(HTTPStatus.UNAUTHORIZED, str(exc), reason="unauthenticated") from None

    def _reject(self, exc: _HttpError, path: str) -> None:
        if exc.status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            self.context.metrics.auth_failures.labels(reason=exc.reason).inc()
        if path.startswith("/v1/jobs/"):
            log.warning(
                "report.rejected",
                path=path,
                status=int(exc.status),
                reason=exc.reason,
                detail=str(exc),
                client=self.client_address[0],
            )
        self._json(exc.status, {"error": str(exc)})

    def _json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, allow_nan=False, default=str).encode()
        self._send(status, data, "application/json")

    def _send(self, status: HTTPStatus, data: bytes, content_type: str) -> None:
        if not self._body_read and self.headers.get("Content-Length", "0").strip() != "0":
            # An unread body must not be parsed as the next request on this connection.
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "body is not JSON", reason="bad_body") from None
    if not isinstance(payload, dict):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object", reason="bad_body")
    return payload


def _user_name(uid: int) -> str | None:
    """The user name of ``uid`` on this host (the name job rows carry), None when unknown."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _bounded(text: str) -> str:
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{loc}: {err['msg']}"


class _Server(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with bounded resources (see the module docstring): the
    accepting thread only counts a connection and hands it to the head reader, which hands
    complete heads to ``serve``."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[_Handler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_connection_s: float = MAX_CONNECTION_S,
        max_per_peer: int = MAX_CONNECTIONS_PER_PEER,
        health_slots: int = HEALTH_SLOTS,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        max_open: int = MAX_OPEN,
        max_open_per_peer: int = MAX_OPEN_PER_PEER,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._health_slots = threading.BoundedSemaphore(health_slots)
        self._health_handler = type("HealthHandler", (handler,), {"timeout": HEALTH_CONNECTION_S})
        self._max_connection_s = max_connection_s
        self._max_per_peer = max_per_peer
        self._max_open = max_open
        self._max_open_per_peer = max_open_per_peer
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}  # served connection -> when it must close
        self._open_count = 0  # every connection from accept to close, heads included
        self._open_by_peer: dict[str, int] = {}
        self._serving_by_peer: dict[str, int] = {}  # report/ack/status requests being served
        self.refused = 0  # connections answered 503 because a cap was reached
        self.heads = _HeadReader(self, header_timeout_s)
        super().__init__(address, handler)

    # ------------------------------------------------------------------ accept

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0])
        with self._lock:
            full = (
                self._open_count >= self._max_open
                or self._open_by_peer.get(peer, 0) >= self._max_open_per_peer
            )
            if not full:
                self._open_count += 1
                self._open_by_peer[peer] = self._open_by_peer.get(peer, 0) + 1
        if full:
            self._refuse(request, client_address, counted=False)
            return
        self.heads.admit(request, client_address)

    def closed(self, request: socket.socket, client_address: Any) -> None:
        """``request`` is closed: it no longer counts towards the open caps."""
        peer = str(client_address[0])
        with self._lock:
            self._open_count -= 1
            left = self._open_by_peer.get(peer, 1) - 1
            if left > 0:
                self._open_by_peer[peer] = left
            else:
                self._open_by_peer.pop(peer, None)

    # ------------------------------------------------------------------ serve

    def serve(self, request: socket.socket, client_address: Any, head: bytes, health: bool) -> None:
        """A complete head (and whatever came with it): a thread of the pool it belongs to,
        or 503 when that pool, or the peer's share of it, is full."""
        peer = str(client_address[0])
        if health:
            if not self._health_slots.acquire(blocking=False):
                self._refuse(request, client_address)
                return
            limit = HEALTH_CONNECTION_S
        else:
            with self._lock:
                mine = self._serving_by_peer.get(peer, 0)
                taken = mine < self._max_per_peer and self._slots.acquire(blocking=False)
                if taken:
                    self._serving_by_peer[peer] = mine + 1
            if not taken:
                self._refuse(request, client_address)
                return
            limit = self._max_connection_s
        with self._lock:
            self._open[request] = time.monotonic() + limit
        request.setblocking(True)
        thread = threading.Thread(
            target=self._serve_thread,
            args=(request, client_address, head, health),
            name="slurm-elastic-api-request",
            daemon=True,
        )
        try:
            thread.start()
        except BaseException:
            self._done(request, client_address, health)
            raise

    def _serve_thread(
        self, request: socket.socket, client_address: Any, head: bytes, health: bool
    ) -> None:
        handler = self._health_handler if health else self.RequestHandlerClass
        try:
            handler(_Replayed(request, head), client_address, self)  # type: ignore[arg-type]
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._done(request, client_address, health)

    def _done(self, request: socket.socket, client_address: Any, health: bool) -> None:
        peer = str(client_address[0])
        with self._lock:
            self._open.pop(request, None)
            if not health:
                left = self._serving_by_peer.get(peer, 1) - 1
                if left > 0:
                    self._serving_by_peer[peer] = left
                else:
                    self._serving_by_peer.pop(peer, None)
        (self._health_slots if health else self._slots).release()
        self.closed(request, client_address)

    def service_actions(self) -> None:
        """Every poll of the accept loop (0.5 s): end connections past their time, which a
        client trickling its body one byte per timeout would otherwise hold for ever."""
        now = time.monotonic()
        with self._lock:
            late = [conn for conn, until in self._open.items() if until < now]
        for conn in late:
            with contextlib.suppress(OSError):  # already closed by its client
                conn.shutdown(socket.SHUT_RDWR)  # its thread's read returns, and it ends

    def _refuse(self, request: socket.socket, client_address: Any, *, counted: bool = True) -> None:
        """503 without a thread: what has already arrived of the request is read first
        (closing with unread data would reset the connection)."""
        self.refused += 1
        # Logged before the answer, so the line exists once the client has its 503.
        log.warning("api.busy", client=str(client_address[0]), refused=self.refused)
        _answer_and_close(request, _BUSY)
        if counted:
            self.closed(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An error outside a request's own handling (the client reset the connection while
        http.server read the request line, or before the response was flushed): one line."""
        exc = sys.exc_info()[1]
        log.warning(
            "api.aborted",
            path=None,
            error=_describe(exc) if exc is not None else "unknown",
            client=str(client_address[0]),
        )

    def server_close(self) -> None:
        self.heads.stop()
        super().server_close()


def _answer_and_close(request: socket.socket, answer: bytes) -> None:
    """Send a canned answer on a connection nobody serves, and close it; never blocks."""
    try:
        request.setblocking(False)
        for _ in range(16):
            if not request.recv(65536):
                break
    except OSError:
        pass  # nothing more arrived yet
    try:
        request.send(answer)  # small: the socket's buffer takes it whole
        request.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        request.close()


class _Replayed:
    """An accepted socket with what the head reader took from it put back in front: what
    http.server's handler reads first (``makefile("rb")``).  Everything else is the
    socket's."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self._sock = sock
        self._head = head

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BufferedReader:
        # http.server reads through makefile("rb") and writes with sendall (wbufsize 0).
        if mode != "rb":
            raise ValueError(f"only reads replay the head, not mode {mode!r}")
        return io.BufferedReader(_HeadFirst(self._sock, self._head))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _HeadFirst(io.RawIOBase):
    """The bytes already read, then the socket."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        super().__init__()
        self._sock = sock
        self._head = memoryview(head)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._sock.recv_into(buffer)


@dataclass
class _Pending:
    """A connection whose request head is being read."""

    sock: socket.socket
    address: Any
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class _HeadReader:
    """One thread that reads the request head of every accepted connection (non-blocking,
    one ``selectors`` loop), so that idle and trickling connections cost no thread: a
    complete head goes to ``_Server.serve``; one not complete ``timeout_s`` after accept is
    answered 408 and closed; one over ``MAX_HEAD_BYTES``, 431."""

    def __init__(self, server: _Server, timeout_s: float) -> None:
        self._server = server
        self._timeout_s = timeout_s
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._arrived: list[_Pending] = []
        self._pending: dict[socket.socket, _Pending] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-elastic-api-heads")
        self._thread.daemon = True
        self._thread.start()
        self.timed_out = 0  # connections closed with 408

    def admit(self, sock: socket.socket, address: Any) -> None:
        entry = _Pending(sock, address, time.monotonic() + self._timeout_s)
        with self._lock:
            self._arrived.append(entry)
        with contextlib.suppress(OSError):  # full: a wake-up is already waiting
            self._wake_w.send(b"x")

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        for entry in list(self._pending.values()):
            self._drop(entry, None)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._read(key.data)
            with self._lock:
                arrived, self._arrived = self._arrived, []
            for entry in arrived:
                entry.sock.setblocking(False)
                self._pending[entry.sock] = entry
                self._selector.register(entry.sock, selectors.EVENT_READ, entry)
            now = time.monotonic()
            for entry in [e for e in self._pending.values() if e.deadline <= now]:
                self.timed_out += 1
                log.warning("api.head_timeout", client=str(entry.address[0]))
                self._drop(entry, _TIMED_OUT)

    def _read(self, entry: _Pending) -> None:
        try:
            chunk = entry.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:  # a reset mid-head: one line, as for one mid-request
            log.warning(
                "api.aborted", path=None, error=_describe(exc), client=str(entry.address[0])
            )
            self._drop(entry, None)
            return
        if not chunk:
            if entry.data:  # closed mid-head (one that sent nothing is no request at all)
                log.warning(
                    "api.aborted",
                    path=None,
                    error="closed before its request head was complete",
                    client=str(entry.address[0]),
                )
            self._drop(entry, None)
            return
        entry.data += chunk
        if _head_complete(entry.data):
            self._selector.unregister(entry.sock)
            del self._pending[entry.sock]
            self._server.serve(entry.sock, entry.address, bytes(entry.data), _is_health(entry.data))
        elif len(entry.data) > MAX_HEAD_BYTES:
            log.warning("api.head_too_large", client=str(entry.address[0]))
            self._drop(entry, _HEAD_TOO_LARGE)

    def _drop(self, entry: _Pending, answer: bytes | None) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(entry.sock)
        self._pending.pop(entry.sock, None)
        if answer is None:
            with contextlib.suppress(OSError):
                entry.sock.close()
        else:
            _answer_and_close(entry.sock, answer)
        self._server.closed(entry.sock, entry.address)


def _head_complete(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds a whole request head (the blank line after the headers), or a
    first line that is no HTTP/1.x request line, which the handler refuses as it is."""
    if b"\r\n\r\n" in data or b"\n\n" in data:
        return True
    end = data.find(b"\n")
    if end < 0:
        return False
    words = bytes(data[:end]).split()
    return len(words) != 3 or not words[2].startswith(b"HTTP/")


def _is_health(data: bytes | bytearray) -> bool:
    """A ``GET`` of ``/healthz`` or ``/metrics`` (served by threads of their own)."""
    end = data.find(b"\n")
    words = bytes(data[: end if end >= 0 else len(data)]).split()
    if len(words) < 2 or words[0] != b"GET":
        return False
    return words[1].split(b"?", 1)[0].decode("latin-1") in _HEALTH_PATHS


class _Server6(_Server):
    address_family = socket.AF_INET6


class ApiServer:
    """The HTTP API on its own threads; ``start()`` binds, ``stop()`` closes."""

    def __init__(
        self,
        context: ApiContext,
        bind: str = "127.0.0.1",
        port: int = 8790,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_connection_s: float = MAX_CONNECTION_S,
        max_per_peer: int = MAX_CONNECTIONS_PER_PEER,
        health_slots: int = HEALTH_SLOTS,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        handler = type("Handler", (_Handler,), {"context": context})
        server_class = _Server6 if ":" in bind else _Server
        self._server = server_class(
            (bind, port),
            handler,
            max_connections=max_connections,
            max_connection_s=max_connection_s,
            max_per_peer=max_per_peer,
            health_slots=health_slots,
            header_timeout_s=header_timeout_s,
        )
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="slurm-elastic-api", daemon=True
        )
        self._thread.start()
        log.info("api.listening", url=self.url)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
