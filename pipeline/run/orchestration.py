"""What a run needs around its round loop: the config as it will run, and the inference
servers it uses, up for as long as the run lasts.

``run_simulation`` goes through ``run_config``, so the Python API and ``simpipe run`` do the
same thing:

- ``emulate`` (``--emulate``): a dry run, the configured servers replaced by emulated GPU
  servers (``simpipe.run.emulate``), results in ``<run.name>-emulated``;
- ``cluster_name`` (``--cluster NAME``): a persistent cluster from ``simpipe cluster up``,
  its scheduler and its healthy servers; this run starts nothing;
- otherwise ``[cluster.servers]`` are started for this run only: SLURM jobs on a ``slurm``
  cluster (health-checked, their URLs put into ``agents.<backend>.endpoints``, cancelled
  when the run ends, whatever happened), and emulated servers elsewhere as local processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.servers import ServerError
from simpipe.cluster.state import StateError, read_section, read_state, run_target
from simpipe.config import Config, ConfigError, config_from_dict
from simpipe.run.console import Console
from simpipe.run.emulate import Site, emulate_config, local_emulators, probe_site


@contextmanager
def run_config(config: Config, *, emulate: bool = False, cluster_name: str | None = None,
               console: Console | None = None) -> Iterator[Config]:
    """The config a run uses, its servers running until the context ends."""
    console = console or Console()
    if emulate:
        config = emulated(config, place=cluster_name is None, console=console)
    if cluster_name:
        yield on_cluster(config, cluster_name, emulate=emulate)
        return
    with servers_for_run(config, console) as ready:
        yield ready


def emulated(config: Config, *, place: bool = True, console: Console | None = None) -> Config:
    """``--emulate``'s dry-run config (``simpipe.run.emulate.emulate_config``), its notes
    said one line each. ``place``: also decide where workers and emulators run (asks SLURM);
    not for a persistent cluster, which already runs."""
    config, notes = emulate_config(config, probe_site() if place else Site(None), place)
    for note in notes:
        (console or Console()).line(note)
    return config


def on_cluster(config: Config, name: str, *, emulate: bool = False) -> Config:
    """``config`` pointed at persistent cluster ``name``: ``cluster.kind = "address"`` with its
    scheduler, and its healthy servers as ``agents.<backend>.endpoints``. The rest of
    ``[cluster]`` described that cluster when it was started; only emulated servers stay
    (the estimate of the real run is made from them)."""
    state = read_state(name)
    if read_section(name).servers.kind == "emulated" and not emulate:
        raise StateError(f"cluster {name!r} serves emulated GPUs: add --emulate "
                         "(its results then go to <run.name>-emulated)")
    scheduler, endpoints = run_target(state, config.agents.backend)
    raw = config.model_dump(mode="json")
    servers = raw["cluster"]["servers"] if config.cluster.servers.kind == "emulated" else {}
    raw["cluster"] = {"kind": "address", "address": scheduler, "servers": servers}
    if endpoints:
        raw["agents"][config.agents.backend]["endpoints"] = endpoints
    return config_from_dict(raw, f"--cluster {name}")


@contextmanager
def servers_for_run(config: Config, console: Console | None = None) -> Iterator[Config]:
    """``[cluster.servers]`` started for this run only (none configured: ``config`` as it is),
    stopped when the context ends; the config with their endpoints."""
    console = console or Console()
    servers = config.cluster.servers
    if servers.kind == "none":
        yield config
        return
    backend = servers.endpoint_backend or config.agents.backend
    if config.agents.backend != backend:
        raise ConfigError(f'cluster.servers.kind = "{servers.kind}" serves agents.backend = '
                          f'"{backend}", but the config has agents.backend = '
                          f'"{config.agents.backend}"')
    if type(config.cluster).server_jobs:
        with _server_jobs(config, console) as urls:
            yield with_endpoints(config, backend, urls)
    else:  # the config allows only emulated servers here: local processes
        with _local_emulators(config, console) as urls:
            yield with_endpoints(config, backend, urls)


def with_endpoints(config: Config, backend: str, urls: list[str]) -> Config:
    """``config`` with ``agents.<backend>.endpoints = urls`` (validated like the rest)."""
    raw = config.model_dump(mode="json")
    raw["agents"][backend]["endpoints"] = list(urls)
    return config_from_dict(raw, "servers")


@contextmanager
def _server_jobs(config: Config, console: Console) -> Iterator[list[str]]:
    """One SLURM job per server (or per emulator process), healthy; cancelled on exit."""
    cluster = config.cluster
    slurm.require_controller()
    launched: list[srv.Server] = []
    try:
        launched = srv.launch(cluster, f"run-{config.run.name}-{os.getpid()}",
                              cluster.log_directory)
        console.line(f"servers: {len(launched)} in {len({s.job_id for s in launched})} SLURM "
                     "job(s) submitted, waiting for health")
        srv.wait_healthy(launched, cluster.servers, log_dir=cluster.log_directory)
        urls = [s.url for s in launched]
        console.line(f"servers healthy: {url_summary(urls)}")
        yield urls
    finally:
        slurm.cancel([s.job_id for s in launched])


@contextmanager
def _local_emulators(config: Config, console: Console) -> Iterator[list[str]]:
    """Emulated servers as processes on this machine; stopped on exit."""
    with ExitStack() as stack:
        try:
            urls = stack.enter_context(local_emulators(config.cluster.servers))
        except (RuntimeError, OSError) as exc:
            raise ServerError(f"emulated servers did not start: {exc}") from None
        console.line(f"emulated servers ready: {len(urls)} on this machine")
        yield urls


def url_summary(urls: list[str], show: int = 4) -> str:
    """Up to ``show`` URLs and how many more: 32 servers do not fit on a line."""
    more = f" and {len(urls) - show} more" if len(urls) > show else ""
    return ", ".join(urls[:show]) + more

