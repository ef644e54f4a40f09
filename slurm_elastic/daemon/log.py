"""structlog set-up for the daemon and the CLI.

JSON lines when stderr is not a TTY (journald, files, log shippers), a readable console
rendering on a TTY.  Event names are stable identifiers that operators alert on; the
``EVENTS`` tuple lists the ones the service layer emits, so that a rename is a visible diff.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

# Stable event names (the first positional argument of every log call).
EVENTS = (
    "daemon.starting",
    "daemon.stopping",
    "daemon.watchdog_too_short",
    "cycle.done",
    "cycle.failed",
    "resize.applied",
    "report.rejected",
    "ack.received",
    "config.reloaded",
    "config.reload_failed",
    "api.listening",
    "api.error",
    "api.aborted",
    "api.bad_request",
    "api.busy",
    "status.write_failed",
    "status.publish_failed",
    "sd_notify.failed",
)

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
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
