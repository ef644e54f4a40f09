"""Typed error hierarchy.

Every failure the daemon or CLI can meet surfaces as one of these, with a
one-line message a human can act on.  Raw ``subprocess`` / ``OSError`` /
``json`` exceptions never escape the layer that caught them.

    SlurmElasticError
    ├── ConfigError            bad configuration (names file, key, reason)
    ├── MarkerError            malformed elastic flag in a job comment
    │   └── OutOfReach         a well-formed flag whose minimum the partitions never give
    ├── SlurmError             anything from talking to Slurm
    │   ├── SlurmUnreachable   slurmctld/slurmdbd down, command missing
    │   ├── SlurmRejected      Slurm said no (carries Slurm's own message)
    │   ├── SlurmBusy          Slurm said "not now, try again" (nothing applied; retried)
    │   ├── SlurmTimeout       a client command exceeded its timeout
    │   ├── SlurmParseError    output we could not understand (garbage, truncated, new format)
    │   └── ActionRefused      an invalid action the backend would not send (nothing sent)
    ├── SolverError            a policy could not produce a plan
    │   └── SolverTimeout      the isolated solve was killed at its deadline with nothing
    ├── AuthError              a report/ack failed MUNGE authentication or authorisation
    │   ├── Unauthenticated    no credential, or not one for this body (HTTP 401)
    │   └── Forbidden          a valid credential of a user who may not act on the job (403)
    ├── ReportRejected         a progress report body that is not a valid report (HTTP 400)
    ├── MissingExtra           an optional dependency (a pyproject extra) is not installed
    ├── AgentError             job-side launcher failures
    └── StateError             the state directory or the journal cannot be used (names the file)

Not here, on purpose: the CLI's exit-code carriers (``click.ClickException`` subclasses in
``daemon/commands.py``, presentation of the errors above) and the HTTP handler's private
status signal (``daemon/api.py``), which never leave the function that raises them.
"""

from __future__ import annotations


class SlurmElasticError(Exception):
    """Base class: every error carries a one-line, human-readable message."""


class ConfigError(SlurmElasticError):
    """A configuration that cannot be used: names the file, the dotted key and the reason."""


class MarkerError(SlurmElasticError, ValueError):
    """A job comment's elastic marker that cannot be read (the message says which token)."""


class OutOfReach(MarkerError):
    """A well-formed marker whose minimum is more than the job's partitions can ever give."""


class SlurmError(SlurmElasticError):
    """Anything that went wrong talking to Slurm; ``command`` is the argv, when there was one."""

    def __init__(self, message: str, *, command: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.command = command


class SlurmUnreachable(SlurmError):
    """slurmctld or slurmdbd is down, or a Slurm command is missing."""


class SlurmRejected(SlurmError):
    """Slurm refused the request; ``slurm_message`` is Slurm's own text."""

    def __init__(
        self, message: str, *, slurm_message: str = "", command: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, command=command)
        self.slurm_message = slurm_message


class SlurmBusy(SlurmError):
    """Slurm declined the request for now and said to ask again (a temporary refusal:
    "try again in a bit", a controller in standby, a database being connected, a rate
    limit).  Nothing was applied, so the request is retried with backoff and never kept
    as a fact about the job (``slurm.runner.TEMPORARY`` lists the answers).  Not a
    ``SlurmRejected``: whatever treats a refusal as final must not see this one."""

    def __init__(
        self, message: str, *, slurm_message: str = "", command: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, command=command)
        self.slurm_message = slurm_message


class SlurmTimeout(SlurmError):
    """A Slurm client command ran past its timeout (and was killed)."""


class SlurmParseError(SlurmError):
    """Slurm's output could not be understood (garbage, truncated, an unknown format)."""


class ActionRefused(SlurmError, ValueError):
    """The backend refused to send an invalid action to Slurm (e.g. shrink below one
    node, or shrink a job that is not running); nothing was sent."""


class SolverError(SlurmElasticError):
    """A policy could not produce a plan, or was given a problem that is not valid."""


class SolverTimeout(SolverError):
    """The isolated solve did not answer before its deadline and was killed."""


class AuthError(SlurmElasticError):
    """A report or acknowledgement failed MUNGE authentication or authorisation."""


class Unauthenticated(AuthError):
    """No credential, or one munged does not vouch for this body: HTTP 401."""


class Forbidden(AuthError):
    """A valid credential from a user who may not act on this job: HTTP 403."""


class ReportRejected(SlurmElasticError, ValueError):
    """A report body that is not a valid report (HTTP 400); the message says why."""


class MissingExtra(SlurmElasticError, ImportError):
    """A feature whose third-party package is an optional extra that is not installed."""

    def __init__(self, feature: str, module: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs {module}, from the {extra!r} extra: "
            f"pip install 'slurm-elastic[{extra}]'"
        )


class AgentError(SlurmElasticError):
    """A job-side failure: the launcher, the agent's daemon client, or the job directory."""


class StateError(SlurmElasticError):
    """The daemon's state directory or journal cannot be written or trusted (read-only, full,
    corrupt).  The daemon stops on it: it never acts on what it cannot write down first."""
