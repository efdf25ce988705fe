"""One ``srun`` task of a ``simpipe sbatch`` job (``simpipe.cluster.batch`` writes the script):
the scheduler, the run or a worker, by rank (``simpipe.cluster.executor.BatchExecutor``)."""

from __future__ import annotations

from simpipe.cluster.executor import BatchExecutor
from simpipe.config import Config
from simpipe.run.console import Console
from simpipe.run.simulation import RunResult, run_simulation


def run_batch_task(config: Config, console: Console | None = None) -> RunResult | None:
    """This task's part of the job; the run's result on the run's rank (1). The scheduler
    and worker ranks block inside the executor until the job ends and never run the body."""
    console = console or Console()
    with BatchExecutor(config, say=console.line) as executor:
        return run_simulation(config, executor=executor, console=console)
