"""Typed (heterogeneous) GPU clusters in the simulator: ``simulate --cluster t4:16x4,...``.

The hand-checked trace (a100 first: 6 one-GPU slots, then t4: 4 slots; every job is the
A100 ResNet-50 profile, so on a100 it runs its trace duration exactly)::

    job  submit  GPUs  partitions   duration   FIFO + EASY backfill, first fit (by hand)
    j1      0     4    a100            100     starts 0 on a100 (2 left), ends 100
    j2      0     4    t4             1000     starts 0 on t4 (full), ends 1000
    j3     10     6    a100,t4         300     t4 has 4 nodes: a100 only; blocked, reserves
                                               a100 at 100 (no extra); starts 100, ends 400
    j4     20     2    a100,t4          50     backfills on a100: 20 + 50 <= 100; ends 70
    j5     30     2    a100,t4         200     at 70: 2 free on a100, but 70 + 200 > 100 and
                                               no extra; t4 full: waits for j3; 400-600
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner

from slurm_elastic.cli import cli
from slurm_elastic.cluster_state import partition_gpu_types
from slurm_elastic.errors import ActionRefused, ConfigError
from slurm_elastic.sim import study
from slurm_elastic.sim.audit import conservation_errors
from slurm_elastic.sim.backend import SimBackend
from slurm_elastic.sim.engine import Cluster, ClusterSpec, PartitionSpec
from slurm_elastic.sim.gputypes import parse_cluster, speed_ratio
from slurm_elastic.sim.metrics import FIELDS
from slurm_elastic.sim.runner import ORIGIN, SimSettings, report_for, simulate
from slurm_elastic.sim.traces import read_trace
from slurm_elastic.sim.workload import Workload, WorkloadConfig, build_workload
from slurm_elastic.types import JobState

HAND = """job_id,submit_s,duration_s,gpus,model,batch_size,partition
j1,0,100,4,resnet50,64,a100
j2,0,1000,4,resnet50,64,t4
j3,10,300,6,resnet50,64,
j4,20,50,2,resnet50,64,
j5,30,200,2,resnet50,64,
"""
EXPECTED = {
    "j1": (0, 100, "a100"),
    "j2": (0, 1000, "t4"),
    "j3": (100, 400, "a100"),
    "j4": (20, 70, "a100"),
    "j5": (400, 600, "a100"),
}
PHILLY = "philly/philly_jobs_2017-11-01_to_2017-11-07.csv"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


def _typed(a100: int, t4: int) -> ClusterSpec:
    return ClusterSpec((PartitionSpec("a100", a100, "a100"), PartitionSpec("t4", t4, "t4")), 1)


def _workload(path: Path, traces: Path, spec: ClusterSpec, **cfg: object) -> Workload:
    return build_workload(
        read_trace(path, limit=cfg.pop("limit", None)),  # type: ignore[arg-type]
        WorkloadConfig(**cfg),  # type: ignore[arg-type]
        traces_dir=traces,
        partition_nodes={p.name: p.nodes for p in spec.partitions},
        default_partition=spec.default_partition,
        partition_types=spec.gpu_types,
    )


def _trace(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "typed.csv"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- cluster spec


def test_a_type_group_becomes_slots_of_the_allocation_unit() -> None:
    groups = parse_cluster("t4:16x4,a100:8x8")
    assert study.typed_partitions(groups, 1) == (
        PartitionSpec("t4", 64, "t4"),
        PartitionSpec("a100", 64, "a100"),
    )
    assert study.typed_partitions(groups, 4) == (
        PartitionSpec("t4", 16, "t4"),
        PartitionSpec("a100", 16, "a100"),
    )


def test_a_group_that_is_not_whole_slots_is_one_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        study.typed_partitions(parse_cluster("t4:3x1,a100:1x8"), 2)
    assert "\n" not in str(err.value)
    assert "t4:3x1 has 3 GPUs, not a multiple of --gpus-per-node 2" in str(err.value)


# --------------------------------------------------------------------------- workload


def test_jobs_naming_no_partition_go_to_every_type_in_order(tmp_path: Path, traces: Path) -> None:
    wl = _workload(_trace(tmp_path, HAND), traces, _typed(6, 4))
    by_id = {j.trace_id: j for j in wl.jobs}
    assert by_id["j1"].partitions == ("a100",) and by_id["j2"].partitions == ("t4",)
    assert by_id["j3"].partitions == ("a100", "t4") and by_id["j3"].partition == "a100"
    # Capped by the largest of its partitions (a100's 6), not by its first alone.
    assert by_id["j4"].max_nodes == 4 and by_id["j3"].max_nodes == 6
    for job in wl.jobs:
        assert job.gpu_type == job.partitions[0]
        assert job.speeds_dir == traces
        assert job.profile.gpu_type == "a100"


def test_untyped_jobs_keep_one_partition_and_no_type(tmp_path: Path, traces: Path) -> None:
    spec = ClusterSpec((PartitionSpec("a100", 6), PartitionSpec("t4", 4)), 1)
    wl = _workload(_trace(tmp_path, HAND), traces, spec)
    assert [j.partitions for j in wl.jobs] == [("a100",), ("t4",), ("a100",), ("a100",), ("a100",)]
    assert {(j.gpu_type, j.speeds_dir) for j in wl.jobs} == {("", None)}


def test_work_is_defined_on_the_first_partitions_type(tmp_path: Path, traces: Path) -> None:
    """t4 first: a T4 job's duration is kept on t4, and it runs faster on a100."""
    text = "job_id,submit_s,duration_s,gpus,model,batch_size\nj,0,1000,2,resnet50,64\n"
    spec = ClusterSpec((PartitionSpec("t4", 4, "t4"), PartitionSpec("a100", 4, "a100")), 1)
    (job,) = _workload(_trace(tmp_path, text), traces, spec).jobs
    assert job.gpu_type == "t4" and job.duration_at_request == pytest.approx(1000)
    ratio = speed_ratio(traces, "resnet50", "a100", "t4", 2)
    assert ratio > 1.5  # an A100 is much faster than a T4 at ResNet-50
    assert job.rate_at(2, "a100") == pytest.approx(job.rate_at(2) * ratio)
    assert job.rate_at(2, "t4") == pytest.approx(job.profile.rate_at(2) * 1 / ratio)


