"""Clusters started with ``simpipe cluster up``: a thin adapter over ``simpipe.cluster``.

The state files and the status/down logic belong to ``simpipe.run.lifecycle``; this
module only lists them, validates names (the cluster module's own rule) and state files
(a broken one is listed with state ``broken`` and the problem, and nothing is done with it)
and keeps the (comparatively slow: squeue, a Dask client, server probes) status calls from
piling up.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simpipe.cluster import slurm
from simpipe.cluster.state import (
    ClusterState,
    StateError,
    check_name,
    clusters_dir,
    pid_alive,
    read_state_file,
)
from simpipe.core.records import CorruptFile
from simpipe.run import lifecycle
from simpipe.ui.runs import BROKEN
from simpipe.ui.security import OutsideRoot, UnsafeName, contained, http_url, safe_child

STATUS_TTL_S = 3.0


class ClusterNotFound(LookupError):
    pass


class ClusterBroken(RuntimeError):
    """The cluster's state file cannot be used; nothing is done with it (HTTP 409)."""


def state_file(name: str) -> Path:
    """The state file of ``name``; UnsafeName for a name the cluster module would refuse,
    ClusterNotFound if absent."""
    try:
        check_name(name)
    except StateError as exc:
        raise UnsafeName(str(exc)) from None
    path = safe_child(clusters_dir(), name, ".json")
    if not path.is_file():
        raise ClusterNotFound(name)
    return path


def _read(path: Path) -> dict[str, Any]:
    """The checked state; CorruptFile (or OutsideRoot for a symlink out) otherwise."""
    inside = contained(clusters_dir(), path, "the cluster state directory")
    return read_state_file(inside)


def _problem(path: Path, exc: Exception) -> str:
    if isinstance(exc, CorruptFile):
        return f"state file {path.name}: {exc.problem}"
    return f"state file {exc}"


def _row(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "state": state.get("state", ClusterState.UNKNOWN),
        "scheduler": state.get("scheduler"),
        "dashboard": state.get("dashboard") or None,
        "dashboard_url": http_url(state.get("dashboard")),  # the only value put in a link
        "manager_alive": pid_alive(state.get("manager_pid")),
        "worker_jobs": state.get("worker_jobs", []),
        "servers": len(state.get("servers", [])),
        "error": state.get("error"),
        "problem": None,
    }


def list_clusters() -> list[dict[str, Any]]:
    root = clusters_dir()
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            out.append(_row(path.stem, _read(path)))
        except (CorruptFile, OutsideRoot) as exc:
            out.append({**_row(path.stem, {}), "state": BROKEN,
                        "problem": _problem(path, exc)})
    return out


_status_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


def cluster_status(name: str) -> dict[str, Any]:
    """Workers, servers and SLURM jobs of one cluster (blocking; call from a thread)."""
    path = state_file(name)
    with _lock(name):
        cached = _status_cache.get(name)
        if cached and time.monotonic() - cached[0] < STATUS_TTL_S:
            return cached[1]
        try:
            state = _read(path)
        except (CorruptFile, OutsideRoot) as exc:
            # Never handed to lifecycle: it would trust the types (a string pid, a list).
            return {"name": name, "state": BROKEN, "workers": [], "servers": [], "jobs": [],
                    "problem": _problem(path, exc), "dashboard": None, "dashboard_url": None,
                    "error": None, "worker_jobs": []}
        try:
            report = asdict(lifecycle.status(name))
        except (StateError, slurm.SlurmError, OSError) as exc:
            report = {"name": name, "state": state.get("state"), "workers": [], "servers": [],
                      "jobs": [], "problem": str(exc)}
        report["dashboard"] = state.get("dashboard") or None
        report["dashboard_url"] = http_url(state.get("dashboard"))
        report["error"] = state.get("error")
        report["worker_jobs"] = state.get("worker_jobs", [])
        _status_cache[name] = (time.monotonic(), report)
        return report


def cluster_down(name: str) -> dict[str, Any]:
    """Stop the manager and cancel every SLURM job of the cluster (blocking)."""
    path = state_file(name)
    with _lock(name):
        try:
            _read(path)
        except (CorruptFile, OutsideRoot) as exc:
            raise ClusterBroken(f"{_problem(path, exc)}; nothing was stopped or cancelled: "
                                f"fix or remove {path} by hand") from None
        try:
            cancelled = lifecycle.down(name).cancelled
        except StateError as exc:  # e.g. a manager pid that is not provably this cluster's
            raise ClusterBroken(str(exc)) from None
        _status_cache.pop(name, None)
    return {"name": name, "down": True, "cancelled_jobs": cancelled}
