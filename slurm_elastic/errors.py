"""Typed error hierarchy.

Every failure the daemon or CLI can meet surfaces as one of these, with a
one-line message a human can act on.  Raw ``subprocess`` / ``OSError`` /
``json`` exceptions never escape the layer that caught them.

    SlurmElasticError
    ├── ConfigError            bad configuration (names file, key, reason)
    ├── MarkerError            malformed elastic flag in a job comment
    ├── SlurmError             anything from talking to Slurm
    │   ├── SlurmUnreachable   slurmctld/slurmdbd down, command missing
    │   ├── SlurmRejected      Slurm said no (carries Slurm's own message)
    │   ├── SlurmTimeout       a client command exceeded its timeout
    │   ├── SlurmParseError    output we could not understand (garbage, truncated, new format)
    │   └── ActionRefused      an invalid action the backend would not send (nothing sent)
    ├── SolverError            a policy could not produce a plan
    ├── AuthError              a report/ack failed MUNGE authentication or authorisation
    ├── AgentError             job-side launcher failures
    └── StateError             the state directory or the journal cannot be used (names the file)
"""

from __future__ import annotations


class SlurmElasticError(Exception):
    """Base class: every error carries a one-line, human-readable message."""


class ConfigError(SlurmElasticError):
    pass


class MarkerError(SlurmElasticError, ValueError):
    pass


class SlurmError(SlurmElasticError):
    def __init__(self, message: str, *, command: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.command = command


class SlurmUnreachable(SlurmError):
    pass


class SlurmRejected(SlurmError):
    """Slurm refused the request; ``slurm_message`` is Slurm's own text."""

    def __init__(
        self, message: str, *, slurm_message: str = "", command: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, command=command)
        self.slurm_message = slurm_message


class SlurmTimeout(SlurmError):
    pass


class SlurmParseError(SlurmError):
    pass


class ActionRefused(SlurmError, ValueError):
    """The backend refused to send an invalid action to Slurm (e.g. shrink below one
    node, or shrink a job that is not running); nothing was sent."""


class SolverError(SlurmElasticError):
    pass


class AuthError(SlurmElasticError):
    pass


class AgentError(SlurmElasticError):
    pass


class StateError(SlurmElasticError):
    """The daemon's state directory or journal cannot be written or trusted (read-only, full,
    corrupt).  The daemon stops on it: it never acts on what it cannot write down first."""
