"""``simpipe ui``: serve the manager page (the server is imported when it starts, so that
``simpipe --help`` stays light)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from simpipe.core.errors import SimpipeError


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              # spelled out: simpipe.ui.security (TOKEN_ENV) imports aiohttp, too heavy here
              help="Address to listen on; anything but loopback needs $SIMPIPE_UI_TOKEN.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--results", "results", default="results", show_default=True,
              type=click.Path(file_okay=False), help="The results root (run.output_dir).")
def ui_command(host: str, port: int, results: str) -> None:
    """Watch runs and clusters live in the browser; cancel, bring down, clean up."""
    from aiohttp import web  # keep `simpipe --help` light

    from simpipe.ui.app import make_app
    from simpipe.ui.security import TOKEN_ENV, is_loopback

    token = os.environ.get(TOKEN_ENV) or None
    loopback = is_loopback(host)
    if not loopback and not token:
        raise SimpipeError(f"--host {host} is reachable from other machines: set {TOKEN_ENV} "
                           "to a long random secret (every request must carry it), or keep "
                           "the default --host 127.0.0.1")
    root = Path(results)
    if not root.is_dir():
        click.echo(f"note: {root} does not exist yet; runs appear here once started", err=True)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    click.echo(f"simpipe ui: {url}" + (f"?token=<{TOKEN_ENV}>" if token else "")
               + f"  (results: {root.resolve()}; Ctrl-C stops)")
    web.run_app(make_app(root, token=token, loopback_only=loopback), host=host, port=port,
                print=None, shutdown_timeout=5.0)
