"""The daemon's HTTP API (docs/CONTRACTS.md): job reports and acks in, instructions, status,
metrics and health out.

Stdlib ``ThreadingHTTPServer``: a handful of small JSON requests per job per minute needs no
framework.  Every request is answered with JSON (or Prometheus text) and a status code; no
input can crash the server: bodies are bounded, parsed with pydantic, and every rejection is
a log line (``report.rejected``) and a metric.

The API never calls Slurm.  Who owns a job comes from the latest snapshot the loop took
(``owner_of``), so a burst of reports costs no Slurm calls.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import structlog
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_elastic.daemon import auth
from slurm_elastic.daemon.instructions import Ack, AckStatus, InstructionBoard
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.errors import AuthError
from slurm_elastic.types import ProgressReport

MAX_BODY_BYTES = 64 * 1024
MAX_CONCURRENT_AUTH = 16
_REQUEST_TIMEOUT_S = 10.0  # a client that stalls mid-request frees its thread after this
_JOB_PATH = re.compile(r"^/v1/jobs/(\d{1,12})/(report|ack|instruction)$")

log = structlog.get_logger("slurm_elastic.api")


class _ReportBody(BaseModel):
    """``POST /v1/jobs/{id}/report``: ProgressReport fields; ``job_id`` comes from the path."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    nodes: int = Field(ge=1)
    time: float | None = Field(None, allow_inf_nan=False)  # when absent: time received
    epoch: float | None = Field(None, ge=0, allow_inf_nan=False)
    loss: float | None = None  # NaN allowed: a diverged run is worth reporting
    metric_higher_is_better: bool = False
    samples_per_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    global_batch: int | None = Field(None, ge=1)
    grad_noise_scale: float | None = Field(None, allow_inf_nan=False)
    target_metric: float | None = None
    total_steps: int | None = Field(None, ge=1)
    job_id: int | None = None  # tolerated when equal to the path's id


class _AckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instruction_id: str = Field(min_length=1, max_length=200)
    status: Literal["ready", "failed"]
    step: int = Field(0, ge=0)
    detail: str = Field("", max_length=2000)


@dataclass
class ApiContext:
    """What the handlers read and write; owned by the service, shared with the loop."""

    reports: ReportStore
    board: InstructionBoard
    metrics: DaemonMetrics
    owner_of: Callable[[int], int | None]  # job id -> owner uid, from the latest snapshot
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
        document = self.context.status_document()
        if document is None:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "no cycle has completed yet")
        self._json(HTTPStatus.OK, document)

    def _report(self, job_id: int, payload: dict[str, Any]) -> None:
        try:
            body = _ReportBody.model_validate(payload)
        except ValidationError as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, _first_error(exc), reason="bad_body") from None
        if body.job_id is not None and body.job_id != job_id:
            raise _HttpError(
                HTTPStatus.BAD_REQUEST,
                "job_id in the body differs from the path",
                reason="bad_body",
            )
        fields = body.model_dump(exclude={"job_id", "time"})
        now = self.context.clock()
        report = ProgressReport(job_id=job_id, time=body.time if body.time else now, **fields)
        self.context.reports.add(report)
        self.context.metrics.reports.inc()
        self._json(HTTPStatus.OK, {"accepted": True})

    def _ack(self, job_id: int, payload: dict[str, Any]) -> None:
        try:
            body = _AckBody.model_validate(payload)
        except ValidationError as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, _first_error(exc), reason="bad_body") from None
        ack = Ack(
            instruction_id=body.instruction_id,
            job_id=job_id,
            status=AckStatus(body.status),
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
        credential = self.headers.get(auth.HEADER)
        try:
            if not credential:
                raise auth.Unauthenticated(f"no {auth.HEADER} header")
            decoded = auth.decode_credential(credential.strip(), unmunge=self.context.unmunge)
            auth.verify_body(decoded, body)
            owner = self.context.owner_of(job_id)
            if owner is None:
                raise _HttpError(HTTPStatus.NOT_FOUND, f"job {job_id} is not known to the daemon")
            auth.authorize(decoded, owner, job_id)
        except auth.Forbidden as exc:
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


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{loc}: {err['msg']}"


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class ApiServer:
    """The HTTP API on its own threads; ``start()`` binds, ``stop()`` closes."""

    def __init__(self, context: ApiContext, bind: str = "127.0.0.1", port: int = 8790) -> None:
        handler = type("Handler", (_Handler,), {"context": context})
        server_class = _Server6 if ":" in bind else ThreadingHTTPServer
        self._server = server_class((bind, port), handler)
        self._server.daemon_threads = True
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
