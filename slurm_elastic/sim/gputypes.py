"""GPU types for the simulator: a cluster spec with node groups per type, and per-type speeds.

The simulator's data layer: ``sim.study`` builds typed clusters from ``parse_cluster``,
``sim.profiles``/``sim.workload`` price jobs by ``speed_ratio``, and ``benchmark_speeds``
gives the daemon its configured speeds.

**Cluster spec.**  ``parse_cluster("t4:16x4,a100:8x8")`` gives one :class:`NodeGroup` per
GPU type (its Slurm partition is named after the type).  When ``xGPUS`` is left out, the
node size is the one the type's speed figures were measured on, as the traces README states
it: a100 8 (Azure ND96asr_A100_v4, ElasticFlow) and t4 4 (AWS g4dn.12xlarge, Pollux).  The
traces name no server for v100, p100 or k80 (Gavel gives single-GPU figures only), so those
need an explicit ``xGPUS``: guessing a node size would silently change every placement.

**Speed per type.**  Three public sources, read at run time from the traces directory:

* a100 — ``elasticflow_throughputs/A100/<stem>.csv``: iterations/s at a fixed global batch
  for 1, 2, 4, ... 64 GPUs (ElasticFlow's own A100 runs).
* t4 — ``elasticflow_throughputs/T4/<stem>.csv``: the same format, taken by ElasticFlow from
  the Pollux T4 profiles (``pollux/profiles/``; bert at 384, for instance, is 32 steps of
  Pollux's local batch 12 per iteration).
* v100, p100, k80 — ``gavel/simulation_throughputs.json``: steps/s of each Gavel job type on
  one GPU (the ``null`` entry of scale factor 1).  Gavel also lists 2, 4 and 8 GPUs, but
  those are not used: their batch is per worker (so not a fixed global batch), three job
  types have none, and they are not curves one can trust (v100 ResNet-18 at batch 16 runs
  3.1 times faster on 2 GPUs than on 1; p100 beats v100 at 8 GPUs on ResNet-50 at batch 16).

**Unit.**  :meth:`TypeSpeed.rate` is *samples per second* (iterations/s × global batch).
The sources run different global batches (bert: 64/128 on A100, 384 on T4; ResNet-50: up to
256 on A100, 6400 on T4, up to 128 in Gavel), so iterations/s cannot be compared across
them; samples/s can, once the GPU is full.  :meth:`TypeSpeed.iterations_per_s` gives the
rate in iterations at the curve's own batch.

**Same workload only.**  A ratio between two types is only ever taken between two runs of
the *same network on the same data*.  Two names collide across the sources without being the
same job, checked in the upstream code: ElasticFlow's A100 ``bert`` is a
BertForSequenceClassification run and Pollux's T4 ``bert`` is SQuAD; ElasticFlow's A100
``deepspeech2`` is a 3-CNN/5-BiGRU model on LibriSpeech and Pollux's is on CMU-ARCTIC.
Their file ratios (about 35 for bert and 3.3 for deepspeech2, against 2.2 for ResNet-50)
say how the tasks differ, not how the GPUs do.  The runs that really are shared are
ResNet-50/ImageNet (a100 ``resnet50``, t4 ``imagenet``, Gavel ``ResNet-50``: all five types)
and ResNet-18/CIFAR-10 (t4 ``cifar10``, Gavel ``ResNet-18``).

**How a speed is built** for a model on a type, from the model's *home* curve (a100 when the
A100 folder has the model, else t4; ``home=`` picks the other one where both have a run):

1. ``curve`` — the type has its own multi-GPU curve of the home's workload: that curve.
2. ``one-gpu`` — the type has a one-GPU figure of the same workload (Gavel):
   home curve × ρ, with ρ = this type's 1-GPU samples/s ÷ the home's 1-GPU samples/s.  The
   scaling shape is the home type's (nobody measured this type's).
3. ``fallback`` — the type has no run of the workload: home curve × the *median* of ρ over
   every workload measured on both types (for v100 against a100 that is ResNet-50 alone).
   No figure is invented per model; the fallback says which workloads it took.

1-GPU samples/s are read at each source's largest global batch that ran on one GPU, where
the GPU is fullest (a100 ResNet-50: 256 → 472 samples/s; Gavel v100 ResNet-50: 128 → 320).
Between measured GPU counts the rate is linear; beyond the largest (and below the smallest)
it stays flat, as :mod:`slurm_elastic.sim.profiles` does: no speed-up nobody measured.
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slurm_elastic.errors import ConfigError

#: GPU types with figures in the traces: ElasticFlow's two folders and Gavel's worker types.
KNOWN_TYPES: tuple[str, ...] = ("a100", "t4", "v100", "p100", "k80")
#: Types with multi-GPU curves (ElasticFlow folder name per type); only these can be a home.
CURVE_FOLDERS: dict[str, str] = {"a100": "A100", "t4": "T4"}
#: Types with Gavel single-GPU figures.
GAVEL_TYPES: tuple[str, ...] = ("v100", "p100", "k80")
#: GPUs per node when ``xGPUS`` is left out: the profiled machine, where the README names it.
DEFAULT_GPUS_PER_NODE: dict[str, int] = {"a100": 8, "t4": 4}

#: Models the simulator knows (Pollux's and ElasticFlow's), in a fixed order.
MODELS: tuple[str, ...] = (
    "bert",
    "cifar10",
    "deepspeech2",
    "imagenet",
    "ncf",
    "yolov3",
    "gpt2",
    "inception3",
    "resnet50",
    "resnet50_cifar10",
    "vgg16",
)

_RESNET50 = "resnet50/imagenet"
_RESNET18 = "resnet18/cifar10"
_RN50_RUNS = {
    "a100": (_RESNET50, "resnet50"),
    "t4": (_RESNET50, "imagenet"),
    **{t: (_RESNET50, "ResNet-50") for t in GAVEL_TYPES},
}

#: model -> GPU type -> (workload, file stem or Gavel job type).  Two runs share a workload
#: id only when they train the same network on the same data (module docstring).
RUNS: dict[str, dict[str, tuple[str, str]]] = {
    "bert": {
        "a100": ("bert/sequence-classification (ElasticFlow)", "bert"),
        "t4": ("bert/squad (Pollux)", "bert"),
    },
    "deepspeech2": {
        "a100": ("deepspeech2/librispeech (ElasticFlow)", "deepspeech2"),
        "t4": ("deepspeech2/cmu-arctic (Pollux)", "deepspeech2"),
    },
    "resnet50": _RN50_RUNS,
    "imagenet": _RN50_RUNS,
    "cifar10": {"t4": (_RESNET18, "cifar10"), **{t: (_RESNET18, "ResNet-18") for t in GAVEL_TYPES}},
    "ncf": {"t4": ("ncf (Pollux)", "ncf")},
    "yolov3": {"t4": ("yolov3 (Pollux)", "yolov3")},
    "gpt2": {"a100": ("gpt2 (ElasticFlow)", "gpt2")},
    "inception3": {"a100": ("inception3 (ElasticFlow)", "inception3")},
    "resnet50_cifar10": {"a100": ("resnet50/cifar10 (ElasticFlow)", "resnet50_cifar10")},
    "vgg16": {"a100": ("vgg16 (ElasticFlow)", "vgg16")},
}


# --------------------------------------------------------------------------- cluster spec


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of one type, in the Slurm partition
    ``partition`` (named after the type, so a job's partition says which GPU it gets)."""

    gpu_type: str
    nodes: int
    gpus_per_node: int
    partition: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


