"""Pick the Slurm backend: ``make_backend(preference="auto"|"cli"|"pyslurm")``.

``auto`` uses pyslurm only if one imports and was built for the running Slurm's
major.minor (pyslurm 22.5.x <-> Slurm 22.05.x); otherwise the CLI backend, with one
``slurm.backend_selected`` log line saying why.

Where pyslurm comes from: PyPI has no pyslurm for the Slurm releases this project runs
on, so ``scripts/build-pyslurm.sh`` builds one per release into
``/var/lib/slurm-elastic/pyslurm/<major.minor>`` (``22.05``, ``24.11``), outside
site-packages.  The daemon itself adds the directory for the *running* Slurm to
``sys.path`` (config ``slurm.pyslurm_path``, the parent directory; ``""`` turns the
search off) rather than relying on ``PYTHONPATH``: the right build depends on the Slurm
version, which the daemon learns at start anyway, so a Slurm upgrade needs no edit of
the systemd unit -- the daemon picks the matching build, or falls back to the CLI with
a log line saying which build is missing.  A pyslurm that already imports (from
``PYTHONPATH``, e.g. set by a chroot's environment, or from site-packages) wins over the
search; a version mismatch then means the CLI backend.

Cost: without any build (and no importable pyslurm) there is no Slurm call and no import;
with builds present, one ``scontrol --version`` tells which one to load.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from slurm_elastic.errors import ConfigError, SlurmError
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend, libslurm_conf

log = structlog.get_logger(__name__)

PREFERENCES = ("auto", "cli", "pyslurm")
PYSLURM_BASE = Path("/var/lib/slurm-elastic/pyslurm")
_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")


def versions_match(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm "22.5.1" matches Slurm "22.05.8" (same major and minor, as numbers)."""
    a, b = _MAJOR_MINOR.match(pyslurm_version), _MAJOR_MINOR.match(slurm_version)
    if a is None or b is None:
        return False
    return (int(a[1]), int(a[2])) == (int(b[1]), int(b[2]))


def slurm_release(slurm_version: str) -> str | None:
    """Slurm "22.05.8" -> "22.05", the name of its pyslurm build directory."""
    match = _MAJOR_MINOR.match(slurm_version)
    return f"{int(match[1]):02d}.{int(match[2]):02d}" if match else None


def pyslurm_dir(slurm_version: str, base: Path | str = PYSLURM_BASE) -> Path | None:
    """The directory holding the pyslurm build for Slurm ``slurm_version`` under ``base``
    (``/var/lib/slurm-elastic/pyslurm/22.05`` for 22.05.8), None when there is none.

    Put on ``sys.path`` (or ``PYTHONPATH``) to import that pyslurm; the tests use it too.
    """
    release = slurm_release(slurm_version)
    if release is None:
        return None
    path = Path(base) / release
    return path if (path / "pyslurm" / "__init__.py").is_file() else None


def _has_builds(base: Path | str | None) -> bool:
    if not base:
        return False
    try:
        return any((p / "pyslurm" / "__init__.py").is_file() for p in Path(base).iterdir())
    except OSError:  # no such directory (no build installed), or unreadable
        return False


def choose(
    preference: str,
    *,
    pyslurm_version: str | None,
    slurm_version: str | None,
    why_absent: str | None = None,
) -> tuple[str, str]:
    """Pure decision: (``"cli"`` | ``"pyslurm"``, reason).  ``pyslurm_version`` None = absent
    (``why_absent`` says why when it was not even tried)."""
    if preference not in PREFERENCES:
        raise ConfigError(
            f"slurm backend must be one of {', '.join(PREFERENCES)}, not {preference!r}"
        )
    if preference == "cli":
        return "cli", "configured"
    if pyslurm_version is None and why_absent:
        reason = why_absent
    elif pyslurm_version is None:
        reason = "pyslurm is not installed or does not import"
        if slurm_version is not None:
            reason += f" (no build for Slurm {slurm_version})"
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
    try:
        module = importlib.import_module("pyslurm")
    except Exception as exc:  # a broken build raises anything from ImportError to OSError
        log.warning("slurm.pyslurm_import_failed", error=f"{type(exc).__name__}: {exc}")
        return None, None
    version = getattr(module, "__version__", None)
    return module, str(version) if version else "unknown"


def _slurm_version(cli: CliBackend) -> str | None:
    try:
        return cli.slurm_version()
    except SlurmError as exc:
        log.warning("slurm.probe_failed", error=str(exc))
        return None


def find_pyslurm(
    cli: CliBackend, base: Path | str | None = PYSLURM_BASE
) -> tuple[ModuleType | None, str | None, str | None, str | None]:
    """(pyslurm module, its version, the running Slurm's version, why pyslurm was not
    tried); None for what is not known.  An importable pyslurm is used as it is; otherwise
    the build for the running Slurm under ``base`` is put on ``sys.path`` and imported
    (module doc).  Never imported without a readable slurm.conf: pyslurm's import runs
    libslurm's ``slurm_init``, which then retries for 60 s and exits the process."""
    importable = importlib.util.find_spec("pyslurm") is not None
    if not importable and not _has_builds(base):
        return None, None, None, None  # nothing to look for: no Slurm call
    slurm_version = _slurm_version(cli)
    path = None
    if not importable:
        path = pyslurm_dir(slurm_version, base or PYSLURM_BASE) if slurm_version else None
        if path is None:
            return None, None, slurm_version, None
    conf = libslurm_conf(cli.runner.slurm_conf)
    if "pyslurm" not in sys.modules and not os.path.isfile(conf):
        return None, None, slurm_version, f"no slurm.conf at {conf} for libslurm"
    if path is not None:
        sys.path.insert(0, str(path))
    module, version = _import_pyslurm()
    return module, version, slurm_version, None


def make_backend(
    preference: str = "auto",
    *,
    slurm_conf: str | None = None,
    dry_run: bool = False,
    timeout_s: float = 30.0,
    pyslurm_path: Path | str | None = PYSLURM_BASE,
    **kwargs: Any,
) -> SlurmBackend:
    """The backend to use.  ``pyslurm_path``: where per-release pyslurm builds live
    (None or "" = do not look); ``kwargs`` go to ``CliBackend`` (history_format, ...)."""
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
        os.environ.setdefault("SLURM_CONF", slurm_conf)  # libslurm reads it at import
    cli = CliBackend(**options)
    module, pyslurm_version, slurm_version, why = find_pyslurm(cli, pyslurm_path)
    kind, reason = choose(
        preference, pyslurm_version=pyslurm_version, slurm_version=slurm_version, why_absent=why
    )
    where = os.path.dirname(os.path.dirname(module.__file__ or "")) if module else None
    log.info("slurm.backend_selected", backend=kind, reason=reason, pyslurm_from=where)
    if kind == "pyslurm" and module is not None:
        return PyslurmBackend(module, **options)
    return cli
