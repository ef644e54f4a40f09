"""PNG reports (matplotlib, Agg backend): JCT CDF, GPU utilisation and queue length."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import numpy as np

from slurm_elastic.errors import MissingExtra
from slurm_elastic.sim.metrics import timeline
from slurm_elastic.sim.runner import Outcome

PLOTS = ("jct_cdf.png", "utilization.png", "queue.png")


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` drawing to files; ``MissingExtra`` without the ``plot`` extra."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise MissingExtra("plotting", "matplotlib", "plot") from None

    matplotlib.use("Agg")  # files only: no display on a head node
    import matplotlib.pyplot as plt

    return plt


def _binned(hours: np.ndarray, values: np.ndarray, width_h: float) -> tuple[np.ndarray, ...]:
    """Step series -> time-weighted means per bin (readable over weeks of trace)."""
    if hours.size < 2:
        return hours, values
    edges = np.arange(hours[0], hours[-1] + width_h, width_h)
    dt = np.diff(hours)
    weight = np.bincount(np.digitize(hours[:-1], edges), weights=dt, minlength=edges.size + 1)
    total = np.bincount(
        np.digitize(hours[:-1], edges), weights=values[:-1] * dt, minlength=edges.size + 1
    )
    ok = weight > 0
    centers = np.append(edges, edges[-1] + width_h) - width_h / 2
    return centers[ok], total[ok] / weight[ok]


def write_plots(outcomes: Mapping[str, Outcome], out_dir: Path, *, title: str) -> list[Path]:
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in PLOTS]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, outcome in outcomes.items():
        jct = np.sort([(j.end or 0.0) - j.submit for j in outcome.jobs]) / 3600.0
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT CDF — {title}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    for path, column, label in ((paths[1], 1, "busy GPUs (%)"), (paths[2], 2, "queued jobs")):
        fig, ax = plt.subplots(figsize=(9, 4))
        for name, outcome in outcomes.items():
            series = timeline(outcome)
            hours, values = series[0], series[column].astype(float)
            if column == 1:
                values = 100.0 * values / (outcome.total_nodes * outcome.gpus_per_node)
            span = float(hours[-1] - hours[0]) if hours.size else 0.0
            x, y = _binned(hours, values, max(span / 300.0, 1.0 / 60.0))
            ax.plot(x, y, label=name, linewidth=1)
        ax.set_xlabel("hours since first submission")
        ax.set_ylabel(label)
        ax.set_title(f"{label} — {title}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths
