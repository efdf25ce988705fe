"""One ``srun`` task of a ``simpipe sbatch`` job (``simpipe.cluster.batch`` writes the script):
the scheduler, the pipeline or a worker, by rank.

Rank 0 runs the scheduler and every rank from 2 a worker, each blocking inside
``SLURMRunner`` until the job ends; rank 1 waits for the workers and for the servers the
job's first ``srun`` step started, then runs the simulation on them.
"""

from __future__ import annotations

import os
from pathlib import Path

from simpipe.cluster.batch import batch_endpoints
from simpipe.cluster.connect import SimpipeClient, dashboard_scheduler_options
from simpipe.cluster.servers import wait_urls_healthy
from simpipe.cluster.slurm import require_slurm
from simpipe.config import Config
from simpipe.run.console import Console
from simpipe.run.orchestration import url_summary, with_endpoints
from simpipe.run.simulation import RunResult, run_simulation


def run_batch_task(config: Config, console: Console | None = None) -> RunResult | None:
    """This task's part of the job; the run's result on the pipeline's rank, else None
    (scheduler and worker ranks return only when the job ends)."""
    from dask_jobqueue.slurm import SLURMRunner  # heavy, only in the job

    console = console or Console()
    cluster = config.cluster
    require_slurm(cluster, "simpipe sbatch")
    scheduler_file = (Path(config.run.output_dir).resolve() / ".simpipe-batch"
                      / "scheduler-{job_id}.json")
    scheduler_file.parent.mkdir(parents=True, exist_ok=True)
    scheduler_options = {**({"interface": cluster.interface} if cluster.interface else {}),
                         **dashboard_scheduler_options(cluster)}
    worker_options = {"nthreads": max(1, cluster.cores // cluster.processes),
                      "memory_limit": "auto"}  # the node's memory over its workers
    if cluster.interface:
        worker_options["interface"] = cluster.interface
    if cluster.local_directory:
        worker_options["local_directory"] = os.path.expandvars(cluster.local_directory)
    result = None
    # Scheduler and worker ranks block inside SLURMRunner and exit there; only the client
    # rank (1) gets past this line.
    with SLURMRunner(scheduler_file=str(scheduler_file), scheduler_options=scheduler_options,
                     worker_options=worker_options) as runner, SimpipeClient(runner) as client:
        client.wait_for_workers(runner.n_workers, timeout=cluster.start_timeout_s)
        urls = batch_endpoints(cluster)
        if urls:
            backend = cluster.servers.endpoint_backend or config.agents.backend
            console.line(f"waiting for {len(urls)} server(s): {url_summary(urls)}")
            wait_urls_healthy(urls, cluster.servers)
            config = with_endpoints(config, backend, urls)
        result = run_simulation(config, client=client, console=console)
    scheduler_file.with_name(scheduler_file.name.format(
        job_id=os.environ.get("SLURM_JOB_ID", ""))).unlink(missing_ok=True)
    return result
