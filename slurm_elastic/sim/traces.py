"""Trace readers, chosen by the CSV header, all yielding :class:`TraceJob`.

Formats (header columns that identify each; extra columns are ignored):

* **philly** — ``timestamp,duration,num_gpus,gpu_time,cluster`` (Pollux's Philly extract).
  Arrival = seconds since the first timestamp's midnight; ``cluster`` (the VC) is kept.
* **itp-augmented** — ``job_id,submission_time,duration,num_gpu`` plus ``model_name,
  batch_size,num_iteration`` (ElasticFlow's augmented ITP traces).
* **itp-raw** — ``job_id,submission_time,duration,num_gpu`` (no model).
* **pollux** — ``name,time,application,num_replicas,batch_size`` (Pollux workloads; no
  duration: the job trains until the end of its model's validation curve).
* **canonical** — this project's own format, for sites writing their own traces::

      job_id,submit_s,duration_s,gpus[,model,batch_size,partition,user,elastic,min_gpus,max_gpus]

  ``submit_s`` seconds from any origin, ``duration_s`` run time at ``gpus``; optional
  ``model`` (a Pollux or A100 model name) with ``batch_size`` (A100 global batch);
  ``elastic`` 1/0 overrides the seeded elastic draw; ``min_gpus``/``max_gpus`` override
  the default range.  Empty optional cells mean "use the default rule".
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.types import JobHistory


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, format-independent."""

    job_id: str
    submit_s: float
    gpus: int
    duration_s: float | None  # run time at ``gpus``; None when the trace gives none (Pollux)
    model: str | None = None
    batch_size: int | None = None
    partition: str = ""
    user: str = "user"
    elastic: bool | None = None  # None: decided by the seeded elastic fraction
    min_gpus: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """A cluster trace read from a file: its name, format and jobs."""

    name: str
    format: str
    jobs: tuple[TraceJob, ...]


_ITP = ("job_id", "submission_time", "duration", "num_gpu")
_FORMATS: tuple[tuple[str, frozenset[str]], ...] = (
    ("itp-augmented", frozenset({*_ITP, "model_name", "batch_size"})),
    ("itp-raw", frozenset(_ITP)),
    ("philly", frozenset({"timestamp", "duration", "num_gpus"})),
    ("pollux", frozenset({"name", "time", "application", "num_replicas", "batch_size"})),
    ("canonical", frozenset({"job_id", "submit_s", "duration_s", "gpus"})),
)


def detect_format(header: Iterable[str]) -> str:
    cols = {c.strip() for c in header}
    for name, needed in _FORMATS:
        if needed <= cols:
            return name
    raise ConfigError(
        f"unrecognised trace header {sorted(cols)}; expected Philly, ITP, Pollux or the "
        "canonical columns job_id,submit_s,duration_s,gpus"
    )


