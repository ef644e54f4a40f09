"""Exit statuses of ``daemon``, ``status``, ``plan`` and ``explain`` (docs/cli-exit-codes.md).

Scripts and monitoring run these commands unattended, so a failure must show in the exit
status, not only in text: a ``{"ok": false}`` printed with exit 0 reads as success to
``set -e``, cron and systemd.  Failures of the *cycle* get their own codes, apart from
click's 1 (could not run at all) and 2 (bad usage), because the command did run and its
output (the JSON document, the table) is still printed and worth reading.

Standard library only: ``slurm-elastic --help`` imports the command modules that use it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit statuses of the daemon's commands (docs/cli-exit-codes.md)."""

    OK = 0
    # click's own: ``Error: ...`` (bad config, no status to read, unknown job, start-up error).
    ERROR = 1
    # click's own: bad option or argument.
    USAGE = 2
    # The cycle failed (Slurm unreachable, output not understood, a bug in the cycle): the
    # daemon's one ``--once`` cycle, ``plan``'s dry run, or the daemon's latest cycle as
    # ``status``/``explain`` read it (their rows are then from the last good cycle).
    CYCLE_FAILED = 3
    # The daemon's status is older than 3 x its interval + slurm.timeout_s (the /healthz
    # window): it is probably not running, so every row may be out of date.
    STALE = 4
    # ``daemon``: the state directory or the journal cannot be used (read-only, full,
    # corrupt), at start-up or when a journal write failed while running.  One line names
    # the file; systemd's Restart=on-failure retries, and a restart reconciles with Slurm.
    STATE = 5
