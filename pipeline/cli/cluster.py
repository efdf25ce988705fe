"""``simpipe cluster up | status | down``, ``simpipe sbatch`` and its hidden ``batch-task``.

The work is in library functions (``simpipe.run.lifecycle``, ``simpipe.cluster.batch``,
``simpipe.run.batch_task``) that return data; this module parses options and prints. Their
errors are SimpipeErrors, which the ``simpipe`` group prints as one-line messages. Each command
imports what it runs inside its own function (``simpipe --help`` stays light).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from simpipe.cli.common import load, set_option

# --- simpipe cluster ------------------------------------------------------------------------


@click.group("cluster")
def cluster_group() -> None:
    """A persistent SLURM cluster (workers + inference servers) shared by many runs."""


@cluster_group.command("up")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--name", default=None, help="Cluster name (default: the config file's stem).")
@click.option("--emulate", is_flag=True,
              help="Emulated GPU servers instead of the configured ones (a dry run).")
@set_option
def cluster_up(config_path: str, name: str | None, emulate: bool,
               overrides: tuple[str, ...]) -> None:
    """Start the scheduler, SLURM worker jobs and server jobs of CONFIG's [cluster]."""
    from simpipe.run import lifecycle

    name = name or Path(config_path).stem
    up = lifecycle.up(load(config_path, overrides), name, emulate=emulate,
                      on_progress=lambda phase: click.echo(f"cluster {name}: {phase}"))
    for note in up.notes:
        click.echo(note)
    click.echo(f"cluster {name} up in {up.elapsed_s:.1f} s: scheduler {up.scheduler}, "
               f"worker jobs {', '.join(up.worker_jobs) or '-'}")
    for s in up.servers:
        click.echo(f"  server {s.index}: {s.url} (job {s.job_id})")
    click.echo(f"use it: simpipe run CONFIG --cluster {name};  "
               f"stop it: simpipe cluster down {name}")


@cluster_group.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def cluster_status(name: str, as_json: bool) -> None:
    """Workers, servers and SLURM jobs of cluster NAME."""
    from simpipe.run import lifecycle

    report = lifecycle.status(name)
    if as_json:
        click.echo(json.dumps(asdict(report), indent=2))
        return
    click.echo(f"cluster {name}: {report.state}  scheduler {report.scheduler}  manager "
               f"{'alive' if report.manager_alive else 'NOT RUNNING'}")
    click.echo(f"workers ({len(report.workers)}):")
    for w in report.workers:
        mem = f"{(w.memory or 0) / 2**20:.0f} / {(w.memory_limit or 0) / 2**20:.0f} MiB"
        click.echo(f"  {w.address}  host {w.host}  memory {mem}  tasks {w.tasks}")
    click.echo(f"servers ({len(report.servers)}):")
    for s in report.servers:
        served = "-" if s.requests is None else s.requests
        click.echo(f"  {s.index}: {s.url}  job {s.job_id}  health {s.health}  "
                   f"requests {served}")
    click.echo(f"SLURM jobs ({len(report.jobs)}):")
    for j in report.jobs:
        click.echo(f"  {j.job_id}  {j.name}  {j.state}  time left {j.time_left}  "
                   f"nodes {j.nodes or '-'}")


@cluster_group.command("down")
@click.argument("name")
def cluster_down(name: str) -> None:
    """Cancel every job of cluster NAME, stop its manager, remove its state."""
    from simpipe.run import lifecycle

    cancelled = lifecycle.down(name).cancelled
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
@click.option("--job-log", default=None,
              help="The job's stdout file (default <run>/logs/slurm/%x-%j.out, or in "
                   "cluster.log_directory).")
@click.option("--output", "-o", "output", default=None,
              help="Where to write the script (default <run name>.sbatch; '-' for stdout).")
@set_option
def sbatch_command(config_path: str, nodes: int, gpus_per_node: int, workers_per_node: int,
                   walltime: str | None, mem: str | None, overcommit: bool, job_log: str | None,
                   output: str | None, overrides: tuple[str, ...]) -> None:
    """Write a batch script that runs CONFIG inside one SLURM allocation."""
    from simpipe.cluster.batch import BatchOptions
    from simpipe.run.batch_task import write_batch_script

    config = load(config_path, overrides)
    opts = BatchOptions(str(Path(config_path).resolve()), overrides, nodes, gpus_per_node,
                        workers_per_node, output=job_log, time=walltime, memory=mem,
                        overcommit=overcommit)
    script = write_batch_script(config, opts, output)
    if script.path is None:
        click.echo(script.text, nl=False)
        return
    click.echo(f"wrote {script.path}; submit it with: sbatch {script.path}  "
               f"(results: {script.run_dir})")


@click.command("batch-task", hidden=True)
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@set_option
def batch_task(config_path: str, overrides: tuple[str, ...]) -> None:
    """One srun task of a `simpipe sbatch` job (scheduler, client or worker by rank)."""
    from simpipe.run.batch_task import run_batch_task  # heavy: dask-jobqueue

    result = run_batch_task(load(config_path, overrides))
    if result is not None:
        click.echo(f"results: {result.run_dir}  ({result.wall_s:.1f} s)")


def register(main: click.Group) -> None:
    """Add this module's commands to the ``simpipe`` group."""
    main.add_command(cluster_group)
    main.add_command(sbatch_command)
    main.add_command(batch_task)
