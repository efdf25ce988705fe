"""``simpipe cluster up | status | down``, ``simpipe sbatch`` and its hidden ``batch-task``.

The work is in ``simpipe.cluster`` and ``simpipe.run.orchestration``; their errors are
SimpipeErrors, which the ``simpipe`` group prints as one-line messages. Each command
imports what it runs inside its own function (``simpipe --help`` stays light).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from simpipe.cli.common import load, set_option
from simpipe.config import ConfigError, run_job_log_dir

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
    from simpipe.cluster import lifecycle
    from simpipe.run.orchestration import emulated

    config = load(config_path, overrides)
    if emulate:
        config = emulated(config)
    name = name or Path(config_path).stem
    cluster = config.cluster
    own_logs = str(run_job_log_dir(config.run.output_dir, config.run.name))
    if cluster.kind == "slurm" and cluster.log_directory == own_logs:
        # A persistent cluster outlives any run: its jobs log to the cluster's own folder.
        cluster = cluster.model_copy(update={"log_directory": None})
    started = time.perf_counter()
    state = lifecycle.up(cluster, name,
                         on_progress=lambda phase: click.echo(f"cluster {name}: {phase}"))
    jobs = ", ".join(state.get("worker_jobs", [])) or "-"
    click.echo(f"cluster {name} up in {time.perf_counter() - started:.1f} s: scheduler "
               f"{state['scheduler']}, worker jobs {jobs}")
    for s in state.get("servers", []):
        click.echo(f"  server {s['index']}: {s['url']} (job {s['job_id']})")
    click.echo(f"use it: simpipe run CONFIG --cluster {name};  "
               f"stop it: simpipe cluster down {name}")


@cluster_group.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def cluster_status(name: str, as_json: bool) -> None:
    """Workers, servers and SLURM jobs of cluster NAME."""
    from simpipe.cluster import lifecycle

    report = lifecycle.status(name)
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
    from simpipe.cluster import lifecycle

    cancelled = lifecycle.down(name)
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
    from simpipe.cluster.batch import BatchOptions, batch_script
    from simpipe.cluster.slurm import require_slurm

    config = load(config_path, overrides)
    require_slurm(config.cluster, "simpipe sbatch")
    if job_log is None:
        # SLURM does not create the folder of --output; the job would fail without it.
        log_dir = Path(config.cluster.log_directory
                       or run_job_log_dir(config.run.output_dir, config.run.name)).absolute()
        log_dir.mkdir(parents=True, exist_ok=True)
        job_log = str(log_dir / "%x-%j.out")
    opts = BatchOptions(str(Path(config_path).resolve()), overrides, nodes, gpus_per_node,
                        workers_per_node, f"simpipe-{config.run.name}", job_log, walltime, mem,
                        overcommit=overcommit)
    try:
        text = batch_script(config.cluster, opts)
    except ValueError as exc:  # an option out of range; the cluster's own errors are ours
        raise ConfigError(str(exc)) from None
    if output == "-":
        click.echo(text, nl=False)
        return
    path = Path(output or f"{config.run.name}.sbatch")
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    click.echo(f"wrote {path}; submit it with: sbatch {path}  (results: {config.run_dir})")


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
