"""The long-lived process behind ``simpipe cluster up``: an ``Executor`` of the SLURM kind (its
SLURMCluster's scheduler runs here, on the login node, as dask-jobqueue intends) that starts
the workers and the servers, keeps the state file current, and on SIGTERM cancels every job
it started.

    python -m simpipe.run.manager NAME

reads the ``[cluster]`` section ``simpipe cluster up`` kept (``simpipe.cluster.state``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

from simpipe.cluster import servers as srv
from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.process_identity import own_identity
from simpipe.cluster.state import (
    ClusterState,
    job_log_dir,
    read_section,
    update_state,
    worker_job_name,
)
from simpipe.config.model import Config
from simpipe.core.errors import SimpipeError
from simpipe.run.executor import Executor

REFRESH_S = 2.0


class ManagerExecutor(Executor):
    """The persistent cluster's executor: its jobs named after the cluster, and every step
    of its start written to the cluster's state file (``simpipe cluster up`` waits on it)."""

    fills_endpoints = False  # its servers serve the runs that connect to it

    def __init__(self, name: str, cfg: SlurmClusterConfig) -> None:
        self.worker_job_name = worker_job_name(name)
        self.cluster_name = name
        self.started = time.monotonic()
        self.workers_s = 0.0
        self.scheduler = ""  # its SLURMCluster's address, told by the workers' progress
        super().__init__(Config(cluster=cfg), name=name,
                         say=lambda text: print(text, flush=True))

    def prepare(self, config: Config) -> Config:
        return config  # serves any run: the back-end is checked when a run connects

    def progress(self, **state: Any) -> None:
        self.scheduler = state.get("scheduler", self.scheduler)
        if "worker_jobs" in state:
            self.workers_s = time.monotonic() - self.started
        update_state(self.cluster_name, **state)


def _failed(name: str, exc: Exception) -> int:
    update_state(name, state=ClusterState.FAILED, error=str(exc))
    print(f"cluster {name} failed: {exc}", file=sys.stderr, flush=True)
    return 1


def serve(name: str) -> int:
    try:
        cfg = read_section(name)
    except SimpipeError as exc:
        return _failed(name, exc)
    log_dir = str(job_log_dir(name))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Its identity (pid, host, start time, command line): `cluster down` signals this process
    # only if all of it still matches.
    update_state(name, state=ClusterState.STARTING, **own_identity(),
                 worker_job_name=worker_job_name(name), server_job_name=srv.job_name(name),
                 log_dir=log_dir,
                 endpoint_backend=cfg.servers.endpoint_backend, started_at=time.time())
    if cfg.log_directory is None:
        cfg = cfg.model_copy(update={"log_directory": log_dir})
    try:
        # Leaving the executor cancels the worker jobs (the SLURMCluster) and the servers.
        with ManagerExecutor(name, cfg) as executor:
            update_state(name, state=ClusterState.READY,
                         servers=[s.as_dict() for s in executor.servers],
                         worker_jobs=executor.worker_jobs(),
                         timings={"workers_ready_s": round(executor.workers_s, 2),
                                  "all_ready_s": round(time.monotonic() - executor.started, 2)})
            print(f"cluster {name} ready: {executor.scheduler}", flush=True)
            jobs_seen = executor.worker_jobs()
            while not stop.wait(REFRESH_S):
                # Adaptive mode and worker lifetimes replace jobs; keep the ids current.
                now = executor.worker_jobs()
                if now != jobs_seen:
                    update_state(name, worker_jobs=now)
                    jobs_seen = now
            update_state(name, state=ClusterState.STOPPING)
    except (SimpipeError, OSError, TimeoutError) as exc:
        return _failed(name, exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m simpipe.run.manager NAME", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    return serve(args[0])


if __name__ == "__main__":
    sys.exit(main())