def read_trace(path: Path, *, limit: int | None = None) -> Trace:
    """Read ``path`` (format from its header); ``limit`` keeps the first N jobs."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            fmt = detect_format(reader.fieldnames or ())
            jobs: list[TraceJob] = []
            for lineno, row in enumerate(reader, start=2):
                if limit is not None and len(jobs) >= limit:
                    break
                try:
                    jobs.append(_PARSERS[fmt](row, len(jobs)))
                except (KeyError, ValueError, TypeError) as exc:
                    raise ConfigError(f"{path}:{lineno}: bad {fmt} row: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror}") from exc
    if not jobs:
        raise ConfigError(f"trace {path} has no jobs")
    if fmt == "philly":
        jobs = _rebase_philly(jobs)
    jobs.sort(key=lambda j: j.submit_s)  # stable: ties keep file order
    return Trace(name=path.stem, format=fmt, jobs=tuple(jobs))


def _positive_int(text: str, what: str) -> int:
    value = int(float(text))
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {text!r}")
    return value


def _duration(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    return value


def _philly(row: dict[str, str], idx: int) -> TraceJob:
    # Arrival is rebased after reading (needs the first timestamp); keep epoch seconds here.
    ts = dt.datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
    return TraceJob(
        job_id=f"philly-{idx}",
        submit_s=ts.replace(tzinfo=dt.UTC).timestamp(),
        gpus=_positive_int(row["num_gpus"], "num_gpus"),
        duration_s=_duration(row["duration"]),
        partition="",
        user=row.get("cluster") or "user",
    )


def _rebase_philly(jobs: list[TraceJob]) -> list[TraceJob]:
    first = min(j.submit_s for j in jobs)
    midnight = first - (first % 86400)
    return [replace(j, submit_s=j.submit_s - midnight) for j in jobs]


def _itp_raw(row: dict[str, str], idx: int) -> TraceJob:
    return TraceJob(
        job_id=row["job_id"],
        submit_s=float(row["submission_time"]),
        gpus=_positive_int(row["num_gpu"], "num_gpu"),
        duration_s=_duration(row["duration"]),
    )


def _itp_augmented(row: dict[str, str], idx: int) -> TraceJob:
    base = _itp_raw(row, idx)
    return TraceJob(
        job_id=base.job_id,
        submit_s=base.submit_s,
        gpus=base.gpus,
        duration_s=base.duration_s,
        model=row["model_name"],
        batch_size=_positive_int(row["batch_size"], "batch_size"),
    )


def _pollux(row: dict[str, str], idx: int) -> TraceJob:
    return TraceJob(
        job_id=row["name"],
        submit_s=float(row["time"]),
        gpus=_positive_int(row["num_replicas"], "num_replicas"),
        duration_s=None,
        model=row["application"],
        batch_size=_positive_int(row["batch_size"], "batch_size"),
    )


def _opt_int(row: dict[str, str], key: str) -> int | None:
    text = (row.get(key) or "").strip()
    return _positive_int(text, key) if text else None


def _canonical(row: dict[str, str], idx: int) -> TraceJob:
    elastic_text = (row.get("elastic") or "").strip().lower()
    if elastic_text not in {"", "0", "1", "true", "false"}:
        raise ValueError(f"elastic must be 1/0/true/false, got {elastic_text!r}")
    return TraceJob(
        job_id=row["job_id"],
        submit_s=float(row["submit_s"]),
        gpus=_positive_int(row["gpus"], "gpus"),
        duration_s=_duration(row["duration_s"]),
        model=(row.get("model") or "").strip() or None,
        batch_size=_opt_int(row, "batch_size"),
        partition=(row.get("partition") or "").strip(),
        user=(row.get("user") or "").strip() or "user",
        elastic=None if not elastic_text else elastic_text in {"1", "true"},
        min_gpus=_opt_int(row, "min_gpus"),
        max_gpus=_opt_int(row, "max_gpus"),
    )


_PARSERS = {
    "philly": _philly,
    "itp-raw": _itp_raw,
    "itp-augmented": _itp_augmented,
    "pollux": _pollux,
    "canonical": _canonical,
}


def from_history(
    history: Iterable[JobHistory], *, gpus_per_node: int, name: str = "sacct"
) -> Trace:
    """A trace from the site's own accounting: one job per finished job with a start.

    Size = the first allocation's node count × ``gpus_per_node`` (what the user asked
    for; later resizes are the daemon's doing, not demand); duration = end − start.
    """
    jobs = []
    for h in history:
        if h.start_time is None or h.end_time is None or h.submit_time is None:
            continue
        if not h.allocations or h.end_time <= h.start_time:
            continue
        jobs.append(
            TraceJob(
                job_id=str(h.job_id),
                submit_s=h.submit_time,
                gpus=max(1, h.allocations[0].node_count * gpus_per_node),
                duration_s=h.end_time - h.start_time,
                partition=h.partition,
                user=h.user,
            )
        )
    if not jobs:
        raise ConfigError("no finished jobs with start and end times in that accounting window")
    origin = min(j.submit_s for j in jobs)
    rebased = [replace(j, submit_s=j.submit_s - origin) for j in jobs]
    rebased.sort(key=lambda j: j.submit_s)
    return Trace(name=name, format="sacct", jobs=tuple(rebased))
