"""Atomic checkpoint files: a reader never sees a half-written checkpoint.

Rank 0 writes ``ckpt-<step>.pt`` as a temporary file in the same directory, flushes and
fsyncs it, then ``os.replace``s it into place and fsyncs the directory.  A process killed at
any point leaves either the previous complete set or the new file, never a torn one; stray
temporaries (``.ckpt-*.tmp-*``) are ignored by readers and removed by ``prune``.

The serialisation itself is the caller's (``writer`` gets an open binary file): this module
stays free of torch so the launcher and tests can use it anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory``, newest (highest step) first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def atomic_write(path: Path, writer: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through a temporary file and a rename; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return path


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints and any stray temporaries."""
    removed = []
    for _, path in list_checkpoints(directory)[max(1, keep) :]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    for stray in directory.glob(".ckpt-*.tmp-*"):
        pid = stray.name.rsplit("-", 1)[-1]
        # A temporary of a live process is a write in progress; leave it alone.
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                removed.append(stray)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; some file systems refuse O_RDONLY on a directory.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
