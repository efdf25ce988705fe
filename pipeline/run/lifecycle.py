"""``simpipe cluster up | status | down`` as library functions returning data (the CLI only
prints them): start the manager (``simpipe.run.manager``), read what it built, stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.process_identity import check_manager, signal_manager
from simpipe.cluster.state import (
    ClusterState,
    StateError,
    manager_log,
    read_section,
    read_state,
    remove_state,
    state_path,
    worker_job_name,
    write_section,
)
from simpipe.config.model import Config, run_job_log_dir
from simpipe.run.executor import emulated


@dataclass
class ClusterUp:
    """What ``up`` started: the scheduler, the worker jobs, the healthy servers."""

    name: str
    scheduler: str
    dashboard: str
    worker_jobs: list[str]
    servers: list[srv.Server]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)  # --emulate's changes, one line each


def up(config: Config, name: str, *, emulate: bool = False,
       on_progress: Callable[[str], None] = lambda _: None) -> ClusterUp:
    """Start cluster ``name`` from ``config``'s ``[cluster]`` (SLURM workers and servers,
    held by a manager process that outlives this call) and wait until it is ready.
    ``emulate``: its servers are emulated GPUs (``--emulate``); ``on_progress`` is told each
    phase of its start."""
    cluster = slurm.require_slurm(config.cluster, "simpipe cluster up")
    notes: list[str] = []
    if emulate:
        config = emulated(config, say=notes.append)
        # refused where no SLURM answered (--emulate then placed the cluster elsewhere)
        cluster = slurm.require_slurm(config.cluster, "simpipe cluster up --emulate")
    if cluster.log_directory == str(run_job_log_dir(config.run.output_dir, config.run.name)):
        # A persistent cluster outlives any run: its jobs log to the cluster's own folder.
        cluster = cluster.model_copy(update={"log_directory": None})
    started = time.perf_counter()
    state = _start_manager(cluster, name, on_progress)
    return ClusterUp(name, state["scheduler"], state.get("dashboard", ""),
                     list(state.get("worker_jobs", [])),
                     [srv.Server(**{k: v for k, v in s.items() if k != "url"})
                      for s in state.get("servers", [])],
                     time.perf_counter() - started, notes)


def _start_manager(cfg: SlurmClusterConfig, name: str,
                   on_progress: Callable[[str], None]) -> dict[str, Any]:
    """Start the manager of cluster ``name`` and wait until it is ready (or failed)."""
    slurm.require_controller()
    if state_path(name).exists():
        old = read_state(name)
        if check_manager(old).verdict == "ours":
            raise StateError(f"cluster {name!r} is already up (manager pid "
                             f"{old['manager_pid']}); `simpipe cluster down {name}` first")
        down(name)  # a stale state from a crashed manager: clean its jobs first
    write_section(name, cfg)
    log = open(manager_log(name), "ab")  # no `with`: handed to the child, closed below
    # A new session: the manager outlives this command and ignores the terminal's Ctrl-C.
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.run.manager", name],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    log.close()
    deadline = time.monotonic() + cfg.start_timeout_s + cfg.servers.startup_timeout_s + 60
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if state_path(name).exists():
            state = read_state(name)
            phase = state.get("state", "")
            if phase != last:
                on_progress(phase)
                last = phase
            if phase == ClusterState.READY:
                return state
            if phase == ClusterState.FAILED:
                break
        time.sleep(0.3)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    error = ""
    if state_path(name).exists():
        error = read_state(name).get("error", "")
    tail = _tail(manager_log(name))
    down(name)
    raise StateError(f"cluster {name!r} did not come up: {error or 'manager exited'}"
                     + (f"\n{tail}" if tail and not error else ""))


def _tail(path: Any, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class WorkerStatus:
    address: str
    host: str | None
    memory_limit: int | None
    memory: int | None
    tasks: int


@dataclass(frozen=True)
class ServerStatus:
    index: int
    url: str
    job_id: str
    health: str  # "ok", or what its health check answered
    requests: int | None


@dataclass
class ClusterStatus:
    """A cluster's workers (host, memory, tasks), servers (health, requests) and SLURM
    jobs (state, time left); ``dataclasses.asdict`` gives its JSON."""

    name: str
    state: str | None
    scheduler: str | None
    manager_alive: bool
    workers: list[WorkerStatus] = field(default_factory=list)
    servers: list[ServerStatus] = field(default_factory=list)
    jobs: list[slurm.JobInfo] = field(default_factory=list)


def status(name: str) -> ClusterStatus:
    """What cluster ``name`` runs now, asked of its scheduler, servers and SLURM."""
    state = read_state(name)
    report = ClusterStatus(name, state.get("state"), state.get("scheduler"),
                           check_manager(state).verdict == "ours")
    if state.get("scheduler") and report.manager_alive:
        report.workers = _workers(state["scheduler"])
    cfg = read_section(name).servers
    for s in state.get("servers", []):
        problem = srv.probe(s["url"], cfg) if s.get("url") else "not placed yet"
        report.servers.append(ServerStatus(
            s["index"], s.get("url", ""), s["job_id"], "ok" if problem is None else problem,
            srv.requests_served(s["url"]) if s.get("url") else None))
    for job_name in _job_names(name):
        report.jobs += list(slurm.jobs(name=job_name).values())
    return report


def _workers(address: str) -> list[WorkerStatus]:
    from distributed import Client  # only `cluster status` asks the workers

    try:
        with Client(address, timeout="10s") as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
            processing = client.processing()
    except (OSError, TimeoutError):
        return []
    return [WorkerStatus(addr, w.get("host"), w.get("memory_limit"),
                         w.get("metrics", {}).get("memory"), len(processing.get(addr, ())))
            for addr, w in sorted(info.items())]


@dataclass(frozen=True)
class ClusterDown:
    name: str
    cancelled: list[str]  # the job ids that were still known to SLURM


def down(name: str, timeout: float = 60.0) -> ClusterDown:
    """Stop the manager, cancel every job of this cluster, remove its state.

    The manager is signalled only if it is proven to be the process that cluster's manager
    started as (simpipe.cluster.process_identity); a state file naming any other process
    gets a StateError, after the cluster's jobs are cancelled, and is kept."""
    try:
        state = read_state(name)
    except StateError:
        state = {}
    manager = check_manager(state)
    if manager.verdict == "ours" and signal_manager(state, signal.SIGTERM):
        deadline = time.monotonic() + timeout
        while check_manager(state).verdict == "ours" and time.monotonic() < deadline:
            _reap(manager.pid)
            time.sleep(0.2)
        if signal_manager(state, signal.SIGKILL):
            _reap(manager.pid)
    cancelled = _cancel_jobs(name)
    if manager.verdict == "unproven":
        raise StateError(
            f"cluster {name!r}: {manager.reason}, so it was not signalled; the cluster's SLURM "
            f"jobs were cancelled by name ({len(cancelled)}); {state_path(name)} is kept: "
            "delete it once you know that process is not the cluster's manager")
    remove_state(name)
    return ClusterDown(name, cancelled)


def _job_names(name: str) -> list[str]:
    # From the cluster's name, never from the state file: what a manager names its jobs.
    return [worker_job_name(name), srv.job_name(name)]


def _cancel_jobs(name: str) -> list[str]:
    """Cancel this cluster's SLURM jobs (found by name) and wait until they are gone, so
    "down" means nothing runs any more; their ids."""
    if slurm.controller_problem() is not None:
        return []
    names = _job_names(name)
    ids = sorted({job for job_name in names for job in slurm.jobs(name=job_name)})
    slurm.cancel(ids)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(slurm.jobs(name=job_name) for job_name in names):
            break
        time.sleep(0.5)
    return ids


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child when up and down run in one process
    except ChildProcessError:
        pass
