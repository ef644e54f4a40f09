"""MUNGE authentication of job reports and acknowledgements (both sides of the API).

The caller (job side) makes a credential with ``munge -s <sha256-hex of the body>`` and sends it
in the ``X-Slurm-Elastic-Munge`` header.  The daemon decodes it with ``unmunge``, which tells the
UID munged vouched for; the credential is accepted only if its payload is the digest of the very
body it came with (so it cannot be moved to another request) and munged has not seen it before
(munged itself refuses replays).  Authorisation (is this UID the job's owner?) is a separate,
pure step.

Both ``munge`` and ``unmunge`` run as subprocesses with a timeout: the cluster's MUNGE is
already installed wherever Slurm is, and no binding to libmunge is needed.

This module is imported by the job-side agent: it must stay free of heavy imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from slurm_elastic.errors import AgentError, Forbidden, Unauthenticated

HEADER = "X-Slurm-Elastic-Munge"
ROOT_UID = 0
_MUNGE_TIMEOUT_S = 5.0
_NUMBER = re.compile(r"\((\d+)\)\s*$")


@dataclass(frozen=True, slots=True)
class Credential:
    uid: int
    gid: int
    payload: str


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _run_tool(
    argv: list[str], stdin: bytes | None, timeout_s: float, error: type[Exception]
) -> subprocess.CompletedProcess[bytes]:
    """Run munge/unmunge; a hang or a missing binary becomes ``error`` with one line."""
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise error(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise error(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def decode_credential(
    credential: str, *, unmunge: str = "unmunge", timeout_s: float = _MUNGE_TIMEOUT_S
) -> Credential:
    """Ask munged (through ``unmunge``) whose credential this is; Unauthenticated if invalid."""
    if not credential or len(credential) > 4096 or not credential.isascii():
        raise Unauthenticated("missing or malformed MUNGE credential")
    proc = _run_tool(
        [unmunge, "--keys=STATUS,UID,GID"], credential.encode("ascii"), timeout_s, Unauthenticated
    )
    # stdout: "KEY: text (number)" lines, a blank line, then the payload.
    head, _, payload = proc.stdout.decode(errors="replace").partition("\n\n")
    meta = {
        key.strip(): value.strip()
        for key, _, value in (ln.partition(":") for ln in head.splitlines())
    }
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip().splitlines()
        reason = meta.get("STATUS") or (stderr[-1] if stderr else f"exit status {proc.returncode}")
        raise Unauthenticated(f"MUNGE credential rejected: {reason.removeprefix('unmunge: ')}")
    try:
        return Credential(uid=_number(meta["UID"]), gid=_number(meta["GID"]), payload=payload)
    except (KeyError, ValueError):
        raise Unauthenticated("unmunge printed no UID/GID") from None


def _number(value: str) -> int:
    """``"nobody (65534)"`` -> 65534 (a name may be missing from passwd, the number never is)."""
    match = _NUMBER.search(value)
    if match is None:
        raise ValueError(value)
    return int(match.group(1))


def verify_body(credential: Credential, body: bytes) -> None:
    if credential.payload.strip() != body_digest(body):
        raise Unauthenticated("MUNGE payload is not the sha256 of the request body")


def authorize(credential: Credential, owner_uid: int, job_id: int) -> None:
    """Only the job's owner (or root) may report on or acknowledge for a job."""
    if credential.uid not in (owner_uid, ROOT_UID):
        raise Forbidden(f"uid {credential.uid} may not act on job {job_id} (owner uid {owner_uid})")


# --------------------------------------------------------------------------- job side


def make_credential(
    payload: str, *, munge: str = "munge", timeout_s: float = _MUNGE_TIMEOUT_S
) -> str:
    proc = _run_tool([munge, "-s", payload], None, timeout_s, AgentError)
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


def api_base(environ: dict[str, str] | None = None) -> str:
    """The daemon's base URL as the launcher exports it (``$SLURM_ELASTIC_API``)."""
    env = os.environ if environ is None else environ
    return env.get("SLURM_ELASTIC_API", "http://127.0.0.1:8790").rstrip("/")
