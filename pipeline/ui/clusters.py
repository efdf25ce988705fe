"""Clusters started with ``simpipe cluster up``: a thin adapter over ``simpipe.cluster``.

The state files and the status/down logic belong to ``simpipe.cluster.lifecycle``; this
module only lists them, validates names against the state directory and keeps the
(comparatively slow: squeue, a Dask client, server probes) status calls from piling up.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from simpipe.cluster import lifecycle, slurm
from simpipe.cluster.state import StateError, clusters_dir, pid_alive
from simpipe.ui.security import safe_child

STATUS_TTL_S = 3.0


class ClusterNotFound(LookupError):
    pass


def state_file(name: str) -> Path:
    """The state file of ``name``; UnsafeName for a bad name, ClusterNotFound if absent."""
    path = safe_child(clusters_dir(), name, ".json")
    if not path.is_file():
        raise ClusterNotFound(name)
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def list_clusters() -> list[dict[str, Any]]:
    root = clusters_dir()
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.glob("*.json")):
        if path.name.startswith("."):
            continue
        state = _read(path)
        out.append({
            "name": path.stem,
            "state": state.get("state", "unknown"),
            "scheduler": state.get("scheduler"),
            "dashboard": state.get("dashboard") or None,
            "manager_alive": pid_alive(state.get("manager_pid")),
            "worker_jobs": state.get("worker_jobs", []),
            "servers": len(state.get("servers", [])),
            "error": state.get("error"),
        })
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
        state = _read(path)
        try:
            report = lifecycle.status(name)
        except (StateError, slurm.SlurmError, OSError) as exc:
            report = {"name": name, "state": state.get("state"), "workers": [], "servers": [],
                      "jobs": [], "problem": str(exc)}
        report["dashboard"] = state.get("dashboard") or None
        report["error"] = state.get("error")
        report["worker_jobs"] = state.get("worker_jobs", [])
        _status_cache[name] = (time.monotonic(), report)
        return report


def cluster_down(name: str) -> dict[str, Any]:
    """Stop the manager and cancel every SLURM job of the cluster (blocking)."""
    state_file(name)
    with _lock(name):
        cancelled = lifecycle.down(name)
        _status_cache.pop(name, None)
    return {"name": name, "down": True, "cancelled_jobs": cancelled}
