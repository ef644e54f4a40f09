"""Atomic checkpoint files: a reader never sees a half-written checkpoint.

Rank 0 writes ``ckpt-<step>.pt`` as a temporary file in the same directory, flushes and
fsyncs it, then ``os.replace``s it into place and fsyncs the directory.  A process killed at
any point leaves either the previous complete set or the new file, never a torn one; stray
temporaries (``.ckpt-*.tmp-*``) are ignored by readers and removed by ``prune``.

The serialisation itself is the caller's (``writer`` gets an open binary file): this module
stays free of torch so the launcher and tests can use it anywhere.  Files are listed,
written, opened and removed through ``agent.owndir`` only: a checkpoint is unpickled, so
one another user could place would run his code as the job's owner.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from slurm_elastic.agent.owndir import OwnDir
from slurm_elastic.errors import AgentError

_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory``, newest (highest step) first."""
    found = []
    for name in OwnDir(directory).names():
        match = _NAME.match(name)
        if match:
            found.append((int(match.group(1)), directory / name))
    return sorted(found, reverse=True)


def open_checkpoint(path: Path) -> BinaryIO:
    """``path`` open for reading, checked as this user's own (``OwnDir.open_read``).

    Raises:
        AgentError: it is gone, or not this user's alone.
    """
    handle = OwnDir(path.parent).open_read(path.name)
    if handle is None:
        raise AgentError(f"checkpoint {path} is gone")
    return handle


def atomic_write(path: Path, writer: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through a temporary file and a rename; returns ``path``."""
    return OwnDir(path.parent).write(path.name, writer)


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints and any stray temporaries."""
    own = OwnDir(directory)
    removed = []
    for _, path in list_checkpoints(directory)[max(1, keep) :]:
        own.unlink(path.name)
        removed.append(path)
    for name in own.names():
        if not fnmatch.fnmatchcase(name, ".ckpt-*.tmp-*"):
            continue
        pid = name.rsplit("-", 1)[-1]
        # A temporary of a live process is a write in progress; leave it alone.
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            own.unlink(name)
            removed.append(directory / name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
