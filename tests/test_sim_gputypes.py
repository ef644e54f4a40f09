"""GPU types for the simulator (sim/gputypes.py): the cluster spec, and per-type speeds read
from the real shared traces, checked against figures copied by hand out of the files."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim.gputypes import (
    KNOWN_TYPES,
    MODELS,
    RUNS,
    NodeGroup,
    benchmark_speeds,
    homes,
    models_for,
    parse_cluster,
    speed_ratio,
    type_speed,
)

# Figures copied by hand from the shared files (file, row, column), used to check the code:
# elasticflow_throughputs/A100/resnet50.csv, row global_batch_size=256:
A100_RN50_256 = {1: 1.843374951404324, 4: 6.190812304854656, 8: 10.378702644353233,
                 64: 18.845304488737906}  # fmt: skip
# elasticflow_throughputs/T4/imagenet.csv, row 6400, column 1:
T4_IMAGENET_6400_1 = 0.03388031357494102
# elasticflow_throughputs/T4/cifar10.csv, row 4096, column 1:
T4_CIFAR10_4096_1 = 0.3562865663863035
# elasticflow_throughputs/T4/bert.csv, row 384, column 1:
T4_BERT_384_1 = 0.03440690542609718
# elasticflow_throughputs/A100/bert.csv, row 128, column 1:
A100_BERT_128_1 = 3.5749256045333064
# elasticflow_throughputs/T4/yolov3.csv, row 64, column 16 (32 and 64 are nan):
T4_YOLOV3_64_16 = 0.8514782062868322
# gavel/simulation_throughputs.json, "null" entries at scale factor 1:
GAVEL_V100_RN50_128 = 2.4967655780898292  # v100 "('ResNet-50 (batch size 128)', 1)"
GAVEL_V100_RN18_256 = 10.300256501360458  # v100 "('ResNet-18 (batch size 256)', 1)"


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


# --------------------------------------------------------------------------- cluster spec


def test_parse_cluster_explicit_and_default_node_sizes() -> None:
    assert parse_cluster("t4:16x4,a100:8x8") == (
        NodeGroup("t4", 16, 4, "t4"),
        NodeGroup("a100", 8, 8, "a100"),
    )
    # Left out, the node size is the profiled machine's: ND96asr (8 A100), g4dn.12xlarge (4 T4).
    assert parse_cluster(" A100:2 , t4:3 ") == (
        NodeGroup("a100", 2, 8, "a100"),
        NodeGroup("t4", 3, 4, "t4"),
    )
    (v100,) = parse_cluster("V100:4X2")
    assert (v100.gpu_type, v100.partition, v100.gpus) == ("v100", "v100", 8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cluster spec is empty"),
        ("   ", "cluster spec is empty"),
        ("t4:4,,a100:2", "part 2 is empty"),
        ("t4:4,", "part 2 is empty"),
        ("a100", "part 'a100': expected TYPE:NODES[xGPUS]"),
        (":4x4", "part ':4x4': expected TYPE:NODES[xGPUS]"),
        ("t4:", "part 't4:': expected TYPE:NODES[xGPUS]"),
        ("h100:4x8", "part 'h100:4x8': unknown GPU type 'h100' (known: a100, t4, v100, p100, k80)"),
        ("t4:4,T4:2", "part 'T4:2': GPU type 't4' is listed twice"),
        ("t4:four", "part 't4:four': 'four' is not NODES or NODESxGPUS"),
        ("t4:4x4x4", "part 't4:4x4x4': '4x4x4' is not NODES or NODESxGPUS"),
        ("t4:1_000", "'1_000' is not NODES or NODESxGPUS"),
        ("t4:+4", "'+4' is not NODES or NODESxGPUS"),
        ("t4:4 x 4", "'4 x 4' is not NODES or NODESxGPUS"),
        ("t4:0x4", "part 't4:0x4': node count must be at least 1"),
        ("t4:-2x4", "part 't4:-2x4': node count must be at least 1"),
        ("a100:2x0", "part 'a100:2x0': GPUs per node must be at least 1"),
        ("a100:2x-8", "part 'a100:2x-8': GPUs per node must be at least 1"),
        ("v100:4", "part 'v100:4': give GPUs per node for v100 (e.g. v100:4x8)"),
        ("t4:4;a100:2", "'4;a100:2' is not NODES or NODESxGPUS"),
    ],
)
def test_parse_cluster_refuses_bad_specs(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cluster(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- the data


def test_known_types_are_the_ones_the_data_has(traces: Path) -> None:
    gavel = json.loads((traces / "gavel" / "simulation_throughputs.json").read_text())
    folders = (traces / "elasticflow_throughputs").iterdir()
    from_data = {k for k in gavel if not k.endswith("_unconsolidated")}
    from_data |= {d.name.lower() for d in folders if d.is_dir()}
    assert from_data == set(KNOWN_TYPES)


def test_every_declared_run_is_in_the_files(traces: Path) -> None:
    """Each (model, type) run the module names resolves to a real figure."""
    for model in MODELS:
        for gpu_type in RUNS[model]:
            home = gpu_type if gpu_type in homes(model) else None
            speed = type_speed(traces, model, gpu_type, home=home)
            assert speed.basis in ("curve", "one-gpu"), (model, gpu_type, speed.basis)
            assert all(r > 0 for r in speed.samples_per_s)


def test_a_curve_is_the_csv_row_in_samples_per_second(traces: Path) -> None:
    speed = type_speed(traces, "resnet50", "a100")
    assert (speed.basis, speed.batch, speed.home) == ("curve", 256, "a100")
    assert speed.gpus == (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    assert speed.rate(1) == pytest.approx(A100_RN50_256[1] * 256)
    assert speed.iterations_per_s(8) == pytest.approx(A100_RN50_256[8])
    assert type_speed(traces, "resnet50", "a100", batch=64).batch == 64


def test_linear_between_measured_counts_and_flat_beyond(traces: Path) -> None:
    speed = type_speed(traces, "resnet50", "a100")
    midway = (A100_RN50_256[4] + A100_RN50_256[8]) / 2 * 256
    assert speed.rate(6) == pytest.approx(midway)
    assert speed.rate(128) == speed.rate(64) == pytest.approx(A100_RN50_256[64] * 256)
    # yolov3 on T4 has nan at 32 and 64 GPUs: the curve ends at 16 and stays there.
    yolo = type_speed(traces, "yolov3", "t4")
    assert yolo.gpus[-1] == 16.0
    assert yolo.rate(64) == yolo.rate(16) == pytest.approx(T4_YOLOV3_64_16 * 64)
    # resnet50_cifar10 on A100 has 0 ("infeasible") from 16 GPUs: flat at 8's value.
    small = type_speed(traces, "resnet50_cifar10", "a100")
    assert small.gpus[-1] == 8.0
    assert small.rate(32) == small.rate(8)


def test_ratios_match_the_files_by_hand(traces: Path) -> None:
    a100 = A100_RN50_256[1] * 256  # 471.9 images/s
    t4 = T4_IMAGENET_6400_1 * 6400  # 216.8 images/s
    v100 = GAVEL_V100_RN50_128 * 128  # 319.6 images/s
    assert speed_ratio(traces, "resnet50", "a100", "t4", 1) == pytest.approx(a100 / t4)
    assert speed_ratio(traces, "resnet50", "v100", "a100", 1) == pytest.approx(v100 / a100)
    assert speed_ratio(traces, "imagenet", "a100", "v100", 1) == pytest.approx(a100 / v100)
    # What the daemon is configured with in the simulator: the same one-GPU ratios.
    speeds = benchmark_speeds(traces, ["a100", "t4", "v100"])
    assert speeds == pytest.approx({"a100": a100 / t4, "t4": 1.0, "v100": v100 / t4})
    # ResNet-18/CIFAR-10 is the other workload Gavel and Pollux share.
    cifar = (GAVEL_V100_RN18_256 * 256) / (T4_CIFAR10_4096_1 * 4096)
    assert speed_ratio(traces, "cifar10", "v100", "t4", 1) == pytest.approx(cifar)
    # A one-GPU figure keeps its own value at 1 GPU and the home's shape beyond.
    v100_rn50 = type_speed(traces, "resnet50", "v100")
    assert v100_rn50.basis == "one-gpu"
    assert v100_rn50.rate(1) == pytest.approx(v100)
    assert v100_rn50.rate(8) == pytest.approx(A100_RN50_256[8] * 256 * v100 / a100)


def test_faster_types_are_faster_per_gpu(traces: Path) -> None:
    for model in ("resnet50", "bert"):
        one = {t: type_speed(traces, model, t).rate(1) for t in KNOWN_TYPES}
        assert one["a100"] > one["v100"] > one["p100"] > one["k80"], (model, one)
        assert one["a100"] > one["t4"] > one["k80"], (model, one)


def test_same_name_different_task_is_not_a_ratio(traces: Path) -> None:
    """The T4 and A100 bert files are different tasks (SQuAD vs sequence classification):
    their ratio (about 35) is not used; bert on t4 borrows ResNet-50's t4/a100 ratio."""
    file_ratio = (A100_BERT_128_1 * 128) / (T4_BERT_384_1 * 384)
    assert file_ratio > 30
    rn50 = speed_ratio(traces, "resnet50", "a100", "t4", 1)
    assert speed_ratio(traces, "bert", "a100", "t4", 1) == pytest.approx(rn50)
    assert type_speed(traces, "bert", "t4").basis == "fallback"
    # With t4 as the home, the Pollux bert file is the t4 curve and a100 is the borrowed one.
    pollux = type_speed(traces, "bert", "t4", home="t4")
    assert (pollux.basis, pollux.batch) == ("curve", 384)
    assert pollux.rate(1) == pytest.approx(T4_BERT_384_1 * 384)
    assert speed_ratio(traces, "bert", "a100", "t4", 4, home="t4") == pytest.approx(rn50)


