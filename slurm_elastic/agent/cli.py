"""``slurm-elastic run``: the click front end of ``agent.launcher`` (no torch import)."""

from __future__ import annotations

import sys

import click

from slurm_elastic.agent.modes import DEFAULT_FT_TIMEOUT_S, TORCHFT, FtTimeouts
from slurm_elastic.errors import SlurmElasticError


@click.command(
    "run",
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--min-nodes", type=click.IntRange(min=1), default=None, help="Overrides the marker.")
@click.option("--max-nodes", type=click.IntRange(min=1), default=None, help="Overrides the marker.")
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="torch elastic restarts per node agent (every shrink costs one).",
)
@click.option(
    "--join",
    "join",
    type=click.IntRange(min=1),
    default=None,
    metavar="PARENT",
    help="Companion mode: join the rendezvous of job PARENT (run in its working directory).",
)
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.1), default=1.0, show_default=True)
@click.option(
    "--rdzv-conf",
    "rdzv_conf",
    default="",
    metavar="K=V,...",
    help="Extra torch rendezvous settings (e.g. last_call_timeout=3); is_host is set per node.",
)
@click.option(
    "--stop-signal",
    default="USR1",
    show_default=True,
    help="Signal for a script without the library when the job shrinks (the signal contract).",
)
@click.option(
    "--stop-grace",
    "stop_grace_s",
    type=click.FloatRange(min=0.0),
    default=30.0,
    show_default=True,
    help="Seconds a script has to exit on --stop-signal before it is killed.",
)
@click.option(
    "--mode",
    type=click.Choice(["torchrun", "torchft"]),
    default="torchrun",
    show_default=True,
    help="torchrun: every resize restarts the workers from a checkpoint; torchft: stop-free "
    "(one replica group per node; the groups that stay keep running; needs the library).",
)
@click.option(
    "--ft-timeout",
    "ft_timeout_s",
    type=click.FloatRange(min=0.5, max=3600.0),
    default=DEFAULT_FT_TIMEOUT_S,
    show_default=True,
    help="torchft mode: seconds a collective may wait for a group that vanished unannounced; "
    "torchft's other timeouts follow from it (docs/user-guide.md), and a value that breaks "
    "their hierarchy is refused.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    nproc_per_node: int,
    min_nodes: int | None,
    max_nodes: int | None,
    max_restarts: int,
    join: int | None,
    poll_s: float,
    rdzv_conf: str,
    stop_signal: str,
    stop_grace_s: float,
    mode: str,
    ft_timeout_s: float,
    command: tuple[str, ...],
) -> None:
    """Run elastic torch training in this Slurm job: slurm-elastic run -- python train.py ...

    Inside a batch script it starts torchrun on every node (c10d rendezvous on the batch
    host) and follows the daemon's resize instructions; with --join PARENT (what a
    companion job runs) it adds this job's nodes to the parent's training.
    """
    from slurm_elastic.agent.launcher import RunOptions
    from slurm_elastic.agent.launcher import run as launch
    from slurm_elastic.agent.rendezvous import parse_conf
    from slurm_elastic.agent.stopping import signal_number
    from slurm_elastic.logs import configure_logging

    if join is not None and command:
        raise click.UsageError("--join takes the command from the parent's launch.json")
    if join is not None and mode != "torchrun":
        raise click.UsageError("--join takes the mode from the parent's launch.json")
    try:
        extra_conf = parse_conf(rdzv_conf)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rdzv-conf") from None
    try:
        signal_number(stop_signal)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--stop-signal") from None
    configure_logging()
    options = RunOptions(
        argv=command,
        nproc_per_node=nproc_per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        max_restarts=max_restarts,
        poll_s=poll_s,
        join=join,
        rdzv_conf=tuple(extra_conf.items()),
        stop_signal=stop_signal,
        stop_grace_s=stop_grace_s,
        mode=mode,
        ft_timeout_s=ft_timeout_s,
    )
    try:
        if mode == TORCHFT and join is None:
            FtTimeouts.derive(ft_timeout_s)  # refused here, before anything starts
        code = launch(options)
    except SlurmElasticError as exc:
        click.echo(f"slurm-elastic run: {exc}", err=True)
        sys.exit(2)
    sys.exit(code)
