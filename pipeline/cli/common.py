"""What every ``simpipe`` command shares: errors as one-line messages with their exit
status, the ``--set`` option, and config loading with it.

A command raises ``simpipe.core.errors.SimpipeError`` (or a subclass) for anything the user can
fix; ``SimpipeGroup`` catches it once for every command and prints it, never a traceback.
Light on purpose (click only): ``simpipe --help`` imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from simpipe.core.errors import SimpipeError

if TYPE_CHECKING:
    from simpipe.config.model import Config


class SimpipeGroup(click.Group):
    """The ``simpipe`` group: a SimpipeError from any of its commands (and their subgroups)
    becomes its message on stderr, one line per line, and its ``exit_code``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SimpipeError as exc:
            for line in exc.cli_lines():
                click.echo(line, err=True)
            ctx.exit(exc.exit_code)


set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a config key, e.g. --set game.rounds=5 (repeatable).",
)


def load(config_path: str, overrides: tuple[str, ...] | list[str]) -> Config:
    """CONFIG with its ``--set`` overrides applied; ConfigError (exit 2) naming the problem."""
    from simpipe.config.model import load_config  # pydantic: not for --help

    return load_config(config_path, list(overrides))
