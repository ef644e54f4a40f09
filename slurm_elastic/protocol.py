"""The daemon <-> job wire protocol (docs/CONTRACTS.md): messages and the one client.

The only module the job side (``slurm_elastic.agent``) shares with the daemon:

* the messages: a progress report (``ReportBody``), a resize instruction (``Instruction``)
  and an acknowledgement (``AckBody`` with ``AckStatus``), each with its JSON form and its
  bounds, so that what the agent sends and what the daemon accepts cannot drift apart;
* the paths of the job endpoints (``job_url``) and where the job side finds the daemon
  (``api_base``, ``$SLURM_ELASTIC_API``);
* the client: a MUNGE credential over the request body (``make_credential``, header
  ``HEADER``) and the HTTP calls (``post_authenticated``, ``get_json``).  The daemon's
  commands use the same client; checking a credential is the server's alone
  (``daemon.auth``).

``munge`` runs as a subprocess with a timeout: the cluster's MUNGE is installed wherever
Slurm is, and no binding to libmunge is needed.  This module is imported by the job-side
agent, so it imports nothing of the daemon and nothing heavier than pydantic.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from slurm_elastic.errors import AgentError

HEADER = "X-Slurm-Elastic-Munge"
API_ENV = "SLURM_ELASTIC_API"
DEFAULT_API = "http://127.0.0.1:8790"
MUNGE_TIMEOUT_S = 5.0

# --------------------------------------------------------------------------- messages

# Bounds of a report's numbers: far beyond any real training job, and small enough that no
# arithmetic of the model on them overflows a float (steps stay exact in a float64).
MAX_STEP = 10**15
MAX_NODES = 100_000
MAX_VALUE = 1e12  # metrics, rates, noise scale: magnitude
MAX_EPOCH = 1e9
MAX_BATCH = 10**9
MAX_TIME = 1e11  # seconds since the epoch (year 5138)
MAX_DETAIL = 2000  # characters of an ack's detail

JobEndpoint = Literal["report", "ack", "instruction"]


class Fallback(enum.StrEnum):
    """Why a job launched stop-free runs in the restart mode (a report's ``fallback``)."""

    # torchft kill requests from outside the job ended too many of its replica groups
    # (agent.launcher, OutsideKills).
    OUTSIDE_KILLS = "outside_kills"


class ReportBody(BaseModel):
    """``POST /v1/jobs/{id}/report``: ProgressReport fields; ``job_id`` comes from the path.

    Every number is bounded and finite (``inf`` and ``NaN`` included: 400): one report
    must never break the job's model.  ``time`` and ``nodes`` are checked and kept as the
    job's claim; the daemon records its own receive time and Slurm's size instead.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    step: int = Field(ge=0, le=MAX_STEP)
    nodes: int = Field(ge=1, le=MAX_NODES)
    time: float | None = Field(None, ge=0, le=MAX_TIME)  # the job's clock: not used
    epoch: float | None = Field(None, ge=0, le=MAX_EPOCH)
    loss: float | None = Field(None, ge=-MAX_VALUE, le=MAX_VALUE)  # or any metric
    metric_higher_is_better: bool = False
    samples_per_s: float | None = Field(None, ge=0, le=MAX_VALUE)  # shown in status only
    global_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    grad_noise_scale: float | None = Field(None, ge=0, le=MAX_VALUE)
    target_metric: float | None = Field(None, ge=-MAX_VALUE, le=MAX_VALUE)
    total_steps: int | None = Field(None, ge=1, le=MAX_STEP)
    # How the job resizes (``slurm-elastic run --mode``): its own claim, which prices only
    # its own resizes until the daemon has measured one.
    mode: Literal["torchrun", "torchft"] | None = None
    fallback: Fallback | None = None  # shown in status; a word of the daemon's, never text
    job_id: int | None = None  # tolerated when equal to the path's id


class InstructionKind(enum.StrEnum):
    SHRINK = "shrink"


class AckStatus(enum.StrEnum):
    READY = "ready"  # checkpoint written, workers on removed nodes stopped
    FAILED = "failed"  # the job cannot shrink gracefully now


@dataclass(frozen=True, slots=True)
class Instruction:
    """``GET /v1/jobs/{id}/instruction``: what the daemon asks of a job (the job id is the
    path's).  ``kind`` stays a string on the job side: an agent older than the daemon reads
    a kind it does not know and answers ``failed`` instead of crashing."""

    id: str
    kind: str  # an InstructionKind when the daemon posts it
    target_nodes: int
    keep_nodes: tuple[str, ...]
    deadline: float  # the daemon gives up waiting for an ack at this time
    # Companion jobs the shrink gives back: the job ends them itself before it acks, so
    # that they finish as completed jobs instead of being cancelled (Slurm's "CANCELLED"
    # error lines in their output).  The daemon cancels any still running once it applies.
    release: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": str(self.kind),
            "target_nodes": self.target_nodes,
            "keep_nodes": list(self.keep_nodes),
            "deadline": self.deadline,
            "release": list(self.release),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Instruction:
        try:
            return cls(
                id=str(data["id"]),
                kind=str(data["kind"]),
                target_nodes=int(data["target_nodes"]),
                keep_nodes=tuple(str(n) for n in data.get("keep_nodes") or ()),
                deadline=float(data["deadline"]),
                release=tuple(int(j) for j in data.get("release") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"malformed instruction from the daemon: {exc}") from None


class AckBody(BaseModel):
    """``POST /v1/jobs/{id}/ack``: the job's answer to one instruction."""

    model_config = ConfigDict(extra="forbid")

    instruction_id: str = Field(min_length=1, max_length=200)
    status: AckStatus
    step: int = Field(0, ge=0, le=MAX_STEP)  # bounded like a report's: it reaches REASONs
    detail: str = Field("", max_length=MAX_DETAIL)


def job_url(api: str, job_id: int, endpoint: JobEndpoint) -> str:
    """The URL of one of a job's endpoints under the daemon's base URL ``api``."""
    return f"{api.rstrip('/')}/v1/jobs/{job_id}/{endpoint}"


def api_base(environ: dict[str, str] | None = None) -> str:
    """The daemon's base URL as the launcher exports it (``$SLURM_ELASTIC_API``)."""
    env = os.environ if environ is None else environ
    return env.get(API_ENV, DEFAULT_API).rstrip("/")


# --------------------------------------------------------------------------- client


def body_digest(body: bytes) -> str:
    """What a credential's payload must be: the sha256 (hex) of the request body it signs."""
    return hashlib.sha256(body).hexdigest()


def run_munge_tool(
    argv: list[str], stdin: bytes | None, timeout_s: float, error: type[Exception]
) -> subprocess.CompletedProcess[bytes]:
    """Run munge or unmunge; a hang or a missing binary becomes ``error`` with one line."""
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise error(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise error(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def make_credential(
    payload: str, *, munge: str = "munge", timeout_s: float = MUNGE_TIMEOUT_S
) -> str:
    proc = run_munge_tool([munge, "-s", payload], None, timeout_s, AgentError)
    if proc.returncode != 0:
        raise AgentError(f"munge failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode("ascii").strip()


@dataclass(frozen=True, slots=True)
class ApiResponse:
    status: int
    body: dict[str, Any]


def post_authenticated(
    url: str, body: bytes | dict[str, Any], *, timeout_s: float = 10.0, munge: str = "munge"
) -> ApiResponse:
    """POST ``body`` (bytes, or a dict sent as JSON) with a fresh MUNGE credential over it.

    Returns the status and decoded JSON answer for every HTTP status, so that the caller
    can tell 403 (not yours) from 404 (unknown job); raises AgentError only when the daemon
    cannot be reached at all.
    """
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={
            "Content-Type": "application/json",
            HEADER: make_credential(body_digest(data), munge=munge),
        },
    )
    return _send(request, timeout_s)


def get_json(url: str, *, timeout_s: float = 10.0) -> ApiResponse:
    return _send(urllib.request.Request(url, method="GET"), timeout_s)


# What a reader's MUNGE credential for ``GET /v1/status`` vouches for (its sha256 is the
# payload): the daemon then shows that user what Slurm's PrivateData lets them see.
STATUS_REQUEST = b"GET /v1/status"


def get_status(url: str, *, timeout_s: float = 10.0, munge: str = "munge") -> ApiResponse:
    """``GET /v1/status`` as the calling user (a MUNGE credential over ``STATUS_REQUEST``),
    or as anyone when no credential can be made here (no munge, munged down).

    Raises:
        AgentError: the daemon cannot be reached.
    """
    headers = {}
    with contextlib.suppress(AgentError):  # none: read as anyone, what Slurm shows everybody
        headers[HEADER] = make_credential(body_digest(STATUS_REQUEST), munge=munge)
    return _send(urllib.request.Request(url, method="GET", headers=headers), timeout_s)


def _send(request: urllib.request.Request, timeout_s: float) -> ApiResponse:
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return ApiResponse(response.status, _decode(response.read()))
    except urllib.error.HTTPError as exc:
        return ApiResponse(exc.code, _decode(exc.read()))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AgentError(f"cannot reach {request.full_url}: {reason}") from None


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {"raw": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}
