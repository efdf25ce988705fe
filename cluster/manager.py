"""The long-lived process behind ``simpipe cluster up``: holds the SLURMCluster (its
scheduler runs here, on the login node, as dask-jobqueue intends), starts the servers,
keeps the state file current, and on SIGTERM cancels every job it started.

    python -m simpipe.cluster.manager NAME

reads the ``[cluster]`` section ``simpipe cluster up`` kept (``simpipe.cluster.state``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

from distributed import Client

from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.connect import slurm_cluster, start_workers
from simpipe.cluster.process_identity import own_identity
from simpipe.cluster.state import job_log_dir, read_section, update_state, worker_job_name
from simpipe.errors import SimpipeError

REFRESH_S = 2.0


def _worker_jobs(cluster: Any) -> list[str]:
    return sorted(str(job.job_id) for job in cluster.workers.values()
                  if getattr(job, "job_id", None))


def _failed(name: str, exc: Exception) -> int:
    update_state(name, state="failed", error=str(exc))
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
    started = time.monotonic()
    # Its identity (pid, host, start time, command line): `cluster down` signals this process
    # only if all of it still matches.
    update_state(name, state="starting", **own_identity(), worker_job_name=worker_job_name(name),
                 server_job_name=srv.job_name(name), log_dir=log_dir,
                 endpoint_backend=cfg.servers.endpoint_backend, started_at=time.time())
    if cfg.log_directory is None:
        cfg = cfg.model_copy(update={"log_directory": log_dir})
    servers: list[srv.Server] = []
    try:
        with slurm_cluster(cfg, job_name=worker_job_name(name)) as cluster, \
                Client(cluster) as client:
            if cfg.servers.plugin.starts_servers:
                servers = srv.launch(cfg, name, log_dir)
                update_state(name, servers=[s.as_dict() for s in servers])
            update_state(name, scheduler=cluster.scheduler_address,
                         dashboard=cluster.dashboard_link if cfg.dashboard_address else "")
            start_workers(cluster, client, cfg)
            workers_s = time.monotonic() - started
            update_state(name, worker_jobs=_worker_jobs(cluster))
            if servers:
                srv.wait_healthy(servers, cfg.servers, log_dir=log_dir)
            update_state(name, state="ready", servers=[s.as_dict() for s in servers],
                         worker_jobs=_worker_jobs(cluster),
                         timings={"workers_ready_s": round(workers_s, 2),
                                  "all_ready_s": round(time.monotonic() - started, 2)})
            print(f"cluster {name} ready: {cluster.scheduler_address}", flush=True)
            jobs_seen = _worker_jobs(cluster)
            while not stop.wait(REFRESH_S):
                # Adaptive mode and worker lifetimes replace jobs; keep the ids current.
                now = _worker_jobs(cluster)
                if now != jobs_seen:
                    update_state(name, worker_jobs=now)
                    jobs_seen = now
            update_state(name, state="stopping")
    except (SimpipeError, OSError, TimeoutError) as exc:
        return _failed(name, exc)
    finally:
        # The SLURMCluster has cancelled its worker jobs on exit; the servers are ours.
        slurm.cancel([s.job_id for s in servers])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m simpipe.cluster.manager NAME", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    return serve(args[0])


if __name__ == "__main__":
    sys.exit(main())
