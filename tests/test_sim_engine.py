"""The simulated cluster: FIFO + EASY backfill, the daemon in the loop, invariants.

The hand-checked trace (4 one-GPU nodes, times in seconds)::

    job  submit  GPUs  duration   FIFO + EASY backfill (worked out by hand)
    j1      0     2      100      starts 0 (fits), ends 100
    j2     10     4       50      head of queue, reservation at 100 (j1 ends); starts 100, ends 150
    j3     20     2       60      backfills at 20: 20 + 60 <= 100, ends 80
    j4     30     1      200      at 80: 2 free, all reserved for j2 (no extra): waits; 150-350
    j5     40     1       30      same at 80 (80 + 30 > 100); starts 150, ends 180
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import structlog

from slurm_elastic.errors import ActionRefused, ConfigError
from slurm_elastic.sim.audit import conservation_errors
from slurm_elastic.sim.backend import SimBackend
from slurm_elastic.sim.engine import Cluster, ClusterSpec, PartitionSpec
from slurm_elastic.sim.metrics import summarize
from slurm_elastic.sim.runner import ORIGIN, ControllerDriver, SimSettings, simulate
from slurm_elastic.sim.traces import read_trace
from slurm_elastic.sim.workload import (
    STOP_FREE_PAUSE_S,
    Workload,
    WorkloadConfig,
    build_workload,
)

HAND = """job_id,submit_s,duration_s,gpus,model,batch_size
j1,0,100,2,resnet50,64
j2,10,50,4,resnet50,64
j3,20,60,2,resnet50,64
j4,30,200,1,resnet50,64
j5,40,30,1,resnet50,64
"""
EXPECTED = {"j1": (0, 100), "j2": (100, 150), "j3": (20, 80), "j4": (150, 350), "j5": (150, 180)}


@pytest.fixture(autouse=True)
def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


def _workload(trace_path: Path, traces: Path, nodes: int, **cfg: object) -> Workload:
    return build_workload(
        read_trace(trace_path, limit=cfg.pop("limit", None)),  # type: ignore[arg-type]
        WorkloadConfig(**cfg),  # type: ignore[arg-type]
        traces_dir=traces,
        partition_nodes={"gpu": nodes},
        default_partition="gpu",
    )


def _spec(nodes: int) -> ClusterSpec:
    return ClusterSpec((PartitionSpec("gpu", nodes),), 1)


def _times(outcome) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    return {
        j.spec.trace_id: (j.start - ORIGIN, j.end - ORIGIN)  # type: ignore[union-attr,operator]
        for j in outcome.jobs
    }


@pytest.fixture
def hand_trace(tmp_path: Path) -> Path:
    path = tmp_path / "hand.csv"
    path.write_text(HAND)
    return path


def test_plain_slurm_is_fifo_with_easy_backfill(hand_trace: Path, traces: Path) -> None:
    out = simulate(_workload(hand_trace, traces, 4), _spec(4), SimSettings())
    assert _times(out) == pytest.approx(EXPECTED)


def test_static_policy_through_the_controller_reproduces_fifo_backfill(
    hand_trace: Path, traces: Path
) -> None:
    wl = _workload(hand_trace, traces, 4, elastic_fraction=1.0)
    assert all(j.elastic for j in wl.jobs)
    out = simulate(wl, _spec(4), SimSettings(policy="static"), driver_factory=ControllerDriver)
    assert out.cycles > 0
    times = _times(out)
    for job, (start, end) in EXPECTED.items():
        assert times[job] == pytest.approx((start, end)), job
    assert summarize(out)["resizes"] == 0


def test_mip_starts_the_blocked_job_smaller(hand_trace: Path, traces: Path) -> None:
    """j2 (min 2 nodes) need not wait for 4: the daemon pins it to what fits.

    Jobs here last seconds, so the daemon cycles on its live 10 s interval."""
    wl = _workload(hand_trace, traces, 4, elastic_fraction=1.0)
    settings = SimSettings(policy="mip", interval_s=10.0)
    out = simulate(wl, _spec(4), settings, driver_factory=ControllerDriver)
    assert _times(out)["j2"][0] < EXPECTED["j2"][0]
    static_jct = sum(
        end - submit
        for (_, end), submit in zip(EXPECTED.values(), (0, 10, 20, 30, 40), strict=True)
    )
    assert summarize(out)["avg_jct_s"] < static_jct / len(EXPECTED)


def _contended(traces: Path, **cfg: object) -> Workload:
    # 60 cluster06 jobs on 16 GPUs: queues form, so the policies resize a lot.
    return _workload(
        traces / "itp_elasticflow/augmented/cluster06.csv", traces, 16, limit=60, **cfg
    )


def test_capacity_never_exceeded_and_work_conserved_under_mip(traces: Path) -> None:
    wl = _contended(traces)
    seen: list[int] = []

    def check(cluster: Cluster) -> None:
        cluster.check_capacity()
        assert cluster.busy_nodes() <= cluster.spec.total_nodes
        for job in cluster.active.values():
            assert all(cluster.owner[n] == job.job_id for n in job.nodes)
        seen.append(cluster.busy_nodes())

    out = simulate(
        wl, _spec(16), SimSettings(policy="mip"), driver_factory=ControllerDriver, on_step=check
    )
    assert len(out.jobs) == len(wl.jobs)
    assert max(seen) == 16  # the cluster did fill up, so the check was exercised
    assert sum(j.resizes for j in out.jobs) > 0  # and jobs were resized
    assert conservation_errors(out.all_jobs) == []
    for job in out.jobs:
        assert job.done == pytest.approx(job.spec.work)  # type: ignore[union-attr]


def test_static_jobs_finish_in_their_trace_duration(traces: Path) -> None:
    wl = _contended(traces)
    out = simulate(wl, _spec(16), SimSettings(policy="static"), driver_factory=ControllerDriver)
    trace = {
        j.job_id: j
        for j in read_trace(traces / "itp_elasticflow/augmented/cluster06.csv", limit=60).jobs
    }
    for job in out.jobs:
        assert job.end - job.start == pytest.approx(trace[job.spec.trace_id].duration_s)  # type: ignore[operator,union-attr]
    gpu_s = sum(j.gpus * (j.duration_s or 0) for j in trace.values())
    assert summarize(out)["gpu_hours"] == pytest.approx(gpu_s / 3600, abs=0.1)
    assert conservation_errors(out.all_jobs) == []


def test_same_seed_same_result_other_seed_other_workload(traces: Path) -> None:
    runs = [
        summarize(
            simulate(
                _contended(traces, seed=7, elastic_fraction=0.5),
                _spec(16),
                SimSettings(policy="mip"),
                driver_factory=ControllerDriver,
            )
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    a = _contended(traces, seed=7, elastic_fraction=0.5)
    b = _contended(traces, seed=8, elastic_fraction=0.5)
    assert [j.elastic for j in a.jobs] != [j.elastic for j in b.jobs]


def test_sim_backend_implements_the_backend_protocol(hand_trace: Path, traces: Path) -> None:
    from slurm_elastic.sim.backend import SimBackend
    from slurm_elastic.slurm.backend import SlurmBackend

    cluster = Cluster(_spec(4), _workload(hand_trace, traces, 4).jobs)
    assert isinstance(SimBackend(cluster), SlurmBackend)


def _big_and_small(path: Path, traces: Path) -> tuple[ClusterSpec, Workload]:
    """A trace's jobs on two partitions, ``big`` (8 nodes, the default) and ``small`` (2)."""
    spec = ClusterSpec((PartitionSpec("big", 8), PartitionSpec("small", 2)), 1)
    wl = build_workload(
        read_trace(path),
        WorkloadConfig(),
        traces_dir=traces,
        partition_nodes={"big": 8, "small": 2},
        default_partition="big",
    )
    return spec, wl


