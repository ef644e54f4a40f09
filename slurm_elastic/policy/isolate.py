"""Run a function in a forked child that is killed at a hard deadline.

Solvers honour their own time limit most of the time, not always (presolve, a long LP,
a deadlock after ``fork`` in a threaded daemon).  The child is forked (Linux), so the
model arrays are inherited rather than pickled; only small results travel back through
a pipe.  The function may report intermediate results (an incumbent) through the
``report`` callback it is given; if the deadline passes, the latest one is returned
instead of nothing.  Whatever the child does, ``run_isolated`` returns by the deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from slurm_elastic.errors import SolverError, SolverTimeout


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    def report(partial: Any) -> None:
        conn.send(("partial", partial))

    try:
        conn.send(("ok", fn(*args, report)))
    except BaseException as exc:  # report anything, the parent decides
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=3)))
    finally:
        conn.close()


def run_isolated(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float
) -> tuple[Any, bool]:
    """``fn(*args, report)`` in a child process: ``(result, True)``, or at the deadline
    ``(latest reported partial result, False)``.  SolverTimeout when there is none,
    SolverError when the function raised or the child died."""
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(writer, fn, args))
    deadline = time.monotonic() + max(timeout_s, 0.0)
    proc.start()
    writer.close()
    partial: tuple[Any] | None = None
    try:
        while reader.poll(max(deadline - time.monotonic(), 0.0)):
            try:
                msg = reader.recv()
            except EOFError as exc:
                raise SolverError(f"solver process died (exit code {proc.exitcode})") from exc
            if msg[0] == "partial":
                partial = (msg[1],)
            elif msg[0] == "ok":
                return msg[1], True
            else:
                raise SolverError(f"solver failed: {msg[1]}")
        if partial is not None:
            return partial[0], False
        raise SolverTimeout(f"solver gave no answer within {timeout_s:.3f} s; killed")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        reader.close()