# --------------------------------------------------------------------------- engine


def test_a_jobs_speed_is_its_partitions_types(tmp_path: Path, traces: Path) -> None:
    """a100 is full, so the two-partition job starts on t4 and runs slower by the type
    ratio; its reports say so."""
    text = "job_id,submit_s,duration_s,gpus,model,batch_size\nbig,0,500,4,resnet50,64\n"
    text += "j,0,100,2,resnet50,64\n"
    spec = _typed(4, 4)
    wl = _workload(_trace(tmp_path, text), traces, spec)
    out = simulate(wl, spec, SimSettings(policy="static"))
    by_id = {j.spec.trace_id: j for j in out.jobs if j.spec is not None}
    assert (by_id["big"].partition, by_id["j"].partition) == ("a100", "t4")
    ratio = speed_ratio(traces, "resnet50", "t4", "a100", 2)
    assert ratio < 0.7
    assert by_id["big"].end - by_id["big"].start == pytest.approx(500)  # type: ignore[operator]
    assert by_id["j"].end - by_id["j"].start == pytest.approx(100 / ratio)  # type: ignore[operator]
    assert conservation_errors(out.all_jobs, gpu_types=spec.gpu_types) == []
    # A mismatched audit (every job at its first partition's speed) notices the t4 job.
    assert len(conservation_errors(out.all_jobs)) == 1

    cluster = Cluster(spec, wl.jobs)
    for job_spec in wl.jobs:
        cluster.arrive(job_spec)
    cluster.schedule()
    job = cluster.jobs[wl.jobs[1].sim_id]
    report = report_for(job, cluster, ORIGIN)
    assert report.samples_per_s == pytest.approx(
        wl.jobs[1].rate_at(2, "t4") * wl.jobs[1].profile.batch
    )
    assert report.samples_per_s == pytest.approx(
        wl.jobs[1].rate_at(2, "a100") * ratio * wl.jobs[1].profile.batch
    )


def test_first_fit_and_backfill_across_partitions(tmp_path: Path, traces: Path) -> None:
    spec = _typed(6, 4)
    wl = _workload(_trace(tmp_path, HAND), traces, spec)
    out = simulate(wl, spec, SimSettings(policy="static"))
    got = {
        j.spec.trace_id: (j.start - ORIGIN, j.end - ORIGIN, j.partition)  # type: ignore[union-attr,operator]
        for j in out.jobs
    }
    assert got.keys() == EXPECTED.keys()
    for trace_id, (start, end, part) in EXPECTED.items():
        assert got[trace_id][0] == pytest.approx(start), trace_id
        assert got[trace_id][1] == pytest.approx(end), trace_id
        assert got[trace_id][2] == part, trace_id


