"""Snapshot -> AllocationProblem, and the instruction board / report store."""

from __future__ import annotations

import threading
from dataclasses import replace

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.instructions import Ack, InstructionBoard
from slurm_elastic.cluster_state import classify
from slurm_elastic.daemon.problem import build_problem, job_capacity, node_pools
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.protocol import AckStatus, Instruction, InstructionKind
from slurm_elastic.types import (
    ElasticSpec,
    JobView,
    NodePool,
    Outlook,
    PartitionView,
    ProgressReport,
    RigidDemand,
    SizeEstimate,
)
from tests.test_daemon_controller_data import job, pending, snapshot


def resolve(j: JobView) -> ElasticSpec | None:
    return ElasticSpec(1, 4, step=2) if j.comment.startswith("elastic") else None


def flat(job_id: int) -> Outlook:
    return Outlook(job_id, 0, (SizeEstimate(1, 1.0, 100.0),), 100.0, 30.0)


def test_problem_from_snapshot() -> None:
    parent = job(1, nodes=("n1", "n2"))
    comp_running = job(2, nodes=("n3",), comment=companion_comment(1))
    comp_pending = pending(3, comment=companion_comment(1))
    rigid = job(4, nodes=("n4",), comment="")
    waiting = replace(pending(5, lo=2, hi=4), partition="batch,shared")
    snap = snapshot([parent, comp_running, comp_pending, rigid, waiting])
    cls = classify(snap, resolve)
    problem = build_problem(
        snap,
        cls,
        {1: flat(1), 5: flat(5)},
        {1: "grow: companion 3 pending"},
        now=1000.0,
        horizon_s=600.0,
        time_limit_s=0.5,
    )
    by_id = {d.job_id: d for d in problem.elastic}
    # Running companions count in the parent's size; the current size stays a choice
    # even off the step grid (1, 3 with step 2).
    assert by_id[1].current_nodes == 3 and by_id[1].allowed_sizes == (1, 3)
    assert by_id[1].frozen and not by_id[5].frozen
    assert by_id[5].partition == "batch" and by_id[5].requested_nodes == 2
    assert problem.rigid == (
        RigidDemand(3, "batch", 1, running=False, submit_time=0.0),
        RigidDemand(4, "batch", 1, running=True, submit_time=0.0),
    )
    assert problem.pools == (NodePool(frozenset({"batch"}), 4),)
    assert (problem.horizon_s, problem.time_limit_s, problem.now) == (600.0, 0.5, 1000.0)


def test_elastic_job_without_outlook_is_held_rigid() -> None:
    snap = snapshot([job(1, nodes=("n1",))])
    problem = build_problem(
        snap, classify(snap, resolve), {}, {}, now=0.0, horizon_s=1.0, time_limit_s=1.0
    )
    assert problem.elastic == () and [r.job_id for r in problem.rigid] == [1]


def test_pools_group_nodes_by_partition_set_and_skip_unusable() -> None:
    snap = snapshot([])
    nodes = list(snap.nodes)
    nodes[3] = replace(nodes[3], state="down")
    parts = (
        PartitionView("batch", ("n1", "n2", "n3", "n4"), True, True, "UP"),
        PartitionView("shared", ("n3", "n4"), False, False, "UP"),
        PartitionView("off", ("n1",), False, False, "DOWN"),
    )
    pools = node_pools(replace(snap, nodes=tuple(nodes), partitions=parts))
    assert pools == (
        NodePool(frozenset({"batch"}), 2),
        NodePool(frozenset({"batch", "shared"}), 1),
    )


def test_job_capacity_is_the_best_partition_within_its_max_nodes() -> None:
    """A partition gives one job the fewer of its nodes and its MaxNodes, whatever their
    state; a job listing several gets the best; an unlisted (hidden) one the whole cluster."""
    parts = (
        PartitionView("batch", ("n1", "n2", "n3", "n4"), True, True, "UP", max_nodes=2),
        PartitionView("shared", ("n3", "n4", "n5"), False, False, "DOWN"),
    )
    snap = replace(snapshot([]), partitions=parts)
    capacity = job_capacity(snap)
    on = {name: replace(pending(1), partition=name) for name in ("batch", "shared", "hidden")}
    assert capacity(on["batch"]) == 2
    assert capacity(on["shared"]) == 3
    assert capacity(replace(pending(1), partition="batch,shared")) == 3
    assert capacity(on["hidden"]) == len(snap.nodes)


def _instruction(iid: str) -> Instruction:
    return Instruction(iid, InstructionKind.SHRINK, 2, ("n1", "n2"), 60.0)


