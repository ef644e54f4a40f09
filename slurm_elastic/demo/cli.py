"""The demo's command line: run, then write ``summary.json`` and ``timeline.png``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from slurm_elastic.demo.harness import DEFAULT_SLURM, SLURM_VERSIONS
from slurm_elastic.demo.workload import DEFAULT_MODE, MODES
from slurm_elastic.errors import SlurmElasticError


@click.command("demo")
@click.option("--quick", is_flag=True, help="A shorter mix (about 3 minutes): the smoke test.")
@click.option(
    "--instance",
    type=click.IntRange(0, 7),
    default=0,
    show_default=True,
    help="Local cluster instance (0 is /etc/slurm/slurm.conf).",
)
@click.option(
    "--slurm",
    type=click.Choice(SLURM_VERSIONS),
    default=DEFAULT_SLURM,
    show_default=True,
    help="Slurm version of the local cluster (22.05: the host's; 24.11, 26.05: Debian's, "
    "in a root built on first use).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
)
@click.option(
    "--time-limit",
    "time_limit_s",
    type=click.FloatRange(min=30),
    default=None,
    help="Stop after this many seconds (default 560, --quick 200).",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default=DEFAULT_MODE,
    show_default=True,
    help="How the elastic jobs resize: torchft keeps the staying nodes' workers running "
    "(stop-free), torchrun restarts them all from a checkpoint.",
)
def demo(
    quick: bool, instance: int, slurm: str, out: Path, time_limit_s: float | None, mode: str
) -> None:
    """Run the daemon and a mixed elastic workload on the local Slurm cluster.

    Ctrl-C stops it cleanly: the daemon is stopped, the demo's jobs are cancelled, and
    the cluster stays up (make cluster-down stops it).
    """
    from slurm_elastic.demo.session import Demo, DemoOptions
    from slurm_elastic.logs import configure_logging

    # The demo prints its own lines; the daemon logs to DIR/daemon.log.  Only errors of the
    # in-process Slurm reads and of the simulator's controller reach the terminal.
    configure_logging("error", json_lines=False)
    opts = DemoOptions(
        out=out, instance=instance, slurm=slurm, quick=quick, time_limit_s=time_limit_s, mode=mode
    )
    runner = Demo(opts, click.echo)
    try:
        record = runner.run()
        summary = _finish(runner, record, opts)
    except SlurmElasticError as exc:
        raise click.ClickException(str(exc)) from None
    for line in _summary_lines(summary):
        click.echo(line)
    click.echo(f"wrote {opts.out / 'summary.json'} and {opts.out / 'timeline.png'}")
    click.echo("the cluster is still up (make cluster-down stops it)")
    if record.stop_reason.startswith("interrupted"):
        sys.exit(130)
    sys.exit(0 if summary["all_completed"] else 1)


def _finish(runner: Any, record: Any, opts: Any) -> dict[str, Any]:
    from slurm_elastic.actuate.journal import Journal
    from slurm_elastic.demo import harness
    from slurm_elastic.demo.report import add_simulation, build_summary, plot_timeline
    from slurm_elastic.demo.session import history_states

    history = history_states(runner.backend, record.started_at, set(record.jobs))
    journal_path = runner.out / "state"
    actions: list[dict[str, Any]] = []
    if (journal_path / "journal.sqlite").exists():
        journal = Journal.in_state_dir(journal_path)
        try:
            for e in journal.all_actions():
                actions.append(
                    {
                        "kind": e.action.kind.value,
                        "job_id": e.action.job_id,
                        "from_nodes": e.action.from_nodes,
                        "to_nodes": e.action.to_nodes,
                        "status": e.status.value,
                        "detail": e.detail,
                        "t_s": round(e.created_at - record.started_at, 1),
                    }
                )
        finally:
            journal.close()
    summary = build_summary(
        record, runner.config, history, actions, quick=opts.quick, instance=opts.instance
    )
    if not record.stop_reason.startswith("interrupted"):
        add_simulation(summary, runner.config, harness.NODES)
    (runner.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_timeline(summary, record.tracks, runner.out / "timeline.png")
    return summary


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    from slurm_elastic.demo.report import summary_text

    return ["", *summary_text(summary)]
