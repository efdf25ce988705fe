"""The pieces of a Dask client for a ``[cluster]`` section that the kinds' executors
(``simpipe.cluster.workers``) and ``simpipe sbatch``'s job share: the client class, the
SLURMCluster's arguments and dashboard, starting its workers."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distributed import Client

from simpipe.cluster import dashboard_off
from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.ctrl_c import import_slurm_cluster
from simpipe.cluster.slurm import SlurmError, dry_submit, require_controller
from simpipe.cluster.slurm_job import REFUSED, SUBMIT_LOGGER, refused_jobs, reporting_job_class
from simpipe.core.errors import SimpipeError

#: The keys whose values reach the worker job's #SBATCH lines: what a refusal points at.
JOB_KEYS = ("cluster.queue, cluster.account, cluster.cores, cluster.memory, cluster.walltime "
            "and cluster.job_extra_directives")


class SimpipeClient(Client):
    """A distributed Client whose ``dashboard_link`` is "" when the scheduler has none.

    Distributed's raises KeyError for a scheduler without a dashboard (ours, with
    ``cluster.dashboard_address = ""``) unless the client was made from a cluster object,
    as it is not for ``cluster.kind = "address"`` (``run --cluster``) and ``simpipe sbatch``.
    """

    @property
    def dashboard_link(self) -> str:
        try:
            return super().dashboard_link or ""
        except KeyError:
            return ""


class ClusterError(SimpipeError, RuntimeError):
    """The cluster could not be started or reached; the message says how to fix it."""


def slurm_cluster_kwargs(config: SlurmClusterConfig,
                         job_name: str = "simpipe-worker") -> dict[str, Any]:
    """The ``dask_jobqueue.SLURMCluster`` arguments for a ``[cluster]`` section."""
    scheduler_options = dashboard_scheduler_options(config)
    kwargs: dict[str, Any] = {
        "queue": config.queue,
        "account": config.account,
        "walltime": config.walltime,
        "cores": config.cores,
        "memory": config.memory,
        "processes": config.processes,
        "interface": config.interface,
        "scheduler_options": scheduler_options,
        "local_directory": config.local_directory,
        "log_directory": config.log_directory,
        "job_extra_directives": list(config.job_extra_directives),
        "job_script_prologue": list(config.job_script_prologue),
        "worker_extra_args": config.worker_lifetime_args(),
        "python": config.python or sys.executable,
        "job_name": job_name,
    }
    return {k: v for k, v in kwargs.items() if v is not None}


def dashboard_scheduler_options(config: SlurmClusterConfig) -> dict[str, Any]:
    """``cluster.scheduler_options`` with the dashboard settings: ``dashboard_address``
    (loopback by default), or, for ``""``, no HTTP server at all (see dashboard_off)."""
    options = {**dashboard_off.scheduler_options(config.dashboard_address),
               **config.scheduler_options}
    if not config.dashboard_address:
        options["preload"] = [*_as_list(config.scheduler_options.get("preload")),
                              dashboard_off.PRELOAD]
    return options


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


@contextmanager
def slurm_cluster(config: SlurmClusterConfig, job_name: str = "simpipe-worker",
                  job_class: type | None = None) -> Iterator[Any]:
    """A started ``SLURMCluster`` (no jobs yet) whose jobs are ``job_class`` (default
    ``reporting_job_class()``); closing it cancels its jobs."""
    SLURMCluster = import_slurm_cluster()  # a class: named like one

    try:
        require_controller()
    except SlurmError as exc:
        raise ClusterError(str(exc)) from None
    try:
        cluster = SLURMCluster(job_cls=job_class or reporting_job_class(),
                               **slurm_cluster_kwargs(config, job_name))
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot start the Dask scheduler for SLURM workers ({exc}); check "
                           "cluster.interface and cluster.scheduler_options") from exc
    with cluster:
        yield cluster


def start_workers(cluster: Any, client: Client, config: SlurmClusterConfig) -> None:
    """Ask SLURM for the worker jobs (``jobs``, or ``adapt``'s minimum) and wait for them.
    A job sbatch refuses ends the wait at once with sbatch's own words: first the job script
    is checked with ``sbatch --test-only`` (nothing queued), which also covers the jobs an
    adaptive cluster submits later."""
    problem = dry_submit(cluster.job_script())
    if problem:
        raise ClusterError(f"sbatch refuses the worker job: {problem}; check {JOB_KEYS}")
    with _said_by_the_error():
        _start_and_wait(cluster, client, config)


@contextmanager
def _said_by_the_error() -> Iterator[None]:
    """The refusal warnings of the jobs ``start_workers`` submits stay quiet: its error
    says the same, once."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(REFUSED)

    SUBMIT_LOGGER.addFilter(keep)
    try:
        yield
    finally:
        SUBMIT_LOGGER.removeFilter(keep)


def _start_and_wait(cluster: Any, client: Client, config: SlurmClusterConfig) -> None:
    if config.adapt is not None:
        cluster.adapt(minimum_jobs=config.adapt.minimum, maximum_jobs=config.adapt.maximum)
        wanted = config.adapt.minimum * config.processes
    else:
        cluster.scale(jobs=config.n_jobs)
        wanted = config.n_jobs * config.processes
    if not wanted:
        return  # adaptive from zero: the first tasks ask for jobs
    deadline = time.monotonic() + config.start_timeout_s
    while True:
        refused = refused_jobs(cluster)
        if refused:
            raise ClusterError(f"sbatch refused a worker job: {refused[0]}; check {JOB_KEYS}, "
                               "and the site's limits (`sacctmgr show qos`)")
        left = deadline - time.monotonic()
        try:
            client.wait_for_workers(wanted, timeout=max(0.1, min(1.0, left)))
            return
        except TimeoutError:
            if left <= 1.0:
                break
    logs = config.log_directory or "the job output files (cluster.log_directory)"
    raise ClusterError(
        f"{wanted} SLURM worker(s) did not connect within cluster.start_timeout_s = "
        f"{config.start_timeout_s:g} s; see `squeue` (queued? pending reason) and {logs} "
        "(wrong cluster.python, or cluster.interface?)"
    )
