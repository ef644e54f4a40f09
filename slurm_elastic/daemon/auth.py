"""MUNGE authentication of job reports and acknowledgements: the daemon's side.

The caller (job side, ``protocol.make_credential``) makes a credential with
``munge -s <sha256-hex of the body>`` and sends it in the ``X-Slurm-Elastic-Munge`` header.
The daemon decodes it with ``unmunge``, which tells the UID munged vouched for; the
credential is accepted only if its payload is the digest of the very body it came with (so
it cannot be moved to another request) and munged has not seen it before (munged itself
refuses replays).  Authorisation (is this UID the job's owner?) is a separate, pure step.

``unmunge`` runs as a subprocess with a timeout, like the client's ``munge``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_elastic.errors import Forbidden, Unauthenticated
from slurm_elastic.protocol import MUNGE_TIMEOUT_S, body_digest, run_munge_tool

ROOT_UID = 0
_NUMBER = re.compile(r"\((\d+)\)\s*$")


@dataclass(frozen=True, slots=True)
class Credential:
    uid: int
    gid: int
    payload: str


def decode_credential(
    credential: str, *, unmunge: str = "unmunge", timeout_s: float = MUNGE_TIMEOUT_S
) -> Credential:
    """Ask munged (through ``unmunge``) whose credential this is; Unauthenticated if invalid."""
    if not credential or len(credential) > 4096 or not credential.isascii():
        raise Unauthenticated("missing or malformed MUNGE credential")
    proc = run_munge_tool(
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
