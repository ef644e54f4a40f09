"""FIFO + EASY backfill as a pure function: hand-checked cases and properties, for jobs in
one partition and for jobs submitted to several (``first_fit_easy_backfill``)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.sim.scheduler import (
    Candidate,
    Holding,
    Waiting,
    fifo_easy_backfill,
    first_fit_easy_backfill,
    read_by_backfill,
    read_by_first_fit,
)

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


# ----------------------------------------------------------------- several partitions

PARTS = ("t4", "a100")
# Per partition: free nodes and running jobs (nodes, end); pending jobs: nodes, the
# partitions they list (a non-empty ordered subset) and a run time per partition.
PART_STATE = st.tuples(FREE, HOLDING)
LISTS = st.sampled_from([("t4",), ("a100",), ("t4", "a100"), ("a100", "t4")])
MULTI_JOBS = st.lists(
    st.tuples(st.integers(1, 8), LISTS, st.floats(1, 1e5), st.floats(1, 1e5)), max_size=20
)


def _cluster(
    state: tuple[tuple[int, list[tuple[int, float]]], ...],
) -> tuple[dict[str, int], dict[str, list[Holding]]]:
    free = {name: f for name, (f, _) in zip(PARTS, state, strict=True)}
    held = {name: [Holding(n, e) for n, e in h] for name, (_, h) in zip(PARTS, state, strict=True)}
    return free, held


def _candidates(jobs: list[tuple[int, tuple[str, ...], float, float]]) -> list[Candidate]:
    """The run time differs by partition (t4 the first figure, a100 the second)."""
    return [
        Candidate(i, n, parts, tuple(t4 if p == "t4" else a100 for p in parts))
        for i, (n, parts, t4, a100) in enumerate(jobs)
    ]


def test_a_job_starts_in_the_first_of_its_partitions_where_it_fits() -> None:
    free = {"t4": 1, "a100": 4}
    waiting = [
        Candidate(1, 2, ("t4", "a100"), (10, 10)),  # t4 too small now: a100
        Candidate(2, 1, ("t4", "a100"), (10, 10)),  # both fit: its first, t4
        Candidate(3, 1, ("a100", "t4"), (10, 10)),  # its own order: a100
        Candidate(4, 1, ("t4",), (10,)),  # t4 is full now
    ]
    started = first_fit_easy_backfill(0, free, waiting, {})
    assert started == [(1, "a100"), (2, "t4"), (3, "a100")]


def test_a_blocked_job_reserves_where_it_would_start_earliest() -> None:
    # 2 free in each; the t4 jobs end at 500, the a100 ones at 100: the 4-node head waits
    # for a100 (shadow 100, no extra nodes), and t4 stays unreserved.
    free = {"t4": 2, "a100": 2}
    holding = {"t4": [Holding(2, 500)], "a100": [Holding(2, 100)]}
    waiting = [
        Candidate(1, 4, ("t4", "a100"), (50, 50)),
        Candidate(2, 2, ("a100", "t4"), (300, 300)),  # would delay the head on a100: t4
        Candidate(3, 2, ("a100",), (50,)),  # ends by the shadow time: backfills
    ]
    assert first_fit_easy_backfill(0, free, waiting, holding) == [(2, "t4"), (3, "a100")]


def test_the_run_time_where_the_job_would_run_decides_the_backfill() -> None:
    # a100 reserved until 100 for the head; the job runs 150 s on t4 but 80 s on a100.
    free = {"t4": 0, "a100": 2}
    holding = {"t4": [Holding(4, 1000)], "a100": [Holding(2, 100)]}
    head = Candidate(1, 4, ("a100",), (50,))
    fast_on_a100 = Candidate(2, 2, ("t4", "a100"), (150, 80))
    assert first_fit_easy_backfill(0, free, [head, fast_on_a100], holding) == [(2, "a100")]
    slow_on_a100 = Candidate(2, 2, ("t4", "a100"), (150, 120))
    assert first_fit_easy_backfill(0, free, [head, slow_on_a100], holding) == []


def test_a_partition_smaller_than_the_job_is_never_its_reservation() -> None:
    # The 3-node head fits only a100 (t4 has 2 nodes); it reserves a100 even though its
    # end there is unknown, and the 2-node t4 job then holds t4's reservation (shadow 50),
    # which keeps the long 1-node job out.
    free = {"t4": 1, "a100": 2}
    holding = {"t4": [Holding(1, 50)], "a100": [Holding(2, math.inf)]}
    waiting = [
        Candidate(1, 3, ("t4", "a100"), (10, 10)),
        Candidate(2, 2, ("t4",), (10,)),
        Candidate(3, 1, ("t4",), (100,)),
    ]
    assert first_fit_easy_backfill(0, free, waiting, holding) == []


def _fits_partition(
    jobs: list[tuple[int, tuple[str, ...], float, float]],
    free: dict[str, int],
    held: dict[str, list[Holding]],
) -> list[tuple[int, tuple[str, ...], float, float]]:
    size = {p: free[p] + sum(h.nodes for h in held[p]) for p in PARTS}
    return [j for j in jobs if all(j[0] <= size[p] for p in j[1])]


@given(state=st.tuples(PART_STATE, PART_STATE), jobs=MULTI_JOBS)
def test_with_one_partition_per_job_it_is_the_per_partition_pass(
    state: tuple[tuple[int, list[tuple[int, float]]], ...],
    jobs: list[tuple[int, tuple[str, ...], float, float]],
) -> None:
    """The engine's untyped clusters keep their per-partition pass: same jobs, same place
    (jobs no larger than their partition, as the simulator guarantees)."""
    free, held = _cluster(state)
    single = [(n, parts[:1], t4, a100) for n, parts, t4, a100 in jobs]
    waiting = _candidates(_fits_partition(single, free, held))
    together = first_fit_easy_backfill(0.0, free, waiting, held)
    apart = []
    for name in PARTS:
        mine = [
            Waiting(c.job_id, c.nodes, c.runtime_s[0]) for c in waiting if c.partitions == (name,)
        ]
        apart += [(i, name) for i in fifo_easy_backfill(0.0, free[name], mine, held[name])]
    assert sorted(together) == sorted(apart)
    assert [i for i, _ in together] == sorted(i for i, _ in together)  # priority order


@given(state=st.tuples(PART_STATE, PART_STATE), jobs=MULTI_JOBS)
def test_never_overcommits_and_starts_jobs_only_in_their_own_partitions(
    state: tuple[tuple[int, list[tuple[int, float]]], ...],
    jobs: list[tuple[int, tuple[str, ...], float, float]],
) -> None:
    free, held = _cluster(state)
    waiting = _candidates(jobs)
    started = first_fit_easy_backfill(0.0, free, waiting, held)
    assert len({i for i, _ in started}) == len(started)
    for name in PARTS:
        assert sum(waiting[i].nodes for i, p in started if p == name) <= free[name]
    for i, name in started:
        assert name in waiting[i].partitions


@given(state=st.tuples(PART_STATE, PART_STATE), jobs=MULTI_JOBS)
def test_what_the_first_fit_pass_reads(
    state: tuple[tuple[int, list[tuple[int, float]]], ...],
    jobs: list[tuple[int, tuple[str, ...], float, float]],
) -> None:
    """The contracts the engine relies on: run times where a job does not fit now are never
    read, and the jobs read_by_first_fit leaves out change nothing."""
    free, held = _cluster(state)
    every = _candidates(jobs)
    expected = first_fit_easy_backfill(0.0, free, every, held)
    unknown = [
        Candidate(
            c.job_id,
            c.nodes,
            c.partitions,
            tuple(
                r if c.nodes <= free[p] else math.inf
                for p, r in zip(c.partitions, c.runtime_s, strict=True)
            ),
        )
        for c in every
    ]
    assert first_fit_easy_backfill(0.0, free, unknown, held) == expected
    size = {p: free[p] + sum(h.nodes for h in held[p]) for p in PARTS}
    kept = read_by_first_fit([(c.nodes, c.partitions) for c in every], free, size)
    assert first_fit_easy_backfill(0.0, free, [every[i] for i in kept], held) == expected


@given(free=FREE, requests=st.lists(st.integers(1, 8), max_size=20))
def test_read_by_first_fit_with_one_partition_is_read_by_backfill(
    free: int, requests: list[int]
) -> None:
    jobs = [(n, ("gpu",)) for n in requests]
    assert read_by_first_fit(jobs, {"gpu": free}, {"gpu": 8}) == read_by_backfill(requests, free)
