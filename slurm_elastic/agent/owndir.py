"""The job's own directories: every file in them read and written as only their owner can.

The job directory (``<WorkDir>/.slurm-elastic/job-<id>/``, ``agent.jobdir``) lives in the
job's work directory, which other users may be able to write: a shared ``/scratch`` or
``/tmp`` (mode 1777), a group's project directory.  What is in it is obeyed or executed
(``launch.json``'s argv runs on every node and in companion jobs, ``control.json`` stops
the workers) and unpickled (checkpoints), so a file another user could place there would
run his code as the job's owner.  Every access therefore goes through :class:`OwnDir`:

* the *trusted part* of a path is ``.slurm-elastic`` and everything below it (for a path
  without that component, the directory itself); the part above is the user's choice and
  is followed as the kernel resolves it;
* each access walks the trusted part from the last untrusted directory with ``openat``,
  never following a link (``O_NOFOLLOW | O_DIRECTORY``), and checks every directory it
  opens by its descriptor (``fstat``): a directory, owned by this user, writable by nobody
  else; the file is then opened relative to the last one, itself without following a link,
  and checked the same (a regular file of this user's that nobody else may write).  What is
  checked is what is used: a directory another user renamed or replaced between two
  accesses is refused, never followed;
* missing directories are created mode 0700 relative to their checked parent
  (``mkdir`` with ``dir_fd``); a write is a new temporary file (``O_EXCL``, mode 0600
  unless said) renamed into place inside the checked directory.

A check that fails is one ``AgentError`` naming the path, what is wrong and what to do
(for a ``.slurm-elastic`` another user made first in a shared directory: use a work
directory of your own, or remove it).  Nothing here runs as root: the daemon never opens a
job's directory (docs/security.md, "The job directory").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from slurm_elastic.errors import AgentError

ROOT_NAME = ".slurm-elastic"  # the first trusted component of a job directory's path
DIR_MODE = 0o700
FILE_MODE = 0o600
# Write bits of the group and of others: a file or directory any of them may change is not
# the job owner's alone.
_OTHERS_WRITE = 0o022
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def split_trusted(path: Path) -> tuple[Path, tuple[str, ...]]:
    """(the untrusted base, the trusted components below it) of ``path`` (module doc)."""
    parts = path.parts
    if ROOT_NAME in parts:
        at = parts.index(ROOT_NAME)
        return Path(*parts[:at]) if at else Path("."), parts[at:]
    return path.parent, (path.name,)


class OwnDir:
    """A directory of the job owner's, reached and used only as its owner left it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._base, self._trusted = split_trusted(self.path)

    # ------------------------------------------------------------------ directories

    def ensure(self) -> None:
        """Create the trusted directories that are missing (mode 0700) and check all."""
        with self._walk(create=True):
            pass

    @contextlib.contextmanager
    def _walk(self, *, create: bool = False) -> Iterator[int]:
        """The descriptor of this directory, reached component by component (module doc).

        Raises:
            FileNotFoundError: a trusted directory is missing (and ``create`` is off).
            AgentError: one is not this user's alone, or cannot be opened.
        """
        try:
            if create:  # the part above is the user's choice: made as plain directories
                os.makedirs(self._base, exist_ok=True)
            fd = os.open(self._base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise AgentError(f"cannot open {self._base}: {exc.strerror or exc}") from None
        try:
            here = self._base
            for name in self._trusted:
                here = here / name
                child = self._open_dir(fd, name, here, create)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _open_dir(parent: int, name: str, path: Path, create: bool) -> int:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, DIR_MODE, dir_fd=parent)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise AgentError(
                    f"{path} is not a directory of yours (a link, or a file): another user may "
                    f"have put it there; remove it or use a work directory of your own"
                ) from None
            raise AgentError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            _check(os.fstat(fd), path, directory=True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ------------------------------------------------------------------ files

    def read(self, name: str) -> bytes | None:
        """The whole file, or None when it (or this directory) does not exist yet."""
        handle = self.open_read(name)
        if handle is None:
            return None
        with handle:
            try:
                return handle.read()
            except OSError as exc:
                raise AgentError(f"cannot read {self.path / name}: {exc.strerror or exc}") from None

    def open_read(self, name: str) -> BinaryIO | None:
        """The file open for reading (checked), or None when it does not exist."""
        path = self.path / name
        try:
            with self._walk() as parent:
                fd = os.open(name, _READ_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AgentError(
                    f"{path} is a link, not a file of yours: another user may have put it "
                    "there; remove it"
                ) from None
            raise AgentError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            _check(os.fstat(fd), path, directory=False)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def stat(self, name: str) -> os.stat_result | None:
        """The file's status (not following a link), or None when it does not exist."""
        try:
            with self._walk() as parent:
                return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise AgentError(f"cannot stat {self.path / name}: {exc.strerror or exc}") from None

    def names(self) -> list[str]:
        """The names in this directory (none when it does not exist yet)."""
        try:
            with self._walk() as fd:
                return os.listdir(fd)
        except FileNotFoundError:
            return []

    def write(
        self, name: str, writer: Callable[[BinaryIO], object], *, mode: int = FILE_MODE
    ) -> Path:
        """Write ``name`` atomically: ``writer`` fills a new temporary file (``mode``),
        which is flushed, synced and renamed into place; the directory is created first
        when missing.  Returns the file's path."""
        tmp = f".{name}.tmp-{os.getpid()}"
        with self._walk(create=True) as parent:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)  # left by a killed process of this pid
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, mode, dir_fd=parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    writer(handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            with contextlib.suppress(OSError):  # makes the rename durable where it can
                os.fsync(parent)
        return self.path / name

    def unlink(self, name: str) -> None:
        """Remove ``name`` if it is there."""
        try:
            with self._walk() as parent:
                os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return


def _check(st: os.stat_result, path: Path, *, directory: bool) -> None:
    """``st`` is of a directory (or a regular file) of this user's that nobody else may
    write; otherwise one AgentError saying what to do."""
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    what = "directory" if directory else "file"
    if not kind_ok:
        raise AgentError(f"{path} is not a {what}: remove it or use a work directory of your own")
    if st.st_uid != os.geteuid():
        raise AgentError(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): another user "
            f"made it in a shared work directory; use a work directory of your own (sbatch "
            f"--chdir) or have it removed"
        )
    if st.st_mode & _OTHERS_WRITE:
        raise AgentError(
            f"{path} may be written by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"chmod go-w it, or remove it"
        )
