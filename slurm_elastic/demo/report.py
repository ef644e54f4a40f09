"""The demo's results: ``summary.json``, the printed summary and ``timeline.png``.

Sizes and times are what Slurm showed (squeue while running, sacct for the final state and
end time).  The daemon's journal is read only to name what it did (``daemon_actions``)
and to recognise a start-at-size that happened between two observations (the job was
pinned and started within one poll).  The static-policy comparison is simulated and every
place that shows it says so.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slurm_elastic.config import Config
from slurm_elastic.demo.compare import MixJob, measured_rates, simulate_mix
from slurm_elastic.demo.observe import GROW, SHRINK, START, START_AT_SIZE, JobTrack, segments
from slurm_elastic.demo.session import RunRecord
from slurm_elastic.demo.workload import sample_log_dir
from slurm_elastic.samplelog import read_records, survivor_pauses
from slurm_elastic.types import ActionKind, JobHistory

SIM_LABEL = (
    "SIMULATED (slurm_elastic.sim, same job mix: arrivals, node ranges, work, and the speeds "
    "measured above, start-up counted as work; under static each elastic job asks for its max "
    "and keeps it)"
)


def build_summary(
    record: RunRecord,
    config: Config,
    history: Mapping[int, JobHistory],
    journal: list[dict[str, Any]],
    *,
    quick: bool,
    instance: int,
) -> dict[str, Any]:
    # Times count from the first submission as sacct recorded it (whole seconds).
    submits = [h.submit_time for h in history.values() if h.submit_time]
    t0 = min([record.started_at, *submits])
    pinned = record.pins | {
        (a["job_id"], a["to_nodes"])
        for a in journal
        if a["kind"] == ActionKind.START_AT_SIZE.value and a["status"] == "applied"
    }
    jobs: list[dict[str, Any]] = []
    for job_id, tr in sorted(record.tracks.items(), key=lambda kv: kv[1].submit_t):
        spec = record.jobs[job_id]
        h = history.get(job_id)
        end = (h.end_time if h and h.end_time else None) or tr.end_t
        start = (h.start_time if h and h.start_time else None) or tr.start_t
        # sacct's times share one clock (whole seconds); ours only when sacct has none.
        submit = (h.submit_time if h and h.submit_time else None) or tr.submit_t
        events = []
        for e in tr.events:
            kind = e.kind
            if kind == START and tr.elastic and (job_id, e.to_nodes) in pinned:
                kind = START_AT_SIZE  # pinned and started between two polls
            events.append(
                {"t_s": _rel(e.t, t0), "kind": kind, "from": e.from_nodes, "to": e.to_nodes}
            )
        progress = sorted(record.progress.get(job_id, {}).items())
        rates = measured_rates(progress, tr.sizes)
        state = h.state.value if h else tr.state
        jobs.append(
            {
                "name": spec.name,
                "job_id": job_id,
                "kind": "elastic" if spec.elastic else "rigid",
                "nodes": [spec.min_nodes, spec.max_nodes],
                "role": spec.role,
                "submit_s": _rel(submit, t0),
                "start_s": _rel(start, t0),
                "end_s": _rel(end, t0),
                "completion_s": round(end - submit, 1)
                if end is not None and state == "COMPLETED"
                else None,
                "state": state,
                "completed": state == "COMPLETED",
                "sizes": [[_rel(t, t0), n] for t, n in tr.sizes],
                "events": events,
                "companions": sorted(tr.companions),
                "total_steps": spec.total_steps,
                "last_step": progress[-1][1] if progress else None,
                "done_steps": done_steps(
                    record.out / "jobs" / spec.name, (job_id, *sorted(tr.companions))
                ),
                "steps_per_s": {str(n): round(r, 3) for n, r in rates.items()},
                "startup_s": startup_s(progress, tr.sizes, rates),
                "pauses": pauses(record.out / "jobs" / spec.name, t0) if spec.elastic else [],
            }
        )
    counts = {
        kind: sum(1 for j in jobs for e in j["events"] if e["kind"] == kind)
        for kind in (START_AT_SIZE, SHRINK, GROW)
    }
    done = [j for j in jobs if j["completion_s"] is not None and j["completed"]]
    ends = [j["end_s"] for j in jobs if j["end_s"] is not None]
    observed = {
        "jobs_completed": len(done),
        "avg_completion_s": round(statistics.fmean(j["completion_s"] for j in done), 1)
        if done
        else None,
        "makespan_s": round(max(ends) - min(j["submit_s"] for j in jobs), 1) if ends else None,
    }
    all_pauses = [p for j in jobs for p in j["pauses"]]
    return {
        "version": 1,
        "quick": quick,
        "resize_mode": record.mode,
        "instance": instance,
        "started_at": t0,  # the first submission (POSIX s)
        "duration_s": round(record.finished_at - t0, 1),
        "stop_reason": record.stop_reason,
        "cluster": record.cluster_line,
        "daemon": {
            "mode": config.mode,
            "policy": config.policy.name,
            "interval_s": config.interval_s,
            "guards": config.guards.model_dump(mode="json"),
            "exit_code": record.daemon_exit,
        },
        "jobs": jobs,
        "counts": counts,
        "all_completed": bool(jobs) and all(j["completed"] for j in jobs),
        "observed": observed,
        "survivors": {
            "pauses": len(all_pauses),
            "median_s": round(statistics.median(p["s"] for p in all_pauses), 2)
            if all_pauses
            else None,
            "max_s": round(max(p["s"] for p in all_pauses), 2) if all_pauses else None,
            "restarted": sum(1 for p in all_pauses if p["restarted"]),
        },
        "daemon_actions": journal,
    }


def add_simulation(summary: dict[str, Any], config: Config, nodes: int) -> None:
    """The same mix under static (and mip) in the simulator, labelled as simulated."""
    mix = []
    for j in summary["jobs"]:
        if j["kind"] == "elastic":
            rates = {int(n): r for n, r in j["steps_per_s"].items()}
            # Start-up (torch, rendezvous) is not modelled by the simulator: it becomes
            # work, at the job's speed at its largest measured size.
            extra = (j["startup_s"] or 0.0) * rates[max(rates)] if rates else 0.0
            work = float(j["total_steps"] or 0) + extra
        else:
            ran = (j["end_s"] or 0) - (j["start_s"] or 0)
            work, rates = max(1.0, ran), {}
        if work <= 0 or (j["kind"] == "elastic" and not rates):
            continue  # nothing measured (interrupted early): leave it out, and say so below
        mix.append(
            MixJob(
                j["name"],
                j["submit_s"],
                j["nodes"][0],
                j["nodes"][1],
                j["kind"] == "elastic",
                work,
                rates,
            )
        )
    left_out = sorted({j["name"] for j in summary["jobs"]} - {m.name for m in mix})
    survivors = summary.get("survivors") or {}
    stop_free = summary.get("resize_mode") == "torchft"
    # The cost of a resize in the simulated mip column: in the stop-free mode the pauses
    # measured above; under torchrun a restart's assumed cost (compare.RESTART_S).
    resize_s = survivors.get("median_s") if stop_free else None
    sim = simulate_mix(mix, nodes, config, resize_s=resize_s, stop_free=stop_free) if mix else {}
    summary["simulated"] = {"label": SIM_LABEL, "left_out": left_out, **sim}


def pauses(job_dir: Path, t0: float) -> list[dict[str, Any]]:
    """What each worker that stayed felt at each resize of the job (its sample log,
    ``samplelog.survivor_pauses``): the seconds between its last step at the old size and
    its first at the new one, and whether it was a new process (restarted)."""
    try:
        records = read_records(sample_log_dir(job_dir))
    except (OSError, ValueError):
        return []  # a log cut mid-write by a cancel: no pauses rather than no summary
    return [
        {
            "t_s": _rel(p.at, t0),
            "node": p.node,
            "from": p.from_world,
            "to": p.to_world,
            "s": round(p.seconds, 2),
            "restarted": p.restarted,
        }
        for p in survivor_pauses(records)
    ]


def startup_s(
    progress: list[tuple[float, int]], sizes: list[tuple[float, int]], rates: dict[int, float]
) -> float | None:
    """Seconds from the job's start to its first training step (srun, torchrun, import
    torch, rendezvous): the first report's time, less the steps it had made at its speed."""
    if not progress or not sizes:
        return None
    start, nodes = sizes[0]
    t, step = next(((t, s) for t, s in progress if s > 0), progress[0])
    rate = rates.get(nodes)
    if rate is None or t < start:
        return None
    return round(max(0.0, t - start - step / rate), 1)


