"""Trace readers on the real shared traces, the workload mapping and the profiles."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim import profiles
from slurm_elastic.sim.traces import detect_format, from_history, read_trace
from slurm_elastic.sim.workload import WorkloadConfig, build_workload, pollux_bucket_model
from slurm_elastic.types import Allocation, JobHistory, JobState

PHILLY = "philly/philly_jobs_2017-11-01_to_2017-11-07.csv"


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


@pytest.mark.parametrize(
    ("rel", "fmt", "count", "first"),
    [
        (PHILLY, "philly", 3871, (132.0, 1, 97.0)),  # 2017-11-01 00:02:12, 1 GPU, 97 s
        ("itp_elasticflow/raw/cluster06.csv", "itp-raw", 2396, (16566.0, 4, 3890.0)),
        ("itp_elasticflow/augmented/cluster06.csv", "itp-augmented", 2396, (16566.0, 4, 3890.0)),
        ("itp_elasticflow/raw/cluster10.csv", "itp-raw", 260, None),
        ("pollux/workloads/workload-1.csv", "pollux", 160, (107.0, 6, None)),
        ("pollux/workloads-realistic/workload-1.csv", "pollux", 160, (107.0, 1, None)),
    ],
)
def test_reader_on_real_file(
    traces: Path, rel: str, fmt: str, count: int, first: tuple[float, int, float | None] | None
) -> None:
    trace = read_trace(traces / rel)
    assert trace.format == fmt
    assert len(trace.jobs) == count
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)
    if first is not None:
        j = trace.jobs[0]
        assert (j.submit_s, j.gpus, j.duration_s) == first


def test_augmented_keeps_model_and_batch(traces: Path) -> None:
    j = read_trace(traces / "itp_elasticflow/augmented/cluster06.csv", limit=1).jobs[0]
    assert (j.model, j.batch_size) == ("bert", 64)


def test_canonical_format(tmp_path: Path, traces: Path) -> None:
    path = tmp_path / "site.csv"
    path.write_text(
        "job_id,submit_s,duration_s,gpus,model,batch_size,elastic,min_gpus,max_gpus\n"
        "a,5,100,4,imagenet,,1,2,8\n"
        "b,0,50,2,,,0,,\n"
    )
    trace = read_trace(path)
    assert trace.format == "canonical"
    assert [j.job_id for j in trace.jobs] == ["b", "a"]
    wl = build_workload(
        trace, WorkloadConfig(), traces_dir=traces, partition_nodes={"p": 16}, default_partition="p"
    )
    a = next(j for j in wl.jobs if j.trace_id == "a")
    b = next(j for j in wl.jobs if j.trace_id == "b")
    assert (a.elastic, a.min_nodes, a.max_nodes, a.profile.model) == (True, 2, 8, "imagenet")
    assert (b.elastic, b.min_nodes, b.max_nodes) == (False, 2, 2)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("foo,bar\n1,2\n", "unrecognised trace header"),
        ("job_id,submit_s,duration_s,gpus\nx,0,-5,1\n", ":2: bad canonical row"),
        ("job_id,submit_s,duration_s,gpus\nx,0,5,zero\n", ":2: bad canonical row"),
        ("job_id,submit_s,duration_s,gpus\n", "has no jobs"),
    ],
)
def test_bad_trace_is_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle) as info:
        read_trace(path)
    assert "\n" not in str(info.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "nope.csv")


def test_header_detection_prefers_augmented() -> None:
    cols = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration"
    assert detect_format(cols.split(",")) == "itp-augmented"


def test_from_history_uses_first_allocation_and_run_time() -> None:
    h = JobHistory(
        job_id=7, name="t", user="u", account="a", partition="batch",
        state=JobState.COMPLETED, submit_time=1000.0, start_time=1010.0, end_time=1110.0,
        comment="", allocations=(Allocation(1010.0, 1050.0, 2, ("n1", "n2")),
                                 Allocation(1050.0, 1110.0, 1, ("n1",))),
    )  # fmt: skip
    trace = from_history([h], gpus_per_node=4)
    (job,) = trace.jobs
    assert (job.submit_s, job.gpus, job.duration_s, job.partition) == (0.0, 8, 100.0, "batch")


def test_duration_preserving_work(traces: Path) -> None:
    trace = read_trace(traces / PHILLY, limit=300)
    wl = build_workload(
        trace, WorkloadConfig(), traces_dir=traces, partition_nodes={"p": 64}, default_partition="p"
    )
    for spec, job in zip(wl.jobs, trace.jobs, strict=True):
        assert spec.duration_at_request == pytest.approx(job.duration_s)
        assert spec.min_nodes <= spec.req_nodes <= spec.max_nodes
        assert (spec.max_nodes - spec.min_nodes) % spec.step == 0
        assert spec.profile.source.startswith("pollux:")


def test_pollux_bucket_rule() -> None:
    import random

    rng = random.Random(0)
    assert pollux_bucket_model(0.5, rng) in {"cifar10", "ncf"}
    assert pollux_bucket_model(5, rng) in {"deepspeech2", "bert"}
    assert pollux_bucket_model(50, rng) == "yolov3"
    assert pollux_bucket_model(500, rng) == "imagenet"


def test_a100_profile_matches_upstream_iteration_counts(traces: Path) -> None:
    """The traces README: num_iteration == floor(duration × A100 rate at num_gpu)."""
    trace = read_trace(traces / "itp_elasticflow/augmented/cluster06.csv", limit=200)
    with (traces / "itp_elasticflow/augmented/cluster06.csv").open() as fh:
        iters = [int(r["num_iteration"]) for r in itertools.islice(csv.DictReader(fh), 200)]
    for job, n in zip(trace.jobs, iters, strict=True):
        p = profiles.a100_profile(traces, job.model, job.batch_size)  # type: ignore[arg-type]
        assert job.duration_s * p.rate_at(job.gpus) == pytest.approx(n, rel=2e-3, abs=1)  # type: ignore[operator]


def test_pollux_goodput_profiles_are_sane(traces: Path) -> None:
    for model in profiles.POLLUX_MODELS:
        p = profiles.pollux_profile(traces / "pollux" / "profiles", model)
        assert p.rate_at(1) > 0
        assert p.rate_at(2) > p.rate_at(1)  # two GPUs always help at these batch sizes
        assert p.rate_at(1000) == p.rate[-1]  # flat beyond what was measured
        assert p.full_run_steps > 0
        assert 0 <= p.curve.fraction[0] <= p.curve.fraction[-1] == 1.0


def test_job_larger_than_cluster_is_rejected(traces: Path) -> None:
    trace = read_trace(traces / "itp_elasticflow/raw/cluster06.csv")
    wl = build_workload(
        trace, WorkloadConfig(), traces_dir=traces, partition_nodes={"p": 32}, default_partition="p"
    )
    assert len(wl.rejected) == sum(1 for j in trace.jobs if j.gpus > 32) > 0
    assert all(j.max_nodes <= 32 for j in wl.jobs)


def test_from_history_on_real_sacct_sample(shared_dir: Path) -> None:
    """Real sacct JSON (a job resized 4 -> 2 nodes) through the backend's own parser."""
    from slurm_elastic.slurm import parse_json

    sample = shared_dir / "slurm-samples" / "sacct-resized-job.json"
    history = parse_json.sacct(sample.read_text())
    trace = from_history(history, gpus_per_node=4)
    by_id = {j.job_id: j for j in trace.jobs}
    assert by_id["18"].gpus == 16  # first allocation: 4 nodes x 4 GPUs, not the later 2
    assert by_id["18"].duration_s == 65.0
    assert by_id["19"].submit_s == 0.0 and by_id["19"].gpus == 8