def test_board_accepts_only_acks_to_the_open_instruction() -> None:
    board = InstructionBoard()
    board.post(7, _instruction("a"))
    assert not board.ack(Ack("zzz", 7, AckStatus.READY, 1, "", 1.0))
    assert not board.ack(Ack("a", 8, AckStatus.READY, 1, "", 1.0))
    assert board.ack(Ack("a", 7, AckStatus.READY, 5, "ok", 1.0))
    assert board.ack(Ack("a", 7, AckStatus.FAILED, 6, "late", 2.0))  # first one stands
    assert board.ack_for("a").status is AckStatus.READY  # type: ignore[union-attr]
    board.post(7, _instruction("b"))  # replaces: the old ack is forgotten
    assert board.ack_for("a") is None and board.pending_for(7).id == "b"  # type: ignore[union-attr]
    assert _instruction("b").to_json() == {
        "id": "b",
        "kind": "shrink",
        "target_nodes": 2,
        "keep_nodes": ["n1", "n2"],
        "deadline": 60.0,
        "release": [],
    }
    given_back = replace(_instruction("c"), release=(81, 82))
    assert Instruction.from_json(given_back.to_json()) == given_back
    assert Instruction.from_json({**given_back.to_json(), "release": None}).release == ()
    board.clear(7)
    assert board.pending_for(7) is None and board.open_jobs() == ()


def test_report_store_is_bounded_and_thread_safe() -> None:
    store = ReportStore(max_per_job=50)

    def writer(job_id: int) -> None:
        for step in range(200):
            store.add(ProgressReport(job_id=job_id, time=float(step), step=step, nodes=1))

    threads = [threading.Thread(target=writer, args=(j,)) for j in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.job_ids() == (1, 2, 3, 4)
    hist = store.history(2)
    assert len(hist) == 50 and [r.step for r in hist] == list(range(150, 200))
    assert store.latest(3).step == 199  # type: ignore[union-attr]
    store.forget(3)
    assert store.latest(3) is None and store.history(3) == ()


def test_a_running_job_is_offered_only_the_sizes_a_shrink_can_reach() -> None:
    # 2 own nodes + a 4-node companion: a shrink cancels whole companions, then trims the
    # parent, so 3 and 4 would leave the parent no node of its own (blocked by the guards).
    parent = job(1, nodes=("n1", "n2"))
    companion = job(2, nodes=("n3", "n4", "n5", "n6"), comment=companion_comment(1))
    snap = snapshot([parent, companion])
    cls = classify(snap, lambda j: ElasticSpec(1, 8) if j.job_id == 1 else None)
    problem = build_problem(snap, cls, {1: flat(1)}, {}, now=0.0, horizon_s=600.0, time_limit_s=0.5)
    (demand,) = problem.elastic
    assert demand.current_nodes == 6
    assert demand.allowed_sizes == (1, 2, 5, 6, 7, 8)


def test_grid_offered_and_candidate_sizes_each_add_one_rule() -> None:
    # The marker's grid (step 2), then what the job's state allows (its off-grid current
    # size of 3 added), then what the solver picks from (frozen: that size alone).
    running = job(1, nodes=("n1", "n2", "n3"))
    waiting = pending(2)
    snap = snapshot([running, waiting])
    spec = ElasticSpec(2, 6, step=2)
    assert spec.allowed_sizes == (2, 4, 6)
    cls = classify(snap, lambda _j: spec)
    outlooks = {1: flat(1), 2: flat(2)}
    problem = build_problem(snap, cls, outlooks, {}, now=0.0, horizon_s=600.0, time_limit_s=0.5)
    demands = {d.job_id: d for d in problem.elastic}
    assert demands[1].allowed_sizes == (2, 3, 4, 6) == tuple(demands[1].candidate_sizes())
    assert demands[2].allowed_sizes == (2, 4, 6)
    assert demands[2].candidate_sizes() == [0, 2, 4, 6]  # 0: it may stay pending
    frozen = build_problem(
        snap, cls, outlooks, {1: "cooldown"}, now=0.0, horizon_s=600.0, time_limit_s=0.5
    )
    assert next(d for d in frozen.elastic if d.job_id == 1).candidate_sizes() == [3]
    off_grid = replace(demands[1], allowed_sizes=(2, 4, 6))  # a problem not built here
    assert off_grid.candidate_sizes() == [2, 3, 4, 6]


def test_a_start_promised_within_the_window_reserves_its_nodes_from_growth() -> None:
    """A plain -N2 job waiting for its --begin time: within the window it is a rigid
    demand that cannot start yet; beyond it, or held, or with no window, it is left out.
    Elastic jobs waiting for a begin time count at their minimum the same way."""
    soon = replace(pending(7, lo=2, hi=2), comment="", state_reason="BeginTime")
    later = replace(soon, job_id=8, eligible_time=1000.0 + 3600.0)
    held = replace(soon, job_id=9, state_reason="JobHeldUser", eligible_time=1100.0)
    elastic_soon = replace(pending(10, lo=1, hi=4), state_reason="BeginTime")
    snap = snapshot(
        [job(1, nodes=("n1",)), replace(soon, eligible_time=1100.0), later, held, elastic_soon]
    )
    snap = replace(
        snap,
        jobs=tuple(replace(j, eligible_time=1200.0) if j.job_id == 10 else j for j in snap.jobs),
    )
    cls = classify(snap, resolve)

    def rigid(window_s: float) -> tuple[RigidDemand, ...]:
        return build_problem(
            snap,
            cls,
            {1: flat(1), 10: flat(10)},
            {},
            now=1000.0,
            horizon_s=600.0,
            time_limit_s=0.5,
            promise_window_s=window_s,
        ).rigid

    assert [(r.job_id, r.nodes, r.startable) for r in rigid(1800.0)] == [
        (7, 2, False),
        (10, 1, False),
    ]
    assert rigid(0.0) == ()
