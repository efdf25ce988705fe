"""``simpipe cluster up | status | down``, ``simpipe sbatch`` and what ``run --cluster`` needs.

The work is in ``simpipe.cluster``; this module turns its errors into one-line CLI errors.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from simpipe.config import Config, ConfigError, load_config

EXIT_USAGE = 2

_set = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                    help="Override a config key, e.g. --set cluster.jobs=2 (repeatable).")


def _fail(message: str) -> None:
    for line in message.splitlines():
        click.echo(f"error: {line}", err=True)
    sys.exit(EXIT_USAGE)


def _load(config_path: str, overrides: list[str] | tuple[str, ...]) -> Config:
    try:
        return load_config(config_path, list(overrides))
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable; for type checkers


def _cluster_errors() -> tuple[type[Exception], ...]:
    from simpipe.cluster.connect import ClusterError  # noqa: PLC0415
    from simpipe.cluster.servers import ServerError  # noqa: PLC0415
    from simpipe.cluster.slurm import SlurmError  # noqa: PLC0415
    from simpipe.cluster.state import StateError  # noqa: PLC0415

    return (ClusterError, ServerError, SlurmError, StateError)


def _loader(config_path: str, overrides: tuple[str, ...], emulate: bool,
            place: bool = True) -> Callable[..., Config]:
    """``load(extra_overrides)``: the config, with ``--emulate``'s changes when asked (their
    notes printed once)."""
    site = None
    told = False

    def load(extra: list[str] | tuple[str, ...] = ()) -> Config:
        nonlocal site, told
        config = _load(config_path, [*overrides, *extra])
        if not emulate:
            return config
        from simpipe.cluster.emulate import EmulateError, Site, emulate_config, probe_site  # noqa: PLC0415

        if site is None:
            site = probe_site() if place else Site(None)
        try:
            config, notes = emulate_config(config, site, place)
        except (EmulateError, ConfigError) as exc:
            _fail(str(exc))
        if not told:
            for note in notes:
                click.echo(note)
            told = True
        return config

    return load


@contextmanager
def prepared_run_config(config_path: str, overrides: tuple[str, ...],
                        cluster_name: str | None, emulate: bool = False) -> Iterator[Config]:
    """The config a ``simpipe run`` uses.

    ``--cluster NAME``: the persistent cluster's scheduler (``cluster.kind = "address"``) and
    its healthy servers as ``agents.<backend>.endpoints``. Without it, a ``slurm`` cluster
    with ``[cluster.servers]`` gets servers for this run only, cancelled when it ends; emulated
    servers without SLURM run as local processes. ``emulate``: see ``simpipe.cluster.emulate``.
    """
    load = _loader(config_path, overrides, emulate, place=not cluster_name)
    config = load()
    errors = _cluster_errors()
    if cluster_name:
        from simpipe.cluster.lifecycle import servers_config  # noqa: PLC0415
        from simpipe.cluster.state import StateError, read_state, run_overrides  # noqa: PLC0415

        try:
            state = read_state(cluster_name)
            if servers_config(cluster_name).kind == "emulated" and not emulate:
                raise StateError(f"cluster {cluster_name!r} serves emulated GPUs: add --emulate "
                                 "(its results then go to <run.name>-emulated)")
            extra = run_overrides(state, config.agents.backend)
        except errors as exc:
            _fail(str(exc))
        yield load(extra)
        return
    servers_cfg = config.cluster.servers
    if servers_cfg.kind == "emulated" and config.cluster.kind != "slurm":
        from simpipe.cluster.emulate import local_emulators  # noqa: PLC0415

        backend = servers_cfg.endpoint_backend
        try:
            emulators = local_emulators(servers_cfg)
            urls = emulators.__enter__()
        except (RuntimeError, OSError) as exc:
            _fail(f"emulated servers did not start: {exc}")
        try:
            click.echo(f"emulated servers ready: {len(urls)} on this machine")
            yield load([f"agents.{backend}.endpoints={json.dumps(urls)}"])
        finally:
            emulators.__exit__(None, None, None)
        return
    if config.cluster.kind != "slurm" or servers_cfg.kind == "none":
        yield config
        return
    from simpipe.cluster import servers as srv  # noqa: PLC0415
    from simpipe.cluster import slurm  # noqa: PLC0415

    backend = servers_cfg.endpoint_backend or config.agents.backend
    if config.agents.backend != backend:
        _fail(f'cluster.servers.kind = "{servers_cfg.kind}" serves agents.backend = '
              f'"{backend}", but the config has agents.backend = "{config.agents.backend}"')
    launched: list = []
    try:
        slurm.require_controller()
        name = f"run-{config.run.name}-{os.getpid()}"
        launched = srv.launch(config.cluster, name, config.cluster.log_directory)
        jobs = len({s.job_id for s in launched})
        click.echo(f"servers: {len(launched)} in {jobs} SLURM job(s) submitted, waiting for "
                   "health")
        srv.wait_healthy(launched, servers_cfg, log_dir=config.cluster.log_directory)
        urls = [s.url for s in launched]
        click.echo(f"servers healthy: {_url_summary(urls)}")
        yield load([f"agents.{backend}.endpoints={json.dumps(urls)}"])
    except errors as exc:
        _fail(str(exc))
    finally:
        slurm.cancel([s.job_id for s in launched])


def _url_summary(urls: list[str], show: int = 4) -> str:
    """Up to ``show`` URLs and how many more: 32 servers do not fit on a line."""
    more = f" and {len(urls) - show} more" if len(urls) > show else ""
    return ", ".join(urls[:show]) + more


# --- simpipe cluster ------------------------------------------------------------------------


@click.group("cluster")
def cluster_group() -> None:
    """A persistent SLURM cluster (workers + inference servers) shared by many runs."""


@cluster_group.command("up")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--name", default=None, help="Cluster name (default: the config file's stem).")
@click.option("--emulate", is_flag=True,
              help="Emulated GPU servers instead of the configured ones (a dry run).")
@_set
def cluster_up(config_path: str, name: str | None, emulate: bool,
               overrides: tuple[str, ...]) -> None:
    """Start the scheduler, SLURM worker jobs and server jobs of CONFIG's [cluster]."""
    import time  # noqa: PLC0415

    from simpipe.cluster import lifecycle  # noqa: PLC0415

    config = _loader(config_path, overrides, emulate)()
    name = name or Path(config_path).stem
    started = time.perf_counter()
    try:
        state = lifecycle.up(config.cluster, name,
                             on_progress=lambda phase: click.echo(f"cluster {name}: {phase}"))
    except _cluster_errors() as exc:
        _fail(str(exc))
    click.echo(f"cluster {name} up in {time.perf_counter() - started:.1f} s: scheduler "
               f"{state['scheduler']}, worker jobs {', '.join(state.get('worker_jobs', [])) or '-'}")
    for s in state.get("servers", []):
        click.echo(f"  server {s['index']}: {s['url']} (job {s['job_id']})")
    click.echo(f"use it: simpipe run CONFIG --cluster {name};  stop it: simpipe cluster down {name}")


