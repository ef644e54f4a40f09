"""The one place that runs Slurm client commands.

Every call has a timeout, passes ``SLURM_CONF`` through, is counted, and turns
failures into the typed errors of :mod:`slurm_elastic.errors`:

* missing binary, "Unable to contact slurm controller", connection refused,
  socket timeouts towards slurmctld/slurmdbd  -> ``SlurmUnreachable``
* the command ran past its timeout                -> ``SlurmTimeout``
* a refusal Slurm calls temporary ("try again in a bit", a controller in standby, the
  database not connected, a rate limit: ``TEMPORARY``) -> ``SlurmBusy``
* any other non-zero exit                         -> ``SlurmRejected`` carrying
  Slurm's own message (the last meaningful stderr line)

Output is decoded as UTF-8 with invalid bytes replaced (U+FFFD): job names and
comments are user data that Slurm passes through byte for byte, and one job's
non-UTF-8 comment must not make the whole ``squeue --json`` unreadable (a strict
decode raised ``UnicodeDecodeError`` for every job).  pyslurm's dictionaries
decode the same way, so both backends see the same text.

Actions can run in dry-run mode (as torchx does): the command is logged and
recorded in ``dry_run_log`` and never executed.  Reads always run, so a
dry-run daemon still sees the real cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from slurm_elastic.errors import SlurmBusy, SlurmRejected, SlurmTimeout, SlurmUnreachable

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 30.0

# stderr fragments meaning "the request never reached a working controller/database".
# Nothing was applied in these cases, which is what makes retrying an action safe.
_UNREACHABLE = re.compile(
    r"unable to contact slurm controller|connection refused|"
    r"socket timed out|unable to establish connection|"
    r"slurm_persist_conn_open|problem talking to the database|"
    r"could not establish a connection|slurmdbd: .*not running|"
    r"zero bytes were transmitted or received|"
    r"couldn't find the specified plugin|munge.*(?:fail|error)",
    re.IGNORECASE,
)
# Slurm's answers that say "not now": the request reached slurmctld, nothing was applied,
# and the same request may succeed later without anything about the job changing.  The
# texts are libslurm's error table (src/common/slurm_errno.c, the same on 22.05, 24.11 and
# 26.05; what scontrol and sbatch print and what pyslurm's errors carry), by error code:
_TEMPORARY_MESSAGES = (
    # ESLURM_JOB_SETTING_DB_INX: right after a slurmctld restart, until slurmdbd has given
    # the job its accounting index (issue 44: seen on 22.05 for tens of seconds)
    "the DB index is being set",
    "Job can not be altered now",  # ESLURM_TRANSITION_STATE_NO_UPDATE
    "Unable to create job record",  # ESLURM_ERROR_ON_DESC_TO_RECORD_COPY (sbatch)
    "Slurm temporarily unable to accept job",  # sbatch's own retry message
    "Rate limit exceeded",  # SLURMCTLD_COMMUNICATIONS_BACKOFF (23.02+ rl_enable)
    "in standby mode",  # ESLURM_IN_STANDBY_MODE, ESLURM_IN_STANDBY_USE_BACKUP
    "Unable to connect to database",  # ESLURM_DB_CONNECTION
    "Database connection reference is invalid",  # ESLURM_DB_CONNECTION_INVALID
    "PrologSlurmctld is still running",  # ESLURM_PROLOG_RUNNING
    "Resource temporarily unavailable",  # EAGAIN
    "Switch resources currently not available",  # ESLURM_INTERCONNECT_BUSY
    "Job locked by another sibling",  # ESLURM_FED_JOB_LOCK
    "System submissions disabled",  # ESLURM_SUBMISSIONS_DISABLED (an admin's pause)
)
# ... and any answer that says to try again (a message of a later Slurm, worded the same way).
TEMPORARY = re.compile(
    "|".join(re.escape(m) for m in _TEMPORARY_MESSAGES) + r"|\btry again\b|\bretry\b",
    re.IGNORECASE,
)
# "squeue: error: " / "scontrol: " / "sbatch: error: " prefixes say nothing useful.
_PREFIX = re.compile(r"^(?:\w+: )?(?:error: |fatal: )?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class CommandResult:
    """One Slurm command's argv, exit status, output and wall time."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    dry_run: bool = False


