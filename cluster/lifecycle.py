"""``simpipe cluster up | status | down``: start the manager, read what it built, stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.config import ClusterConfig
from simpipe.cluster.process_identity import check_manager, signal_manager
from simpipe.cluster.state import (
    StateError,
    manager_log,
    read_section,
    read_state,
    remove_state,
    state_path,
    worker_job_name,
    write_section,
)


def up(cfg: ClusterConfig, name: str,
       on_progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start the manager of cluster ``name`` and wait until it is ready (or failed)."""
    slurm.require_slurm(cfg, "simpipe cluster up")
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
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.cluster.manager", name],
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
            if phase == "ready":
                return state
            if phase == "failed":
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


def status(name: str) -> dict[str, Any]:
    """Workers (host, memory, tasks), servers (health, requests), SLURM jobs (state, time left)."""
    state = read_state(name)
    report: dict[str, Any] = {"name": name, "state": state.get("state"),
                              "scheduler": state.get("scheduler"),
                              "manager_alive": check_manager(state).verdict == "ours",
                              "workers": [], "servers": [], "jobs": []}
    if state.get("scheduler") and report["manager_alive"]:
        report["workers"] = _workers(state["scheduler"])
    cfg = read_section(name).servers
    for s in state.get("servers", []):
        problem = srv.probe(s["url"], cfg) if s.get("url") else "not placed yet"
        report["servers"].append({"index": s["index"], "url": s.get("url", ""),
                                  "job_id": s["job_id"],
                                  "health": "ok" if problem is None else problem,
                                  "requests": srv.requests_served(s["url"]) if s.get("url")
                                  else None})
    for job_name in _job_names(name):
        report["jobs"] += [j.__dict__ for j in slurm.jobs(name=job_name).values()]
    return report


def _workers(address: str) -> list[dict[str, Any]]:
    from distributed import Client  # only `cluster status` asks the workers

    try:
        with Client(address, timeout="10s") as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
            processing = client.processing()
    except (OSError, TimeoutError):
        return []
    return [{"address": addr, "host": w.get("host"), "memory_limit": w.get("memory_limit"),
             "memory": w.get("metrics", {}).get("memory"),
             "tasks": len(processing.get(addr, ()))} for addr, w in sorted(info.items())]


def down(name: str, timeout: float = 60.0) -> list[str]:
    """Stop the manager, cancel every job of this cluster, remove its state; the job ids
    that were still known to SLURM.

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
    return cancelled


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
