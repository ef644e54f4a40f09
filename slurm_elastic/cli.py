"""The ``slurm-elastic`` command line (click).

Subcommands live next to the code they drive and are imported lazily, so that
``slurm-elastic --help`` and ``--version`` stay fast and never import torch,
scipy or the solver.  To add a command, add one line to ``_COMMANDS``:
``"name": "module.path:click_object"``.
"""

from __future__ import annotations

import importlib

import click

from slurm_elastic import __version__

_COMMANDS: dict[str, str] = {
    # "daemon": "slurm_elastic.daemon.commands:daemon",
    "run": "slurm_elastic.agent.cli:run",
    "daemon": "slurm_elastic.daemon.commands:daemon",
    "status": "slurm_elastic.daemon.commands:status",
    "plan": "slurm_elastic.daemon.commands:plan",
    "explain": "slurm_elastic.daemon.commands:explain",
    "config": "slurm_elastic.daemon.commands:config",
    "simulate": "slurm_elastic.sim.cli:simulate",
}


class _LazyGroup(click.Group):
    """A click group whose commands' modules are imported when the command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _COMMANDS:
            module_name, _, attr = _COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module_name), attr)
            if not isinstance(command, click.Command):  # pragma: no cover - wiring error
                raise TypeError(f"{_COMMANDS[cmd_name]} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurm-elastic")
def cli() -> None:
    """Elastic deep-learning training on stock Slurm.

    A head-node daemon resizes jobs marked ``--comment=elastic``; a job-side
    launcher relaunches torch workers at the new size; a simulator replays
    cluster traces through the same decision code.
    """


def main() -> None:
    cli()
