"""FIFO + EASY backfill as a pure function: hand-checked cases and properties."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.sim.scheduler import Holding, Waiting, fifo_easy_backfill, read_by_backfill

# Random partitions: free nodes, pending jobs (nodes, run time), running jobs (nodes, end).
FREE = st.integers(0, 16)
JOBS = st.lists(st.tuples(st.integers(1, 8), st.floats(1, 1e5)), max_size=20)
HOLDING = st.lists(st.tuples(st.integers(1, 8), st.floats(1, 1e5)), max_size=8)


def test_fifo_starts_in_order_while_jobs_fit() -> None:
    waiting = [Waiting(1, 2, 10), Waiting(2, 2, 10), Waiting(3, 1, 10)]
    assert fifo_easy_backfill(0, 4, waiting, []) == [1, 2]


def test_short_job_backfills_before_the_shadow_time() -> None:
    # 2 free, head needs 4; the running 2-node job ends at 100 -> shadow 100, extra 0.
    waiting = [Waiting(1, 4, 50), Waiting(2, 2, 60), Waiting(3, 2, 200)]
    assert fifo_easy_backfill(0, 2, waiting, [Holding(2, 100)]) == [2]


def test_long_job_backfills_on_extra_nodes_only() -> None:
    # 3 free, head needs 4, a 2-node job ends at 100: at 100 there are 5, extra = 1.
    waiting = [Waiting(1, 4, 50), Waiting(2, 2, 500), Waiting(3, 1, 500), Waiting(4, 1, 500)]
    assert fifo_easy_backfill(0, 3, waiting, [Holding(2, 100)]) == [3]


def test_unknown_end_times_still_let_fitting_jobs_run() -> None:
    waiting = [Waiting(1, 4, 50), Waiting(2, 1, 10)]
    assert fifo_easy_backfill(0, 1, waiting, [Holding(3, math.inf)]) == [2]


def _shadow(free: int, need: int, holding: list[Holding]) -> float:
    avail = free
    for h in sorted(holding, key=lambda h: h.end):
        avail += h.nodes
        if avail >= need:
            return h.end
    return math.inf


@given(free=FREE, jobs=JOBS, holding=HOLDING)
def test_never_overcommits_and_never_delays_the_first_blocked_job(
    free: int, jobs: list[tuple[int, float]], holding: list[tuple[int, float]]
) -> None:
    waiting = [Waiting(i, n, r) for i, (n, r) in enumerate(jobs)]
    held = [Holding(n, e) for n, e in holding]
    started = fifo_easy_backfill(0.0, free, waiting, held)
    by_id = {w.job_id: w for w in waiting}
    assert sum(by_id[i].nodes for i in started) <= free
    assert started == sorted(started)  # priority order kept
    blocked = next((w for w in waiting if w.job_id not in started), None)
    if blocked is None:
        return
    # Jobs started ahead of the first blocked one are plain FIFO; they shape its shadow.
    ahead = [by_id[i] for i in started if i < blocked.job_id]
    base_free = free - sum(w.nodes for w in ahead)
    shadow = _shadow(
        base_free, blocked.nodes, held + [Holding(w.nodes, w.runtime_s) for w in ahead]
    )
    if math.isinf(shadow):
        return
    # EASY's promise: backfilled jobs still running at the shadow time leave room for it.
    behind = [by_id[i] for i in started if i > blocked.job_id]
    at_shadow = (
        base_free
        + sum(h.nodes for h in held if h.end <= shadow)
        + sum(w.nodes for w in ahead if w.runtime_s <= shadow)
        - sum(w.nodes for w in behind if w.runtime_s > shadow)
    )
    assert at_shadow >= blocked.nodes


@given(free=FREE, jobs=JOBS, holding=HOLDING)
def test_the_run_time_of_a_job_larger_than_free_is_never_read(
    free: int, jobs: list[tuple[int, float]], holding: list[tuple[int, float]]
) -> None:
    """The contract the engine relies on to skip those run times (Cluster.schedule)."""
    held = [Holding(n, e) for n, e in holding]
    exact = [Waiting(i, n, r) for i, (n, r) in enumerate(jobs)]
    unknown = [Waiting(i, n, r if n <= free else math.inf) for i, (n, r) in enumerate(jobs)]
    assert fifo_easy_backfill(0.0, free, unknown, held) == fifo_easy_backfill(
        0.0, free, exact, held
    )


@given(free=FREE, jobs=JOBS, holding=HOLDING)
def test_of_the_jobs_larger_than_free_only_the_first_is_read(
    free: int, jobs: list[tuple[int, float]], holding: list[tuple[int, float]]
) -> None:
    """The contract the engine relies on to leave the others out (Cluster.schedule)."""
    held = [Holding(n, e) for n, e in holding]
    every = [Waiting(i, n, r) for i, (n, r) in enumerate(jobs)]
    read = [every[i] for i in read_by_backfill([w.nodes for w in every], free)]
    assert fifo_easy_backfill(0.0, free, read, held) == fifo_easy_backfill(0.0, free, every, held)


def test_read_by_backfill_keeps_the_fitting_jobs_and_the_first_larger_one() -> None:
    assert read_by_backfill([5, 1, 6, 2, 4, 3], 3) == [0, 1, 3, 5]
    assert read_by_backfill([1, 2], 3) == [0, 1]
    assert read_by_backfill([], 3) == []
