"""Run a function in a forked child that is killed at a hard deadline.

Solvers honour their own time limit most of the time, not always (presolve, a long LP,
a deadlock after ``fork`` in a threaded daemon).  The child is forked (Linux), so the
model arrays are inherited rather than pickled; only the small result travels back
through a pipe.  Whatever the child does, ``run_isolated`` returns by the deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from slurm_elastic.errors import SolverError


class SolverTimeout(SolverError):
    """The isolated solve did not answer before its deadline and was killed."""


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:  # report anything, the parent decides
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=3)))
    finally:
        conn.close()


def run_isolated(fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """``fn(*args)`` in a child process; SolverTimeout after ``timeout_s``, SolverError on error."""
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(writer, fn, args))
    proc.start()
    writer.close()
    try:
        if not reader.poll(max(timeout_s, 0.0)):
            raise SolverTimeout(f"solver gave no answer within {timeout_s:.3f} s; killed")
        try:
            msg = reader.recv()
        except EOFError as exc:
            raise SolverError(f"solver process died (exit code {proc.exitcode})") from exc
        if msg[0] != "ok":
            raise SolverError(f"solver failed: {msg[1]}")
        return msg[1]
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        reader.close()