def test_the_backend_shows_partition_lists_and_node_types(tmp_path: Path, traces: Path) -> None:
    spec = _typed(6, 4)
    wl = _workload(_trace(tmp_path, HAND), traces, spec)
    cluster = Cluster(spec, wl.jobs)
    backend = SimBackend(cluster)
    for job_spec in wl.jobs[:3]:
        cluster.arrive(job_spec)
    cluster.schedule()
    views = {v.job_id: v for v in backend.read_jobs()}
    j1, j2, j3 = (views[s.sim_id] for s in wl.jobs[:3])
    assert (j1.state, j1.partition) == (JobState.RUNNING, "a100")
    assert (j2.state, j2.partition) == (JobState.RUNNING, "t4")
    assert (j3.state, j3.partition, j3.partitions) == (JobState.PENDING, "a100,t4", ("a100", "t4"))
    snapshot = backend.read_cluster()
    assert {n.gpu_type for n in snapshot.nodes if "a100" in n.partitions} == {"a100"}
    assert dict(partition_gpu_types(snapshot)) == {"a100": "a100", "t4": "t4"}

    # A placement narrows to one of the job's own partitions, never to another.
    with pytest.raises(ActionRefused, match="it asked for 'a100,t4'"):
        backend.pin_pending_size(j3.job_id, 4, "gpu")
    backend.pin_pending_size(j3.job_id, 4, "t4")
    narrowed = {v.job_id: v for v in backend.read_jobs()}[j3.job_id]
    assert (narrowed.partition, narrowed.node_count) == ("t4", 4)


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("policy", ["static", "greedy", "mip"])
def test_each_policy_finishes_every_job_on_a_typed_cluster(traces: Path, policy: str) -> None:
    """The Philly trace's jobs name no partition: all go to t4,a100; the daemon in the
    loop resizes them, and every step of work is accounted at the speed of its type."""
    st = study.Study(
        trace=read_trace(traces / PHILLY, limit=40),
        trace_path=PHILLY,
        traces_dir=traces,
        workload_cfg=WorkloadConfig(),
        settings=SimSettings(),
        nodes=16,
        gpus_per_node=1,
        partitions=study.typed_partitions(parse_cluster("t4:2x4,a100:1x8"), 1),
    )
    workload = st.workload()
    assert {j.partitions for j in workload.jobs} == {("t4", "a100")}
    outcome = study.run_policy(st, policy, workload)
    assert len(outcome.jobs) == 40
    assert {j.state for j in outcome.jobs} == {JobState.COMPLETED}
    assert conservation_errors(outcome.all_jobs, gpu_types=st.cluster.gpu_types) == []
    assert {j.partition for j in outcome.jobs} == {"t4", "a100"}
    if policy == "static":
        assert sum(j.resizes for j in outcome.jobs) == 0


@pytest.mark.parametrize("placement", ["slurm", "plan"])
def test_the_daemon_narrows_jobs_only_when_it_places_them(traces: Path, placement: str) -> None:
    """``simulate --placement plan``: the daemon's ``policy.placement``; only then are jobs
    narrowed to one of their partitions (``slurm``: Slurm's first fit picks)."""
    st = study.Study(
        trace=read_trace(traces / PHILLY, limit=40),
        trace_path=PHILLY,
        traces_dir=traces,
        workload_cfg=WorkloadConfig(),
        settings=SimSettings(placement=placement),
        nodes=16,
        gpus_per_node=1,
        partitions=study.typed_partitions(parse_cluster("t4:2x4,a100:1x8"), 1),
    )
    outcome = study.run_policy(st, "mip", st.workload())
    narrowed = [j for j in outcome.jobs if j.partitions != ("t4", "a100")]
    assert {j.state for j in outcome.jobs} == {JobState.COMPLETED}
    assert (len(narrowed) > 0) == (placement == "plan")
    assert all(j.partitions == (j.partition,) for j in narrowed)


def test_simulate_on_a_typed_cluster_writes_utilisation_per_type(
    traces: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(traces / PHILLY), "--limit", "30"]
    args += ["--cluster", "t4:2x4,a100:1x8", "--profiles", str(traces)]
    args += ["--policies", "static,greedy,mip", "--out", str(out), "--placement", "plan"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["sim"]["placement"] == "plan"
    assert list(doc["policies"]) == ["static", "greedy", "mip"]
    for figures in doc["policies"].values():
        assert tuple(figures) == (*FIELDS, "gpu_util_by_type")
        assert figures["jobs_finished"] == 30
        by_type = figures["gpu_util_by_type"]
        assert list(by_type) == ["t4", "a100"]
        assert all(0.0 < u <= 1.0 for u in by_type.values())
        # Both types have 8 GPUs: the overall figure is their mean (to the rounding).
        assert figures["gpu_util"] == pytest.approx(sum(by_type.values()) / 2, abs=1e-4)
    assert doc["config"]["partitions"] == {"t4": 8, "a100": 8}
    assert doc["config"]["gpu_types"] == {"t4": "t4", "a100": "a100"}
    # The daemon prices the types by one benchmark (ResNet-50 on one GPU), t4 the slower.
    speeds = doc["config"]["gpu_speeds"]
    assert speeds["t4"] == 1.0 and speeds["a100"] == pytest.approx(2.177, abs=1e-3)
    assert doc["config"]["gpus"] == 16
    assert "gpu_util (a100)" in result.output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--cluster", "h100:4x8"], "unknown GPU type 'h100'"),
        (["--cluster", "t4:0x4"], "node count must be at least 1"),
        (["--cluster", "v100:4"], "give GPUs per node for v100"),
        (["--cluster", "t4:3x1", "--gpus-per-node", "2"], "not a multiple of --gpus-per-node 2"),
        (["--cluster", "t4:2x4", "--nodes", "8"], "without --nodes or --partitions"),
        (["--cluster", "t4:2x4", "--partitions", "gpu:8"], "without --nodes or --partitions"),
    ],
)
def test_the_cli_refuses_a_bad_cluster_in_one_line(
    traces: Path, tmp_path: Path, extra: list[str], needle: str
) -> None:
    args = ["simulate", "--trace", str(traces / PHILLY), "--out", str(tmp_path), *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert needle in result.output
    assert not (tmp_path / "results.json").exists()
