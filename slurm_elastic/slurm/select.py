"""Pick the Slurm backend: ``make_backend(preference="auto"|"cli"|"pyslurm")``.

``auto`` uses pyslurm only if it is installed, imports, and was built for the
running Slurm's major.minor (pyslurm 22.5.x <-> Slurm 22.05.x); otherwise the
CLI backend, with one ``slurm.backend_selected`` log line saying why.  pyslurm
is looked up with ``importlib.util.find_spec`` first, so its absence costs no
import and no Slurm call.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from types import ModuleType
from typing import Any

import structlog

from slurm_elastic.errors import ConfigError, SlurmError
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.cli import CliBackend

log = structlog.get_logger(__name__)

PREFERENCES = ("auto", "cli", "pyslurm")
_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")


def versions_match(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm "22.5.1" matches Slurm "22.05.8" (same major and minor, as numbers)."""
    a, b = _MAJOR_MINOR.match(pyslurm_version), _MAJOR_MINOR.match(slurm_version)
    if a is None or b is None:
        return False
    return (int(a[1]), int(a[2])) == (int(b[1]), int(b[2]))


def choose(
    preference: str, *, pyslurm_version: str | None, slurm_version: str | None
) -> tuple[str, str]:
    """Pure decision: (``"cli"`` | ``"pyslurm"``, reason).  ``pyslurm_version`` None = absent."""
    if preference not in PREFERENCES:
        raise ConfigError(
            f"slurm backend must be one of {', '.join(PREFERENCES)}, not {preference!r}"
        )
    if preference == "cli":
        return "cli", "configured"
    if pyslurm_version is None:
        reason = "pyslurm is not installed or does not import"
    elif slurm_version is None:
        reason = "the running Slurm's version is unknown"
    elif not versions_match(pyslurm_version, slurm_version):
        reason = f"pyslurm {pyslurm_version} does not match Slurm {slurm_version}"
    else:
        return "pyslurm", f"pyslurm {pyslurm_version} matches Slurm {slurm_version}"
    if preference == "pyslurm":
        raise ConfigError(f"slurm backend 'pyslurm' is unusable: {reason}")
    return "cli", reason


def _import_pyslurm() -> tuple[ModuleType | None, str | None]:
    if importlib.util.find_spec("pyslurm") is None:
        return None, None
    try:
        module = importlib.import_module("pyslurm")
    except Exception as exc:  # a broken build raises anything from ImportError to OSError
        log.warning("slurm.pyslurm_import_failed", error=f"{type(exc).__name__}: {exc}")
        return None, None
    version = getattr(module, "__version__", None)
    return module, str(version) if version else "unknown"


def make_backend(
    preference: str = "auto",
    *,
    slurm_conf: str | None = None,
    dry_run: bool = False,
    timeout_s: float = 30.0,
    **kwargs: Any,
) -> SlurmBackend:
    """The backend to use.  ``kwargs`` go to ``CliBackend`` (history_format, ...)."""
    options: dict[str, Any] = {
        "slurm_conf": slurm_conf,
        "dry_run": dry_run,
        "timeout_s": timeout_s,
        **kwargs,
    }
    if preference == "cli":
        kind, reason = choose(preference, pyslurm_version=None, slurm_version=None)
        log.info("slurm.backend_selected", backend=kind, reason=reason)
        return CliBackend(**options)
    if slurm_conf is not None:
        os.environ.setdefault("SLURM_CONF", slurm_conf)  # libslurm reads it in-process
    module, pyslurm_version = _import_pyslurm()
    slurm_version: str | None = None
    cli = CliBackend(**options)
    if module is not None:
        try:
            slurm_version = cli.probe().version
        except SlurmError as exc:
            log.warning("slurm.probe_failed", error=str(exc))
    kind, reason = choose(preference, pyslurm_version=pyslurm_version, slurm_version=slurm_version)
    log.info("slurm.backend_selected", backend=kind, reason=reason)
    if kind == "pyslurm" and module is not None:
        from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(module, **options)
    return cli