def test_fallback_is_the_median_over_shared_workloads(traces: Path) -> None:
    rn50 = (GAVEL_V100_RN50_128 * 128) / (T4_IMAGENET_6400_1 * 6400)
    rn18 = (GAVEL_V100_RN18_256 * 256) / (T4_CIFAR10_4096_1 * 4096)
    ncf = type_speed(traces, "ncf", "v100")
    assert ncf.basis == "fallback"
    assert "median of 2: resnet18/cifar10, resnet50/imagenet" in ncf.source
    expected = statistics.median([rn50, rn18])
    assert speed_ratio(traces, "ncf", "v100", "t4", 1) == pytest.approx(expected)
    assert speed_ratio(traces, "ncf", "v100", "t4", 16) == pytest.approx(expected)


def test_models_for(traces: Path) -> None:
    assert models_for(traces, ["a100", "t4"]) == ("imagenet", "resnet50")
    assert models_for(traces, ["t4", "v100", "k80"]) == ("cifar10", "imagenet", "resnet50")
    assert set(models_for(traces, ["a100"])) == {
        "bert", "deepspeech2", "gpt2", "inception3", "resnet50", "resnet50_cifar10", "vgg16",
        "imagenet",
    }  # fmt: skip
    # bert and deepspeech2 have runs on t4 too (Pollux's), just not of the A100 task.
    assert {"bert", "deepspeech2", "ncf", "yolov3"} <= set(models_for(traces, ["t4"]))
    assert models_for(traces, []) == MODELS


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: type_speed(t, "alexnet", "a100"), "unknown model 'alexnet'"),
        (lambda t: type_speed(t, "bert", "h100"), "unknown GPU type 'h100'"),
        (lambda t: type_speed(t, "bert", "a100", batch=100), "have [64, 128]"),
        (lambda t: type_speed(t, "gpt2", "v100", home="t4"), "home 't4' has no curve for gpt2"),
        (lambda t: type_speed(t, "bert", "a100", home="v100"), "home 'v100' has no curve"),
        (lambda t: models_for(t, ["a100", "h100"]), "unknown GPU type 'h100'"),
    ],
)
def test_bad_questions_are_config_errors(
    traces: Path, call: Callable[[Path], object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        call(traces)
    assert message in str(info.value)


def test_missing_or_broken_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read throughputs"):
        type_speed(tmp_path, "resnet50", "a100")
    folder = tmp_path / "elasticflow_throughputs" / "A100"
    folder.mkdir(parents=True)
    (folder / "resnet50.csv").write_text("global_batch_size,1,2\n64,fast,2.0\n")
    with pytest.raises(ConfigError, match="line 2: not a number"):
        type_speed(tmp_path, "resnet50", "a100")
    (folder / "resnet50.csv").write_text("global_batch_size,1,2\n64,1.0,2.0\n")
    (tmp_path / "gavel").mkdir()
    (tmp_path / "gavel" / "simulation_throughputs.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        type_speed(tmp_path, "resnet50", "v100")