_DONE = re.compile(r"^done: steps=(\d+) ", re.MULTILINE)


def done_steps(job_dir: Path, job_ids: Iterable[int]) -> int | None:
    """The steps the example says it trained when it finished (rank 0's last line).

    Rank 0 is wherever torch elastic put it in the last round, which may be a node of a
    companion job: so every output of the job and of its companions is searched.
    """
    found: list[int] = []
    for job_id in job_ids:
        try:
            text = (job_dir / f"slurm-{job_id}.out").read_text(errors="replace")
        except OSError:
            continue
        found += [int(n) for n in _DONE.findall(text)]
    return max(found) if found else None


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 1)


# --------------------------------------------------------------------------- text


def summary_text(summary: dict[str, Any]) -> list[str]:
    lines = [
        f"=== slurm-elastic demo summary ({summary['stop_reason']}, "
        f"{summary['duration_s']:.0f}s; times in seconds after the first submission) ===",
        "OBSERVED on the real cluster (squeue/sacct):",
        f"{'JOB':<11} {'KIND':<7} {'N':<4} {'SUBMIT':>6} {'START':>6} {'END':>6} "
        f"{'COMPLETION':>10}  STATE      SIZES OVER TIME",
    ]
    for j in summary["jobs"]:
        sizes = "  ".join(_size_step(j, e) for e in j["events"] if e["kind"] != "end")
        lines.append(
            f"{j['name']:<11} {j['kind']:<7} {'-'.join(map(str, j['nodes'])):<4} "
            f"{_num(j['submit_s']):>6} {_num(j['start_s']):>6} {_num(j['end_s']):>6} "
            f"{_num(j['completion_s']):>10}  {j['state']:<10} {sizes}"
        )
    c = summary["counts"]
    lines.append(
        f"changes made by the daemon: start-at-size {c['start_at_size']}, shrink {c['shrink']}, "
        f"grow {c['grow']} ({c['shrink'] + c['grow']} resizes); "
        f"every job completed: {'yes' if summary['all_completed'] else 'NO'}"
    )
    s = summary.get("survivors") or {}
    if s.get("pauses"):
        lines.append(
            f"resizes with --mode {summary.get('resize_mode')}: the workers that stayed paused "
            f"{s['pauses']} times, median {s['median_s']:.2f}s, max {s['max_s']:.2f}s; "
            f"restarted {s['restarted']} times (the jobs' sample logs)"
        )
    sim = summary.get("simulated") or {}
    if "static" in sim:
        lines.append("")
        lines.append(sim["label"] + ":")
        lines.append(f"{'JOB':<11} {'OBSERVED':>9} {'SIM static':>11} {'SIM mip':>9}")
        for j in summary["jobs"]:
            st = sim["static"]["jobs"].get(j["name"], {})
            mp = sim.get("mip", {}).get("jobs", {}).get(j["name"], {})
            lines.append(
                f"{j['name']:<11} {_num(j['completion_s']):>9} {_num(st.get('jct_s')):>11} "
                f"{_num(mp.get('jct_s')):>9}"
            )
        obs = summary["observed"]
        s_static, s_mip = sim["static"]["summary"], sim.get("mip", {}).get("summary", {})
        lines.append(
            f"{'average':<11} {_num(obs['avg_completion_s']):>9} "
            f"{_num(s_static.get('avg_jct_s')):>11} {_num(s_mip.get('avg_jct_s')):>9}"
        )
        lines.append(
            f"{'makespan':<11} {_num(obs['makespan_s']):>9} "
            f"{_num(s_static.get('makespan_s')):>11} {_num(s_mip.get('makespan_s')):>9}"
        )
        if sim.get("left_out"):
            lines.append(f"(left out of the simulation, nothing measured: {sim['left_out']})")
    return lines