def test_partitions_keep_jobs_on_their_nodes(tmp_path: Path, traces: Path) -> None:
    path = tmp_path / "parts.csv"
    rows = ["job_id,submit_s,duration_s,gpus,model,batch_size,partition"]
    rows += [f"s{i},{i * 30},{600 + 60 * i},1,resnet50,64,small" for i in range(6)]
    rows += [f"b{i},{i * 45},{900 + 30 * i},4,vgg16,64,big" for i in range(6)]
    path.write_text("\n".join(rows) + "\n")
    spec, wl = _big_and_small(path, traces)
    assert max(j.max_nodes for j in wl.jobs if j.partition == "small") == 2

    def check(cluster: Cluster) -> None:
        cluster.check_capacity()
        for job in cluster.active.values():
            assert {cluster.node_partition[n] for n in job.nodes} <= {job.partition}

    settings = SimSettings(policy="mip", interval_s=10.0)
    out = simulate(wl, spec, settings, driver_factory=ControllerDriver, on_step=check)
    assert len(out.jobs) == 12
    assert conservation_errors(out.all_jobs) == []


def test_driver_passes_policy_options_and_shows_each_result(
    hand_trace: Path, traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant's options reach every solve (in process), and ``observe`` sees each cycle."""
    import slurm_elastic.policy as policy
    from slurm_elastic.policy.options import PolicyOptions

    solved_with: list[PolicyOptions] = []
    real = policy.allocate

    def spy(problem, name, *, fallback, options=None):  # type: ignore[no-untyped-def]
        assert fallback == "greedy"  # the config's default chain
        solved_with.append(options)
        return real(problem, name, fallback=fallback, options=options)

    monkeypatch.setattr(policy, "allocate", spy)
    seen: list[object] = []

    class Watching(ControllerDriver):
        def observe(self, result: object) -> None:
            seen.append(result)

    variant = PolicyOptions(fair_floor=False, isolate=True)
    wl = _workload(hand_trace, traces, 4, elastic_fraction=1.0)
    out = simulate(
        wl,
        _spec(4),
        SimSettings(policy="mip", interval_s=10.0),
        driver_factory=lambda b, c, s: Watching(b, c, s, variant),
    )
    assert len(seen) == out.cycles > 0
    assert solved_with and all(
        o == PolicyOptions(fair_floor=False, isolate=False) for o in solved_with
    )


def test_the_stop_free_mode_prices_a_resize_at_the_measured_pause(
    hand_trace: Path, traces: Path
) -> None:
    """``resize_mode="torchft"``: a resize stops a job for the survivors' measured pause and
    writes no checkpoint; its reports say so, and the daemon's estimator prices it with
    ``model.stop_free_resize_cost_s``.  The torchrun mode keeps the restart and checkpoint."""
    ft = _workload(hand_trace, traces, 4, resize_mode="torchft")
    spec = ft.jobs[0]
    assert spec.stop_free and spec.resize_cost_s == STOP_FREE_PAUSE_S
    plain = _workload(hand_trace, traces, 4).jobs[0]
    assert not plain.stop_free and plain.resize_cost_s == 15.0 + plain.profile.checkpoint_s
    chosen = _workload(hand_trace, traces, 4, resize_mode="torchft", restart_s=3.0)
    assert chosen.jobs[0].restart_s == 3.0  # --restart-s still wins
    with pytest.raises(ConfigError, match="resize mode must be torchrun or torchft"):
        WorkloadConfig(resize_mode="mpi")
    settings = SimSettings(policy="mip", interval_s=10.0)
    out = simulate(ft, _spec(4), settings, driver_factory=ControllerDriver)
    assert summarize(out)["jobs_finished"] == len(EXPECTED)


def test_the_simulated_backend_starts_a_job_only_in_its_own_partition(
    tmp_path: Path, traces: Path
) -> None:
    """The backend protocol's placement rule (``pin_pending_size(..., partition=)``): a
    simulated job is submitted to one partition, so that one is the only one it takes."""
    path = tmp_path / "one.csv"
    path.write_text("job_id,submit_s,duration_s,gpus,model,batch_size,partition\n")
    path.write_text(path.read_text() + "a,0,600,4,vgg16,64,big\n")
    spec, wl = _big_and_small(path, traces)
    cluster = Cluster(spec, wl.jobs)
    cluster.arrive(wl.jobs[0])
    job_id = wl.jobs[0].sim_id
    backend = SimBackend(cluster)
    with pytest.raises(ActionRefused, match="asked for 'big'"):
        backend.pin_pending_size(job_id, 2, partition="small")
    assert cluster.active[job_id].request == 4
    backend.pin_pending_size(job_id, 2, partition="big")
    assert cluster.active[job_id].request == 2