_COUNTS = re.compile(r"(-?\d+)(?:x(-?\d+))?")


def parse_cluster(text: str) -> tuple[NodeGroup, ...]:
    """``TYPE:NODES[xGPUS],...`` (e.g. ``t4:16x4,a100:8x8``) -> one group per type, in order.

    Types are case-insensitive; spaces around parts are ignored.  Without ``xGPUS`` a type
    gets :data:`DEFAULT_GPUS_PER_NODE` and a type not in it is refused (module docstring).
    Raises :class:`ConfigError` naming the bad part."""
    if not text.strip():
        raise ConfigError("cluster spec is empty; expected TYPE:NODES[xGPUS],... e.g. t4:16x4")
    groups: list[NodeGroup] = []
    for index, raw in enumerate(text.split(","), start=1):
        part = raw.strip()
        if not part:
            raise ConfigError(f"cluster spec {text.strip()!r}: part {index} is empty")
        name, colon, counts = (s.strip() for s in part.lower().partition(":"))
        if not colon or not name or not counts:
            raise ConfigError(
                f"cluster spec part {part!r}: expected TYPE:NODES[xGPUS], e.g. a100:8x8"
            )
        if name not in KNOWN_TYPES:
            raise ConfigError(
                f"cluster spec part {part!r}: unknown GPU type {name!r} "
                f"(known: {', '.join(KNOWN_TYPES)})"
            )
        if any(g.gpu_type == name for g in groups):
            raise ConfigError(f"cluster spec part {part!r}: GPU type {name!r} is listed twice")
        match = _COUNTS.fullmatch(counts)
        if match is None:
            raise ConfigError(
                f"cluster spec part {part!r}: {counts!r} is not NODES or NODESxGPUS "
                "(whole numbers, e.g. 8x8)"
            )
        nodes = int(match[1])
        if nodes < 1:
            raise ConfigError(f"cluster spec part {part!r}: node count must be at least 1")
        if match[2] is not None:
            per_node = int(match[2])
        elif name in DEFAULT_GPUS_PER_NODE:
            per_node = DEFAULT_GPUS_PER_NODE[name]
        else:
            raise ConfigError(
                f"cluster spec part {part!r}: give GPUs per node for {name} "
                f"(e.g. {name}:{nodes}x8); the traces name no {name} server to default from"
            )
        if per_node < 1:
            raise ConfigError(f"cluster spec part {part!r}: GPUs per node must be at least 1")
        groups.append(NodeGroup(name, nodes, per_node, partition=name))
    return tuple(groups)