@cluster_group.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def cluster_status(name: str, as_json: bool) -> None:
    """Workers, servers and SLURM jobs of cluster NAME."""
    from simpipe.cluster import lifecycle  # noqa: PLC0415

    try:
        report = lifecycle.status(name)
    except _cluster_errors() as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"cluster {name}: {report['state']}  scheduler {report['scheduler']}  manager "
               f"{'alive' if report['manager_alive'] else 'NOT RUNNING'}")
    click.echo(f"workers ({len(report['workers'])}):")
    for w in report["workers"]:
        mem = f"{(w['memory'] or 0) / 2**20:.0f} / {(w['memory_limit'] or 0) / 2**20:.0f} MiB"
        click.echo(f"  {w['address']}  host {w['host']}  memory {mem}  tasks {w['tasks']}")
    click.echo(f"servers ({len(report['servers'])}):")
    for s in report["servers"]:
        served = "-" if s["requests"] is None else s["requests"]
        click.echo(f"  {s['index']}: {s['url']}  job {s['job_id']}  health {s['health']}  "
                   f"requests {served}")
    click.echo(f"SLURM jobs ({len(report['jobs'])}):")
    for j in report["jobs"]:
        click.echo(f"  {j['job_id']}  {j['name']}  {j['state']}  time left {j['time_left']}  "
                   f"nodes {j['nodes'] or '-'}")


@cluster_group.command("down")
@click.argument("name")
def cluster_down(name: str) -> None:
    """Cancel every job of cluster NAME, stop its manager, remove its state."""
    from simpipe.cluster import lifecycle  # noqa: PLC0415

    try:
        cancelled = lifecycle.down(name)
    except _cluster_errors() as exc:
        _fail(str(exc))
    click.echo(f"cluster {name} down; cancelled {len(cancelled)} job(s)"
               + (f": {', '.join(cancelled)}" if cancelled else ""))


# --- simpipe sbatch -------------------------------------------------------------------------


