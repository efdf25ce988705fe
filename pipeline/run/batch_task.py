"""``simpipe sbatch``: the batch script for a whole config (its text from
``simpipe.cluster.batch``), and one ``srun`` task of the job: the scheduler, the run or a
worker, by rank (``simpipe.run.executor.BatchExecutor``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from simpipe.cluster.batch import BatchOptions, batch_script
from simpipe.cluster.slurm import require_slurm
from simpipe.config.model import Config, ConfigError, run_job_log_dir
from simpipe.run.console import Console
from simpipe.run.executor import BatchExecutor
from simpipe.run.simulation import RunResult, run_simulation


def run_batch_task(config: Config, console: Console | None = None) -> RunResult | None:
    """This task's part of the job; the run's result on the run's rank (1). The scheduler
    and worker ranks block inside the executor until the job ends and never run the body."""
    console = console or Console()
    with BatchExecutor(config, say=console.line) as executor:
        return run_simulation(config, executor=executor, console=console)


@dataclass(frozen=True)
class BatchScript:
    """A written batch script: its text, its file (None: not written), the run's folder."""

    text: str
    path: Path | None
    run_dir: Path


def write_batch_script(config: Config, opts: BatchOptions,
                       output: str | Path | None = None) -> BatchScript:
    """``simpipe sbatch``: the batch script that runs ``config`` (``opts.config_path`` with
    ``opts.overrides``) in one allocation, written to ``output`` (default
    ``<run name>.sbatch``, executable; ``"-"``: not written). The job's output goes to
    ``opts.output``, by default ``<run>/logs/slurm/%x-%j.out`` or into
    ``cluster.log_directory``, a folder made here (SLURM does not make it, and the job
    would fail without it)."""
    cluster = require_slurm(config.cluster, "simpipe sbatch")
    if opts.output is None:
        log_dir = Path(cluster.log_directory
                       or run_job_log_dir(config.run.output_dir, config.run.name)).absolute()
        log_dir.mkdir(parents=True, exist_ok=True)
        opts = replace(opts, output=str(log_dir / "%x-%j.out"))
    opts = replace(opts, job_name=opts.job_name or f"simpipe-{config.run.name}")
    try:
        text = batch_script(cluster, opts)
    except ValueError as exc:  # an option out of range; the cluster's own errors are ours
        raise ConfigError(str(exc)) from None
    if str(output) == "-":
        return BatchScript(text, None, config.run_dir)
    path = Path(output or f"{config.run.name}.sbatch")
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return BatchScript(text, path, config.run_dir)