def _size_step(job: dict[str, Any], e: dict[str, Any]) -> str:
    label = {START_AT_SIZE: " start-at-size", SHRINK: " shrink", GROW: " grow"}.get(e["kind"], "")
    return f"+{e['t_s']:.0f}s:{e['to']}{label}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}".replace("-0", "0")


# --------------------------------------------------------------------------- plot


def plot_timeline(summary: dict[str, Any], tracks: Mapping[int, JobTrack], path: Path) -> None:
    """Node allocation per job over time: one lane per job (bar height = nodes), plus the
    stacked total, with the start-at-size, shrink and grow moments marked."""
    from slurm_elastic.sim.plots import pyplot

    plt = pyplot()

    t0 = summary["started_at"]
    end = t0 + summary["duration_s"]
    jobs = summary["jobs"]
    colors = plt.get_cmap("tab10")
    fig, (lanes, stack) = plt.subplots(
        2, 1, figsize=(11, 2.2 + 1.1 * len(jobs)), sharex=True, height_ratios=[len(jobs), 2.5]
    )
    marks = {START_AT_SIZE: ("o", "start-at-size"), SHRINK: ("v", "shrink"), GROW: ("^", "grow")}
    seen: set[str] = set()
    lane = 1.3  # lane pitch: a 4-node bar (0.8) plus room for the change marks above it
    for row, job in enumerate(jobs):
        color = colors(row % 10)
        base = lane * (len(jobs) - 1 - row)
        for s, e, n in segments(tracks[job["job_id"]], end):
            height = 0.8 * n / 4
            lanes.broken_barh([(s - t0, e - s)], (base, height), color=color, alpha=0.85)
            lanes.text(s - t0 + 1, base + height / 2, str(n), va="center", fontsize=8)
        if job["submit_s"] is not None:
            lanes.plot([job["submit_s"]], [base + 0.1], "|", color="k", ms=12)
        for ev in job["events"]:
            if ev["kind"] in marks:
                shape, label = marks[ev["kind"]]
                text = f"@{ev['to']}" if ev["from"] == 0 else f"{ev['from']}->{ev['to']}"
                lanes.plot(
                    ev["t_s"],
                    base + 0.95,
                    shape,
                    color="k",
                    ms=8,
                    label=None if label in seen else label,
                )
                lanes.text(ev["t_s"] + 1.5, base + 0.95, text, va="center", fontsize=8)
                seen.add(label)
    lanes.set_ylim(-0.2, lane * len(jobs))
    lanes.set_yticks([lane * (len(jobs) - 1 - i) + 0.4 for i in range(len(jobs))])
    lanes.set_yticklabels(
        [f"{j['name']} ({j['kind']} {j['nodes'][0]}-{j['nodes'][1]})" for j in jobs]
    )
    lanes.set_title(
        "slurm-elastic demo: nodes per job over time, observed in squeue\n"
        "(bar height and number = nodes; | = submitted; marks = changes made by the daemon)",
        fontsize=10,
    )
    if seen:
        lanes.legend(loc="upper right", fontsize=8)
    _stacked(stack, summary, tracks, t0, end, colors)
    stack.set_xlabel("seconds after the first submission")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stacked(
    ax: Any,
    summary: dict[str, Any],
    tracks: Mapping[int, JobTrack],
    t0: float,
    end: float,
    colors: Any,
) -> None:
    import numpy as np

    grid = np.arange(0.0, end - t0 + 1.0, 1.0)
    layers = []
    for job in summary["jobs"]:
        lane = np.zeros_like(grid)
        for s, e, n in segments(tracks[job["job_id"]], end):
            lane[(grid >= s - t0) & (grid < e - t0)] = n
        layers.append(lane)
    ax.stackplot(
        grid,
        layers,
        colors=[colors(i % 10) for i in range(len(layers))],
        labels=[j["name"] for j in summary["jobs"]],
        step="post",
        alpha=0.85,
    )
    ax.set_ylim(0, 4.5)
    ax.set_ylabel("nodes in use")
    ax.axhline(4, color="k", lw=0.8, ls="--")
    ax.legend(loc="upper right", fontsize=7, ncol=len(layers))
