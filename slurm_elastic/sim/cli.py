"""``slurm-elastic simulate``: replay a trace (or the site's sacct history) per policy."""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.policy.registry import POLICIES

if TYPE_CHECKING:  # the heavy modules load only when the command runs
    from rich.console import Console

    from slurm_elastic.sim.engine import PartitionSpec
    from slurm_elastic.sim.runner import Outcome
    from slurm_elastic.sim.study import Study
    from slurm_elastic.sim.traces import Trace
    from slurm_elastic.sim.workload import Workload


def _when(text: str) -> float:
    """Epoch seconds from epoch digits or an ISO date/time (UTC when no zone is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither epoch seconds nor an ISO date") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def _quiet_logs() -> None:
    # Thousands of control cycles would print thousands of cycle.done (and per-cycle
    # fallback) lines; the simulator logs errors only and counts fallbacks in runs.json.
    from slurm_elastic.logs import configure_logging

    configure_logging("error")


@click.command("simulate")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--from-sacct",
    nargs=2,
    metavar="START END",
    help="Replay this cluster's accounting between START and END (epoch or ISO).",
)
@click.option("--policies", default=",".join(POLICIES), show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), help="Simulated nodes (default: per trace).")
@click.option(
    "--partitions",
    metavar="NAME:NODES,...",
    help="Named partitions instead of --nodes; trace jobs naming another go to the first.",
)
@click.option(
    "--cluster",
    "cluster_text",
    metavar="TYPE:NODES[xGPUS],...",
    help="GPU types instead of --nodes/--partitions, e.g. t4:16x4,a100:8x8: a partition per "
    "type, of NODES×GPUS/--gpus-per-node nodes; trace jobs naming none of them are "
    "submitted to all of them, in this order.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs per simulated node: the allocation unit, in every partition.",
)
@click.option("--elastic-fraction", type=click.FloatRange(0, 1), default=1.0, show_default=True)
@click.option(
    "--min-fraction",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.5,
    show_default=True,
    help="Elastic min = ceil(requested × this).",
)
@click.option(
    "--max-multiple",
    type=click.FloatRange(min=1),
    default=2.0,
    show_default=True,
    help="Elastic max = floor(requested × this).",
)
@click.option(
    "--restart-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds a resize stops a job [default: the resize mode's measured figure: "
    "15 for torchrun, the survivors' pause for torchft].",
)
@click.option(
    "--resize-mode",
    type=click.Choice(["torchrun", "torchft"]),
    default="torchrun",
    show_default=True,
    help="How elastic jobs resize: torchrun restarts from a checkpoint, torchft is stop-free.",
)
@click.option(
    "--budget",
    type=click.Choice(["declared", "converge", "mix"]),
    default="mix",
    show_default=True,
    help="Jobs declare their step budget (declared), train until converged and the daemon "
    "only predicts when (converge), or half each (mix).",
)
@click.option(
    "--placement",
    type=click.Choice(["slurm", "plan"]),
    default="slurm",
    show_default=True,
    help="The daemon's policy.placement: where a job of several partitions starts.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N jobs of the trace.")
@click.option(
    "--interval-s",
    type=click.FloatRange(min=1),
    help="Control-cycle grid in sim time [default: 60].",
)
@click.option(
    "--refresh-s",
    type=click.FloatRange(min=1),
    help="Run an idle controller at least this often while elastic jobs run [default: 1800].",
)
@click.option(
    "--report-every-s",
    type=click.FloatRange(min=1),
    help="How often a simulated job reports progress [default: 1800].",
)
@click.option(
    "--profiles",
    "profiles_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder with elasticflow_throughputs/ and pollux/ (and gavel/, for the speeds of "
    "--cluster types; default: found above the trace, or ../shared/traces).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sim-out"),
    show_default=True,
)
def simulate(**options: Any) -> None:
    """Replay a cluster trace through the daemon's own decision code, per policy.

    Prints one column per policy (jobs finished, JCT avg/p50/p95/p99, queueing, makespan,
    GPU utilisation, resizes, GPU-hours) and writes DIR/results.json and PNG plots.
    """
    try:
        _run(**options)
    except SlurmElasticError as exc:
        raise click.ClickException(str(exc)) from None


def _run(
    trace_path: Path | None,
    from_sacct: tuple[str, str] | None,
    policies: str,
    nodes: int | None,
    partitions: str | None,
    cluster_text: str | None,
    gpus_per_node: int,
    elastic_fraction: float,
    min_fraction: float,
    max_multiple: float,
    restart_s: float | None,
    resize_mode: str,
    budget: str,
    placement: str,
    seed: int,
    limit: int | None,
    interval_s: float | None,
    refresh_s: float | None,
    report_every_s: float | None,
    profiles_dir: Path | None,
    out_dir: Path,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from slurm_elastic.errors import ConfigError
    from slurm_elastic.sim import study, traces
    from slurm_elastic.sim.plots import write_plots
    from slurm_elastic.sim.runner import SimSettings
    from slurm_elastic.sim.workload import WorkloadConfig

    if (trace_path is None) == (from_sacct is None):
        raise ConfigError("give exactly one of --trace FILE or --from-sacct START END")
    names = study.parse_policies(policies)
    typed = _typed_cluster(cluster_text, nodes, partitions, gpus_per_node)
    _quiet_logs()
    if trace_path is not None:
        trace = traces.read_trace(trace_path, limit=limit)
        source = str(trace_path)
        start_dir = trace_path.resolve().parent
    else:
        assert from_sacct is not None
        trace, source = _sacct_trace(from_sacct, gpus_per_node, limit)
        start_dir = Path.cwd()
    traces_dir = profiles_dir or _find_profiles(start_dir)
    cfg = WorkloadConfig(
        gpus_per_node=gpus_per_node,
        elastic_fraction=elastic_fraction,
        min_fraction=min_fraction,
        max_multiple=max_multiple,
        restart_s=restart_s,
        seed=seed,
        resize_mode=resize_mode,
        budget=budget,
    )
    parts = typed or (study.parse_partitions(partitions) if partitions else ())
    if parts:
        nodes = sum(p.nodes for p in parts)
    elif nodes is None:
        nodes = study.default_nodes(trace, cfg, traces_dir)
    unset = SimSettings()  # a cadence not given keeps the simulator's default
    settings = SimSettings(
        interval_s=unset.interval_s if interval_s is None else interval_s,
        refresh_s=unset.refresh_s if refresh_s is None else refresh_s,
        report_every_s=unset.report_every_s if report_every_s is None else report_every_s,
        placement=placement,
    )
    st = study.Study(
        trace=trace,
        trace_path=source,
        traces_dir=traces_dir,
        workload_cfg=cfg,
        settings=settings,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        partitions=parts,
    )
    workload = st.workload()
    console = Console(stderr=True)
    outcomes = {}
    for policy in names:
        outcomes[policy] = _run_one(st, policy, workload, console)
    doc = study.results_document(st, workload, outcomes)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    stats = study.run_stats(outcomes)
    (out_dir / "runs.json").write_text(json.dumps(stats, indent=2) + "\n")
    write_plots(outcomes, out_dir, title=trace.name)

    where = f"{nodes} nodes × {gpus_per_node} GPU"
    if typed:
        where = f"{cluster_text} ({where})"
    table = Table(title=f"{trace.name}: {len(workload.jobs)} jobs on {where}")
    table.add_column("metric")
    for p in names:
        table.add_column(p, justify="right")
    for row in study.table_rows(doc, names):
        table.add_row(*row)
    table.add_row("wall_s", *(f"{stats[p]['wall_s']:.1f}" for p in names))
    table.add_row("ms_per_cycle", *(f"{stats[p]['cycle_ms']:.1f}" for p in names))
    Console(width=max(100, 16 * (len(names) + 1))).print(table)
    declared = sum(job.declares_budget for job in workload.jobs)
    click.echo(
        f"budget {budget}: {declared} jobs declare their step budget, "
        f"{len(workload.jobs) - declared} train until converged (the daemon predicts when)"
    )
    if workload.rejected:
        click.echo(f"{len(workload.rejected)} jobs larger than the cluster were not simulated")
    click.echo(f"wrote {out_dir / 'results.json'} and plots in {out_dir}")


def _typed_cluster(
    text: str | None, nodes: int | None, partitions: str | None, unit: int
) -> tuple[PartitionSpec, ...]:
    """The partitions of ``--cluster`` (none without it), refused beside the other ways of
    sizing the cluster."""
    from slurm_elastic.errors import ConfigError
    from slurm_elastic.sim import study
    from slurm_elastic.sim.gputypes import parse_cluster

    if text is None:
        return ()
    if nodes is not None or partitions:
        raise ConfigError("--cluster sizes the cluster: give it without --nodes or --partitions")
    return study.typed_partitions(parse_cluster(text), unit)


def _run_one(st: Study, policy: str, workload: Workload, console: Console) -> Outcome:
    from slurm_elastic.sim.study import run_policy

    if not sys.stderr.isatty():
        return run_policy(st, policy, workload)
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"{policy}", total=len(workload.jobs))
        return run_policy(
            st, policy, workload, progress=lambda done, total: bar.update(task, completed=done)
        )


def _find_profiles(start: Path) -> Path:
    from slurm_elastic.errors import ConfigError
    from slurm_elastic.sim.profiles import find_traces_dir

    try:
        return find_traces_dir(start)
    except ConfigError:
        return find_traces_dir(Path.cwd().parent / "shared")


def _sacct_trace(
    window: tuple[str, str], gpus_per_node: int, limit: int | None
) -> tuple[Trace, str]:
    from slurm_elastic.errors import ConfigError
    from slurm_elastic.sim.traces import from_history
    from slurm_elastic.slurm.select import make_backend

    since, until = _when(window[0]), _when(window[1])
    if until <= since:
        raise ConfigError(f"--from-sacct: END {window[1]} is not after START {window[0]}")
    backend = make_backend("cli", dry_run=True)
    history = backend.read_history(since, until)
    trace = from_history(history, gpus_per_node=gpus_per_node, name="sacct")
    if limit is not None:
        trace = replace(trace, jobs=trace.jobs[:limit])
    return trace, f"sacct {window[0]} .. {window[1]}"