def is_unreachable(message: str) -> bool:
    """Whether Slurm's ``message`` means the request never reached a working
    controller/database (so nothing was applied).  Shared with the pyslurm backend,
    whose RPC errors carry the same libslurm texts."""
    return _UNREACHABLE.search(message) is not None


def is_temporary(message: str) -> bool:
    """Whether Slurm's ``message`` is a refusal Slurm calls temporary (``TEMPORARY``):
    nothing applied, ask again later.  Shared with the pyslurm backend."""
    return TEMPORARY.search(message) is not None


def slurm_error(
    what: str, message: str, *, command: tuple[str, ...] = ()
) -> SlurmUnreachable | SlurmBusy | SlurmRejected:
    """The typed error for Slurm's answer ``message`` to a failed request (``what`` names
    it in the error's text): ``SlurmUnreachable`` when it never reached a working
    controller or database, ``SlurmBusy`` when Slurm calls its refusal temporary, else
    ``SlurmRejected`` (a fact about the request)."""
    if is_unreachable(message):
        return SlurmUnreachable(f"{what}: Slurm unreachable: {message}", command=command)
    if is_temporary(message):
        return SlurmBusy(
            f"{what}: Slurm asked to try again: {message}", slurm_message=message, command=command
        )
    return SlurmRejected(f"{what} rejected: {message}", slurm_message=message, command=command)


def slurm_message(stderr: str) -> str:
    """Slurm's own one-line message from a command's stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return ""
    # scontrol prints the generic "slurm_update error: X" after any detail lines;
    # keep the most specific line that names the problem: the last one.
    return _PREFIX.sub("", lines[-1], count=1).strip()


@dataclass
class SlurmRunner:
    """Runs Slurm commands; counts them; optionally only records actions.

    ``slurm_conf`` (if given) is exported as ``SLURM_CONF``; otherwise the
    caller's environment (including any ``SLURM_CONF``) is inherited.
    """

    slurm_conf: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    dry_run: bool = False
    calls: int = 0
    read_calls: int = 0
    action_calls: int = 0
    dry_run_log: list[tuple[str, ...]] = field(default_factory=list)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = self.slurm_conf
        if extra:
            env.update(extra)
        return env

    def read(
        self, argv: Sequence[str], *, timeout_s: float | None = None, label: str | None = None
    ) -> CommandResult:
        """Run a read-only command (never skipped in dry-run mode).

        ``label`` names the command in error messages (default: its first three words),
        for a caller whose options would otherwise hide what it ran."""
        self.read_calls += 1
        return self._run(tuple(argv), timeout_s=timeout_s, stdin=None, label=label)

    def act(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        """Run a command that changes Slurm state; in dry-run mode only record it."""
        command = tuple(argv)
        if self.dry_run:
            self.dry_run_log.append(command)
            log.info("slurm.dry_run", command=" ".join(command))
            return CommandResult(command, 0, "", "", 0.0, dry_run=True)
        self.action_calls += 1
        return self._run(command, timeout_s=timeout_s, stdin=stdin)

    def _run(
        self,
        argv: tuple[str, ...],
        *,
        timeout_s: float | None,
        stdin: str | None,
        label: str | None = None,
    ) -> CommandResult:
        self.calls += 1
        what = label or " ".join(argv[:3])
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=limit,
                env=self.env(),
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmUnreachable(
                f"Slurm command {argv[0]!r} not found (is slurm-client installed?)",
                command=argv,
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmTimeout(f"{what} did not finish within {limit:g}s", command=argv) from exc
        except OSError as exc:
            raise SlurmUnreachable(f"cannot run {argv[0]!r}: {exc}", command=argv) from exc
        elapsed = time.monotonic() - started
        result = CommandResult(argv, proc.returncode, proc.stdout, proc.stderr, elapsed)
        log.debug("slurm.command", command=" ".join(argv), rc=proc.returncode, elapsed_s=elapsed)
        if proc.returncode != 0:
            raise _classify(result, what)
        return result


def _classify(result: CommandResult, what: str) -> SlurmUnreachable | SlurmBusy | SlurmRejected:
    message = slurm_message(result.stderr) or slurm_message(result.stdout)
    if is_unreachable(result.stderr):
        return SlurmUnreachable(
            f"{what}: Slurm unreachable: {message or 'no message'}", command=result.argv
        )
    if not message:
        status = f"exit status {result.returncode}"
        return SlurmRejected(f"{what} rejected: {status}", command=result.argv)
    return slurm_error(what, message, command=result.argv)