# --------------------------------------------------------------------------- readers


@functools.cache
def _curve_table(
    traces_dir: Path, gpu_type: str, stem: str
) -> dict[int, tuple[tuple[float, float], ...]]:
    """ElasticFlow table: global batch -> ((gpus, iterations/s), ...), usable points only."""
    path = traces_dir / "elasticflow_throughputs" / CURVE_FOLDERS[gpu_type] / f"{stem}.csv"
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read throughputs {path}: {exc.strerror}") from exc
    table: dict[int, tuple[tuple[float, float], ...]] = {}
    for line, row in enumerate(rows, start=2):
        points = []
        try:
            for key, value in row.items():
                if key == "global_batch_size" or not value:
                    continue
                iters = float(value)
                if math.isfinite(iters) and iters > 0:  # nan / 0: infeasible or not measured
                    points.append((float(key), iters))
            if points:
                table[int(row["global_batch_size"])] = tuple(sorted(points))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path} line {line}: not a number where one belongs") from exc
    if not table:
        raise ConfigError(f"no usable rows in {path}")
    return table


_GAVEL_JOB = re.compile(r"(.+) \(batch size (\d+)\)")


@functools.cache
def _gavel_one_gpu(traces_dir: Path) -> dict[tuple[str, str], dict[int, float]]:
    """(worker type, job type) -> {batch: steps/s alone on one GPU}, feasible entries only.

    Gavel's keys are ``"('<job> (batch size N)', scale_factor)"`` strings; jobs without a
    batch (A3C, CycleGAN) are skipped, as no model here maps to them."""
    path = traces_dir / "gavel" / "simulation_throughputs.json"
    try:
        with path.open() as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read Gavel throughputs {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Gavel throughputs {path} are not JSON: {exc.msg}") from exc
    out: dict[tuple[str, str], dict[int, float]] = {}
    for worker in GAVEL_TYPES:
        for key, entry in data.get(worker, {}).items():
            try:
                job, scale = ast.literal_eval(key)
                match = _GAVEL_JOB.fullmatch(job)
                steps = float(entry["null"])
            except (KeyError, TypeError, ValueError, SyntaxError) as exc:
                raise ConfigError(f"{path}: {worker} entry {key!r} is not Gavel's format") from exc
            if scale == 1 and match is not None and steps > 0:
                out.setdefault((worker, match[1]), {})[int(match[2])] = steps
    return out


def _one_gpu_samples(traces_dir: Path, gpu_type: str, key: str) -> tuple[float, str]:
    """1-GPU samples/s of one run at its largest batch that ran on one GPU, and where."""
    if gpu_type in CURVE_FOLDERS:
        table = _curve_table(traces_dir, gpu_type, key)
        one = {b: pts[0][1] for b, pts in table.items() if pts[0][0] == 1.0}
        where = f"elasticflow_throughputs/{CURVE_FOLDERS[gpu_type]}/{key}.csv"
    else:
        one = _gavel_one_gpu(traces_dir).get((gpu_type, key), {})
        where = f"gavel {gpu_type} {key!r}"
    if not one:
        raise ConfigError(f"no one-GPU figure in {where}")
    batch = max(one)
    return one[batch] * batch, f"{where}@{batch}"


# --------------------------------------------------------------------------- speeds


@dataclass(frozen=True, slots=True)
class TypeSpeed:
    """Speed of one model on one GPU type vs GPUs, in samples/s at global batch ``batch``.

    ``basis`` is how it was obtained (module docstring): ``curve``, ``one-gpu`` or
    ``fallback``; ``home`` is the type whose curve gives the scaling shape; ``source`` says
    which files and which factor, so a surprising figure can be traced back."""

    model: str
    gpu_type: str
    batch: int
    gpus: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    basis: str
    home: str
    source: str

    def rate(self, gpus: float) -> float:
        """Samples/s on ``gpus`` GPUs: linear between measured counts, flat outside."""
        return float(np.interp(gpus, self.gpus, self.samples_per_s))

    def iterations_per_s(self, gpus: float) -> float:
        """Training iterations/s at ``batch`` on ``gpus`` GPUs."""
        return self.rate(gpus) / self.batch


def _runs(model: str) -> dict[str, tuple[str, str]]:
    if model not in RUNS:
        raise ConfigError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    return RUNS[model]


def _check_type(gpu_type: str) -> None:
    if gpu_type not in KNOWN_TYPES:
        raise ConfigError(f"unknown GPU type {gpu_type!r}; known: {', '.join(KNOWN_TYPES)}")


def homes(model: str) -> tuple[str, ...]:
    """Types whose multi-GPU curve can carry ``model`` (default first: a100, then t4)."""
    return tuple(t for t in CURVE_FOLDERS if t in _runs(model))


def _median_ratio(traces_dir: Path, gpu_type: str, home: str) -> tuple[float, str]:
    """Median 1-GPU samples/s ratio gpu_type/home over workloads run on both types."""
    shared: dict[str, float] = {}
    for runs in RUNS.values():
        if gpu_type in runs and home in runs and runs[gpu_type][0] == runs[home][0]:
            workload = runs[home][0]
            mine, _ = _one_gpu_samples(traces_dir, gpu_type, runs[gpu_type][1])
            theirs, _ = _one_gpu_samples(traces_dir, home, runs[home][1])
            shared[workload] = mine / theirs
    if not shared:
        raise ConfigError(f"no workload runs on both {gpu_type} and {home}: no ratio to use")
    names = ", ".join(sorted(shared))
    return statistics.median(shared.values()), f"median of {len(shared)}: {names}"


@functools.cache
def type_speed(
    traces_dir: Path,
    model: str,
    gpu_type: str,
    batch: int | None = None,
    home: str | None = None,
) -> TypeSpeed:
    """Samples/s of ``model`` vs GPUs on ``gpu_type`` (module docstring for the rules).

    ``batch``: the global batch of the curve, a row of the file the curve is read from
    (the type's own file for basis ``curve``, else the home's); default its largest row.
    ``home``: a100 or t4, the curve the shape comes from; default a100 where it has a run.
    Raises :class:`ConfigError` for an unknown model or type, a home without a run of the
    model, a batch with no row, or a file that cannot be read."""
    _check_type(gpu_type)
    runs = _runs(model)
    if home is None:
        home = homes(model)[0]
    elif home not in homes(model):
        raise ConfigError(
            f"home {home!r} has no curve for {model}; choose one of {', '.join(homes(model))}"
        )
    workload, home_key = runs[home]
    own = runs.get(gpu_type)
    same = own is not None and own[0] == workload
    curve_type = gpu_type if same and gpu_type in CURVE_FOLDERS else home
    curve_key = runs[curve_type][1]
    table = _curve_table(traces_dir, curve_type, curve_key)
    row = max(table) if batch is None else batch
    if row not in table:
        raise ConfigError(
            f"no {curve_type} row for {model} at global batch {row}; have {sorted(table)}"
        )
    points = table[row]
    where = f"elasticflow_throughputs/{CURVE_FOLDERS[curve_type]}/{curve_key}.csv@{row}"
    if curve_type == gpu_type:
        basis, factor, why = "curve", 1.0, where
    elif same and own is not None:
        mine, mine_at = _one_gpu_samples(traces_dir, gpu_type, own[1])
        theirs, theirs_at = _one_gpu_samples(traces_dir, home, home_key)
        basis, factor = "one-gpu", mine / theirs
        why = f"{where} x {factor:.4g} (1 GPU: {mine_at} / {theirs_at})"
    else:
        factor, which = _median_ratio(traces_dir, gpu_type, home)
        basis = "fallback"
        why = f"{where} x {factor:.4g} ({gpu_type}/{home} 1-GPU ratio, {which})"
    return TypeSpeed(
        model=model,
        gpu_type=gpu_type,
        batch=row,
        gpus=tuple(g for g, _ in points),
        samples_per_s=tuple(it * row * factor for _, it in points),
        basis=basis,
        home=home,
        source=why,
    )


def speed_ratio(
    traces_dir: Path, model: str, type_a: str, type_b: str, gpus: float, home: str | None = None
) -> float:
    """How many times faster ``model`` trains on ``gpus`` GPUs of ``type_a`` than of
    ``type_b`` (samples/s over samples/s, each type at its default batch).

    Multiply a job's own profile rate on ``type_b`` by this to get its rate on ``type_a``.
    It depends on ``gpus`` only where a type has a curve of its own besides the home's
    (ResNet-50 on t4 and a100); everywhere else both speeds are the home's curve times a
    constant, so the ratio is the same at every size."""
    a = type_speed(traces_dir, model, type_a, home=home)
    b = type_speed(traces_dir, model, type_b, home=home)
    return a.rate(gpus) / b.rate(gpus)


#: The benchmark a site runs on each GPU type to price it (``benchmark_speeds``): ResNet-50 on
#: ImageNet, the one workload whose figures cover all five types.
BENCHMARK_MODEL = "resnet50"


def benchmark_speeds(traces_dir: Path, gpu_types: Iterable[str]) -> dict[str, float]:
    """Type -> relative speed of one GPU (the slowest 1.0), from one benchmark: the
    :data:`BENCHMARK_MODEL` samples/s on one GPU of each type, at the largest batch that
    ran there.  What a site would put in the daemon's ``cluster.gpu_speeds`` after
    benchmarking one model per type; the simulated jobs' own speeds differ by model
    (``speed_ratio``), and the daemon learns those only from the jobs' reports."""
    wanted = tuple(dict.fromkeys(gpu_types))
    runs = _runs(BENCHMARK_MODEL)
    samples = {}
    for gpu_type in wanted:
        _check_type(gpu_type)
        samples[gpu_type], _ = _one_gpu_samples(traces_dir, gpu_type, runs[gpu_type][1])
    slowest = min(samples.values(), default=1.0)
    return {gpu_type: value / slowest for gpu_type, value in samples.items()}


def models_for(traces_dir: Path, gpu_types: Iterable[str]) -> tuple[str, ...]:
    """Models with a figure of one workload on every type in ``gpu_types`` (basis ``curve``
    or ``one-gpu`` for some home), in :data:`MODELS` order: the models whose speeds across
    those types rest on measurements, not on the fallback median."""
    wanted = tuple(gpu_types)
    for gpu_type in wanted:
        _check_type(gpu_type)
    found = []
    for model in MODELS:
        for home in homes(model):
            speeds = [type_speed(traces_dir, model, t, home=home) for t in wanted]
            if all(s.basis != "fallback" for s in speeds):
                found.append(model)
                break
    return tuple(found)
