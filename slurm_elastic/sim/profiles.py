"""Per-model ground truth for the simulator: speed vs GPUs and a convergence curve.

Two public sources are read at run time from the traces directory (nothing is copied
into the package):

* ``elasticflow_throughputs/A100/<model>.csv`` — training iterations/s at a fixed global
  batch for 1, 2, 4, ... 64 GPUs (ElasticFlow, ASPLOS'23).  Used for the ITP traces.
* ``pollux/profiles/<model>/`` — step times per placement and local batch
  (``placements.csv`` + ``scalability.csv``) and validation curves per global batch
  (``validation-<B>.csv``) from Pollux (OSDI'21).  Used for Philly and Pollux workloads.

For a Pollux model the rate is *goodput* in units of "iterations at the smallest validated
batch B0" per second: with a per-GPU batch ``b`` (B0, or the largest measured local batch
when B0 does not fit) and ``g`` GPUs, ``rate(g) = p(g*b) / step_time(g, b)`` where
``p(B)`` is the statistical progress one step at global batch ``B`` makes (read off the
validation curve at B: final progress / final iteration) and ``step_time`` is the best
measured placement.  A job that keeps its size therefore runs at exactly its trace
duration (work is normalised to it), and growing it pays the real statistical cost of a
larger batch.

Between measured GPU counts the rate is interpolated linearly; beyond the largest
measured count it stays flat (no speed-up is assumed that nobody measured).

Each profile says the GPU type it was measured on (``Profile.gpu_type``): t4 for the Pollux
profiles (AWS g4dn.12xlarge), a100 for the ElasticFlow A100 tables.  On a cluster with
typed partitions (``sim.gputypes``) a job's rate on another type is its profile's rate
times ``gputypes.speed_ratio`` (``sim.workload.JobSpec.rate_at``).
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slurm_elastic.errors import ConfigError
from slurm_elastic.model.convergence import PATIENCE_EPOCHS, observed_convergence

#: The GPU types the two sources measured on (the traces README): Pollux's T4 servers and
#: ElasticFlow's A100 ones.
POLLUX_GPU_TYPE = "t4"
A100_GPU_TYPE = "a100"

#: Pollux models and the validated batch used as the progress unit (smallest B).
POLLUX_MODELS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

#: A100 models whose convergence curve is borrowed from the closest Pollux model
#: (same task family) for the loss values reported to the daemon.
CURVE_FOR_A100: dict[str, str] = {
    "bert": "bert",
    "gpt2": "bert",
    "deepspeech2": "deepspeech2",
    "inception3": "imagenet",
    "resnet50": "imagenet",
    "vgg16": "imagenet",
    "resnet50_cifar10": "cifar10",
}

#: Seconds to write + read a checkpoint per model, added to every resize on top of the
#: measured restart overhead.  These are assumptions sized by model parameter count
#: (ResNet-18/NCF: tens of MB; BERT/GPT-2/VGG16: ~0.5-1.5 GB incl. optimizer state),
#: not measurements; ``SimConfig.checkpoint_s`` overrides them.
CHECKPOINT_S: dict[str, float] = {
    "bert": 8.0,
    "gpt2": 10.0,
    "vgg16": 8.0,
    "deepspeech2": 5.0,
    "inception3": 4.0,
    "resnet50": 4.0,
    "imagenet": 4.0,
    "yolov3": 4.0,
    "resnet50_cifar10": 2.0,
    "cifar10": 2.0,
    "ncf": 2.0,
}


@dataclass(frozen=True, slots=True)
class Curve:
    """Validation metric as a function of the fraction of training done (0..1), one point
    per epoch after the first at 0; ``stop_fraction``: where the convergence criterion
    first holds on the whole curve (``model.convergence.observed_convergence``, the bench's
    truth), 1.0 where it never does."""

    fraction: tuple[float, ...]
    metric: tuple[float, ...]
    higher_is_better: bool
    stop_fraction: float = 1.0

    def at(self, frac: float) -> float:
        return float(np.interp(frac, self.fraction, self.metric))

    def epoch_at(self, frac: float) -> float:
        """Epochs done at ``frac`` (the point at 0 is epoch 0, the next ones 1, 2, ...)."""
        return float(np.interp(frac, self.fraction, np.arange(len(self.fraction))))


@dataclass(frozen=True, slots=True)
class Profile:
    """Speed of one (model, batch) pair vs GPUs, in steps/s, plus its convergence curve."""

    model: str
    batch: int  # global batch (A100) or B0 (Pollux) — the unit a "step" is counted in
    gpus: tuple[float, ...]  # measured GPU counts, ascending
    rate: tuple[float, ...]  # steps/s at those counts
    curve: Curve
    checkpoint_s: float
    source: str
    full_run_steps: float = 0.0  # steps of one whole validation curve (Pollux models)
    # The GPU type the rates were measured on ("" when unknown, as for the demo's measured
    # rates: such a profile runs on untyped clusters only).
    gpu_type: str = ""

    def rate_at(self, gpus: float) -> float:
        """Steps/s at ``gpus`` (fractional allowed): linear between points, flat outside."""
        return float(np.interp(gpus, self.gpus, self.rate))


# --------------------------------------------------------------------------- readers


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read profile {path}: {exc.strerror}") from exc


@functools.cache
def _curve(pollux_dir: Path, model: str) -> Curve:
    b0 = min(_validation_batches(pollux_dir, model))
    rows = _rows(pollux_dir / model / f"validation-{b0}.csv")
    progress = np.array([float(r["progress"]) for r in rows])
    metric = np.array([float(r["metric"]) for r in rows])
    frac = progress / progress[-1]
    rising = bool(metric[-1] > metric[0])
    epochs = np.arange(1, len(metric) + 1, dtype=float)
    stop = observed_convergence(epochs, metric, higher_is_better=rising, window=PATIENCE_EPOCHS)
    return Curve(
        fraction=(0.0, *frac.tolist()),
        metric=(float(metric[0]), *metric.tolist()),
        higher_is_better=rising,
        stop_fraction=1.0 if stop is None else float(frac[int(stop) - 1]),
    )


@functools.cache
def _validation_batches(pollux_dir: Path, model: str) -> tuple[int, ...]:
    mdir = pollux_dir / model
    found = sorted(int(p.stem.split("-", 1)[1]) for p in mdir.glob("validation-*.csv"))
    if not found:
        raise ConfigError(f"no validation-*.csv for model {model!r} under {mdir}")
    return tuple(found)


def _full_run(pollux_dir: Path, model: str) -> float:
    b0 = min(_validation_batches(pollux_dir, model))
    return float(_rows(pollux_dir / model / f"validation-{b0}.csv")[-1]["progress"])


def _progress_per_step(pollux_dir: Path, model: str) -> tuple[np.ndarray, np.ndarray]:
    """p(B): statistical progress (B0-steps) per optimizer step at global batch B."""
    batches = _validation_batches(pollux_dir, model)
    per_step = []
    for b in batches:
        last = _rows(pollux_dir / model / f"validation-{b}.csv")[-1]
        per_step.append(float(last["progress"]) / float(last["iteration"]))
    return np.array(batches, dtype=float), np.array(per_step)


def _step_times(pollux_dir: Path, model: str) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """GPU count -> one (local_bsz, step_time) series per measured placement."""
    series: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for r in _rows(pollux_dir / model / "placements.csv"):
        g = sum(int(c) for c in r["placement"])
        series.setdefault((g, r["placement"]), []).append(
            (int(r["local_bsz"]), float(r["step_time"]))
        )
    for r in _rows(pollux_dir / model / "scalability.csv"):
        key = (int(r["num_replicas"]), "n" + r["num_nodes"])
        series.setdefault(key, []).append((int(r["local_bsz"]), float(r["step_time"])))
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (g, _), pts in series.items():
        pts.sort()
        out.setdefault(g, []).append(
            (np.array([p[0] for p in pts], float), np.array([p[1] for p in pts]))
        )
    return out


@functools.cache
def pollux_profile(pollux_dir: Path, model: str) -> Profile:
    if model not in POLLUX_MODELS:
        raise ConfigError(f"unknown Pollux model {model!r}; known: {', '.join(POLLUX_MODELS)}")
    b0 = min(_validation_batches(pollux_dir, model))
    val_b, val_p = _progress_per_step(pollux_dir, model)
    gpus, rates = [], []
    for g, placements in sorted(_step_times(pollux_dir, model).items()):
        local = min(float(b0), max(float(s[0][-1]) for s in placements))
        best = min(
            float(np.interp(local, bs, st)) for bs, st in placements if bs[0] <= local <= bs[-1]
        )
        # Progress per step at the global batch, interpolated in log(B), flat outside.
        p = float(np.interp(math.log(g * local), np.log(val_b), val_p))
        gpus.append(float(g))
        rates.append(p / best)
    return Profile(
        model=model,
        batch=b0,
        gpus=tuple(gpus),
        rate=tuple(rates),
        curve=_curve(pollux_dir, model),
        checkpoint_s=CHECKPOINT_S.get(model, 5.0),
        source=f"pollux:{model}",
        full_run_steps=_full_run(pollux_dir, model),
        gpu_type=POLLUX_GPU_TYPE,
    )


@functools.cache
def a100_table(throughput_dir: Path, model: str) -> dict[int, tuple[tuple[float, float], ...]]:
    """ElasticFlow A100 table: global batch -> ((gpus, iterations/s), ...) valid points."""
    path = throughput_dir / "A100" / f"{model}.csv"
    table: dict[int, tuple[tuple[float, float], ...]] = {}
    for r in _rows(path):
        pts = []
        for key, val in r.items():
            if key == "global_batch_size" or not val:
                continue
            v = float(val)
            if math.isfinite(v) and v > 0:  # nan / 0 mean "infeasible or not measured"
                pts.append((float(key), v))
        if pts:
            table[int(r["global_batch_size"])] = tuple(sorted(pts))
    if not table:
        raise ConfigError(f"no usable rows in {path}")
    return table


@functools.cache
def a100_profile(traces_dir: Path, model: str, batch: int) -> Profile:
    table = a100_table(traces_dir / "elasticflow_throughputs", model)
    if batch not in table:
        raise ConfigError(f"no A100 throughput for {model} at batch {batch}; have {sorted(table)}")
    pts = table[batch]
    curve_model = CURVE_FOR_A100.get(model, "imagenet")
    return Profile(
        model=model,
        batch=batch,
        gpus=tuple(p[0] for p in pts),
        rate=tuple(p[1] for p in pts),
        curve=_curve(traces_dir / "pollux" / "profiles", curve_model),
        checkpoint_s=CHECKPOINT_S.get(model, 5.0),
        source=f"elasticflow-a100:{model}@{batch}",
        gpu_type=A100_GPU_TYPE,
    )


def a100_models(traces_dir: Path) -> tuple[str, ...]:
    """Models the ITP augmented traces use (upstream's set; resnet50_cifar10 is not used)."""
    return tuple(m for m in CURVE_FOR_A100 if m != "resnet50_cifar10")


def find_traces_dir(start: Path) -> Path:
    """The traces folder holding the profiles: walk up from ``start``, then ../shared."""
    for d in [start, *start.parents]:
        if (d / "elasticflow_throughputs").is_dir() and (d / "pollux").is_dir():
            return d
        if (d / "traces" / "elasticflow_throughputs").is_dir():
            return d / "traces"
    raise ConfigError(
        f"cannot find the profiles (elasticflow_throughputs/, pollux/) above {start}; "
        "pass --profiles DIR"
    )