@click.command("sbatch")
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@click.option("--nodes", default=1, show_default=True, help="Nodes in the allocation.")
@click.option("--gpus-per-node", default=0, show_default=True,
              help="GPUs per node (--gres=gpu:G); one server per servers.gpus_per_server.")
@click.option("--workers-per-node", default=1, show_default=True,
              help="Dask worker processes per node.")
@click.option("--time", "walltime", default=None, help="Job time limit (default cluster.walltime).")
@click.option("--mem", default=None, help="Memory per node (default from cluster.memory).")
@click.option("--overcommit", is_flag=True,
              help="Allow more tasks than CPUs (scheduler and client are light; small nodes).")
@click.option("--job-log", default=None, help="The job's stdout file (default slurm-%j.out).")
@click.option("--output", "-o", "output", default=None,
              help="Where to write the script (default <run name>.sbatch; '-' for stdout).")
@_set
def sbatch_command(config_path: str, nodes: int, gpus_per_node: int, workers_per_node: int,
                   walltime: str | None, mem: str | None, overcommit: bool, job_log: str | None,
                   output: str | None, overrides: tuple[str, ...]) -> None:
    """Write a batch script that runs CONFIG inside one SLURM allocation."""
    from simpipe.cluster.batch import BatchOptions, batch_script  # noqa: PLC0415

    config = _load(config_path, overrides)
    opts = BatchOptions(str(Path(config_path).resolve()), overrides, nodes, gpus_per_node,
                        workers_per_node, f"simpipe-{config.run.name}", job_log, walltime, mem,
                        overcommit=overcommit)
    try:
        text = batch_script(config.cluster, opts)
    except (ValueError, *_cluster_errors()) as exc:
        _fail(str(exc))
    if output == "-":
        click.echo(text, nl=False)
        return
    path = Path(output or f"{config.run.name}.sbatch")
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    click.echo(f"wrote {path}; submit it with: sbatch {path}  (results: {config.run_dir})")


@click.command("batch-task", hidden=True)
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@_set
def batch_task(config_path: str, overrides: tuple[str, ...]) -> None:
    """One srun task of a `simpipe sbatch` job (scheduler, client or worker by rank)."""
    from dask_jobqueue.slurm import SLURMRunner  # noqa: PLC0415
    from distributed import Client  # noqa: PLC0415

    from simpipe.cluster.batch import batch_endpoints  # noqa: PLC0415
    from simpipe.cluster.servers import wait_urls_healthy  # noqa: PLC0415
    from simpipe.runner import run_simulation  # noqa: PLC0415

    config = _load(config_path, overrides)
    cluster = config.cluster
    scheduler_file = (Path(config.run.output_dir).resolve() / ".simpipe-batch"
                      / "scheduler-{job_id}.json")
    scheduler_file.parent.mkdir(parents=True, exist_ok=True)
    scheduler_options = {"dashboard_address": cluster.dashboard_address or ":0",
                         **({"interface": cluster.interface} if cluster.interface else {}),
                         **cluster.scheduler_options}
    worker_options = {"nthreads": max(1, cluster.cores // cluster.processes),
                      "memory_limit": cluster.memory_limit if cluster.memory_limit != "auto"
                      else "auto"}
    if cluster.interface:
        worker_options["interface"] = cluster.interface
    if cluster.local_directory:
        worker_options["local_directory"] = os.path.expandvars(cluster.local_directory)
    # Scheduler and worker ranks block inside SLURMRunner and exit there; only the client
    # rank (1) gets past this line.
    with SLURMRunner(scheduler_file=str(scheduler_file), scheduler_options=scheduler_options,
                     worker_options=worker_options) as runner, Client(runner) as client:
        client.wait_for_workers(runner.n_workers, timeout=cluster.start_timeout_s)
        urls = batch_endpoints(cluster)
        extra: list[str] = []
        if urls:
            backend = cluster.servers.endpoint_backend or config.agents.backend
            click.echo(f"waiting for {len(urls)} server(s): {', '.join(urls)}")
            wait_urls_healthy(urls, cluster.servers)
            extra = [f"agents.{backend}.endpoints={json.dumps(urls)}"]
        config = _load(config_path, [*overrides, *extra])
        result = run_simulation(config, client=client)
        click.echo(f"results: {result.run_dir}  ({result.wall_s:.1f} s)")
    scheduler_file.with_name(scheduler_file.name.format(
        job_id=os.environ.get("SLURM_JOB_ID", ""))).unlink(missing_ok=True)


def register(main: click.Group) -> None:
    """Add this module's commands to the ``simpipe`` group."""
    main.add_command(cluster_group)
    main.add_command(sbatch_command)
    main.add_command(batch_task)
