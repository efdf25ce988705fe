"""The built-in kinds' executors (``simpipe.cluster.plugin.Workers``), each typed by its own
settings model: a LocalCluster on this machine, a scheduler that already runs, SLURM worker
jobs through dask-jobqueue. Distributed and dask-jobqueue are imported in ``connect``:
the registry that names these classes is read by ``simpipe validate``, which needs neither.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from simpipe.cluster import dashboard_off
from simpipe.cluster.config import AddressClusterConfig, LocalClusterConfig, SlurmClusterConfig
from simpipe.cluster.plugin import Workers

if TYPE_CHECKING:
    from distributed import Client


class LocalWorkers(Workers[LocalClusterConfig]):
    """``cluster.kind = "local"``: a LocalCluster of worker processes on this machine."""

    def connect(self, stack: ExitStack) -> Client:
        from distributed import Client, LocalCluster

        from simpipe.cluster.ctrl_c import PRELOAD, quiet_local_workers, workers_ignore_sigint

        cfg = self.settings
        # The terminal's Ctrl-C reaches the whole process group; only the client acts on it.
        with workers_ignore_sigint():
            cluster = stack.enter_context(LocalCluster(
                n_workers=cfg.workers,
                threads_per_worker=cfg.threads_per_worker,
                processes=True,
                memory_limit=cfg.memory_limit,
                scheduler_kwargs=dashboard_off.scheduler_options(cfg.dashboard_address),
                silence_logs=logging.ERROR,
                preload=[PRELOAD],
            ))
            client = stack.enter_context(Client(cluster))
        # Runs first on exit (the stack unwinds in reverse): the workers stop logging
        # while the client can still reach them, then the client and the cluster close.
        stack.callback(quiet_local_workers, client)
        return client


class AddressWorkers(Workers[AddressClusterConfig]):
    """``cluster.kind = "address"``: the workers of a scheduler that is already running;
    nothing is started."""

    def connect(self, stack: ExitStack) -> Client:
        from simpipe.cluster.connect import ClusterError, SimpipeClient

        address = self.settings.address
        try:
            client = SimpipeClient(address, timeout="20s")
        except OSError as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at cluster.address = {address!r} "
                f"({exc}); start it (`dask scheduler`, `simpipe cluster up`) or fix the address"
            ) from exc
        return stack.enter_context(client)


class SlurmWorkers(Workers[SlurmClusterConfig]):
    """``cluster.kind = "slurm"``: a scheduler here and ``cluster.jobs`` SLURM worker jobs
    (dask-jobqueue's SLURMCluster, its jobs of the kind's job class); the SLURMCluster is
    ``cluster`` once connected."""

    cluster: Any = None  # a dask_jobqueue.SLURMCluster: typed loosely, imported late

    def connect(self, stack: ExitStack) -> Client:
        from distributed import Client

        from simpipe.cluster.connect import slurm_cluster, start_workers

        cfg = self.settings
        self.cluster = stack.enter_context(slurm_cluster(cfg, job_name=self.job_name,
                                                         job_class=self.job_class))
        client = stack.enter_context(Client(self.cluster))
        self.progress(scheduler=self.cluster.scheduler_address,
                      dashboard=self.cluster.dashboard_link if cfg.dashboard_address else "")
        start_workers(self.cluster, client, cfg)
        self.progress(worker_jobs=self.worker_jobs())
        return client

    def worker_jobs(self) -> list[str]:
        """The SLURM job ids of the workers now (adaptive mode and lifetimes replace jobs)."""
        if self.cluster is None:
            return []
        return sorted(str(job.job_id) for job in self.cluster.workers.values()
                      if getattr(job, "job_id", None))
