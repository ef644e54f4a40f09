"""structlog set-up for every process: the daemon, the CLI and the job-side launcher.

JSON lines when stderr is not a TTY (journald, files, log shippers), a readable console
rendering on a TTY.  Log values carry user-written text (job names, comments, Slurm's
messages): JSON escapes control characters itself; the console rendering shows them
escaped through ``terminal.safe_text`` (``_terminal_safe``), never raw.

Event names are stable identifiers that operators alert on; the ``EVENTS`` tuple lists the
ones the service layer emits, so that a rename is a visible diff.
"""

from __future__ import annotations

import io
import logging
import sys
from typing import Literal, TextIO

import structlog

from slurm_elastic.terminal import safe_text

# Stable event names (the first positional argument of every log call).
EVENTS = (
    "daemon.starting",
    "daemon.stopping",
    "daemon.watchdog_too_short",
    "cycle.done",
    "cycle.failed",
    "resize.applied",
    "reclaim.done",
    "report.rejected",
    "ack.received",
    "config.reloaded",
    "config.reload_failed",
    "api.listening",
    "api.error",
    "api.aborted",
    "api.bad_request",
    "api.busy",
    "api.head_timeout",
    "api.head_too_large",
    "status.write_failed",
    "status.publish_failed",
    "sd_notify.failed",
    "journal.recovered",
)

# Console values rendered over several lines: a traceback, a stack.
_MULTILINE_KEYS = frozenset(("exception", "stack"))

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(
    level: str = "info",
    json_lines: bool | Literal["auto"] = "auto",
    stream: TextIO | None = None,
) -> None:
    """Configure structlog once per process (again on SIGHUP: level/format may change)."""
    out = stream if stream is not None else sys.stderr
    use_json = (not out.isatty()) if json_lines == "auto" else bool(json_lines)
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if use_json:
        # Tracebacks become one string field, so that every event stays one line.
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors += [
            _terminal_safe,
            structlog.dev.ConsoleRenderer(
                colors=out.isatty(), exception_formatter=_terminal_safe_traceback
            ),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def _terminal_safe(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Every string value as ``safe_text`` shows it (the console renderer prints str raw;
    other values it prints as ``repr``, which escapes already)."""
    return {
        key: safe_text(value, multiline=key in _MULTILINE_KEYS) if isinstance(value, str) else value
        for key, value in event.items()
    }


def _terminal_safe_traceback(out: TextIO, exc_info: structlog.typing.ExcInfo) -> None:
    """A plain traceback, its lines kept and anything else escaped: an exception's message
    may quote user-written text."""
    text = io.StringIO()
    structlog.dev.plain_traceback(text, exc_info)
    out.write(safe_text(text.getvalue(), multiline=True))
