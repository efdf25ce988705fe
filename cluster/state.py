"""Persistent clusters on disk: ``$SIMPIPE_HOME/clusters/<name>.json`` (default
``~/.simpipe/clusters``), written by the manager process of ``simpipe cluster up``.

The file is what other commands need to find and reuse the cluster: the scheduler address,
the SLURM job names and ids, the server endpoints, the manager's pid.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from simpipe.cluster.process_identity import is_process_id
from simpipe.errors import SimpipeError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class StateError(SimpipeError, RuntimeError):
    """No such cluster, or its state file is unreadable; the message says what to do."""


def simpipe_home() -> Path:
    return Path(os.environ.get("SIMPIPE_HOME") or Path.home() / ".simpipe")


def clusters_dir() -> Path:
    return simpipe_home() / "clusters"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise StateError(f"cluster name {name!r}: use letters, digits, '.', '_' or '-' "
                         "(at most 64, not starting with '.' or '-')")
    return name


def state_path(name: str) -> Path:
    return clusters_dir() / f"{check_name(name)}.json"


def work_dir(name: str) -> Path:
    """Logs and the cluster section the manager reads."""
    return clusters_dir() / check_name(name)


def read_state(name: str) -> dict[str, Any]:
    path = state_path(name)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = sorted(p.stem for p in clusters_dir().glob("*.json")) if clusters_dir().is_dir() else []
        raise StateError(f"no cluster named {name!r} ({path} missing); start one with "
                         f"`simpipe cluster up CONFIG --name {name}`"
                         + (f"; known: {', '.join(known)}" if known else "")) from None
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: unreadable cluster state ({exc}); `simpipe cluster down "
                         f"{name}` cleans it up") from None


def write_state(name: str, data: dict[str, Any]) -> None:
    """Atomic: readers never see half a file."""
    path = state_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def update_state(name: str, **changes: Any) -> dict[str, Any]:
    data = read_state(name) if state_path(name).exists() else {"name": name}
    data.update(changes)
    write_state(name, data)
    return data


def remove_state(name: str) -> None:
    state_path(name).unlink(missing_ok=True)


def worker_job_name(name: str) -> str:
    """The SLURM job name of cluster ``name``'s Dask workers."""
    return f"simpipe-{check_name(name)}-worker"


def pid_alive(pid: object) -> bool:
    """Whether a process with this id exists (False for anything but a process id)."""
    if not is_process_id(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def healthy_endpoints(state: dict[str, Any]) -> list[str]:
    return [s["url"] for s in state.get("servers", []) if s.get("url") and s.get("healthy")]


def run_target(state: dict[str, Any], backend: str) -> tuple[str, list[str]]:
    """What points a run at this cluster: its scheduler address and, for an HTTP back-end
    (``tgi``, ``openai``), its healthy servers' URLs for ``agents.<backend>.endpoints``
    (empty otherwise)."""
    name = state.get("name", "?")
    if state.get("state") != "ready":
        raise StateError(f"cluster {name!r} is {state.get('state', 'unknown')!r}, not ready; "
                         f"see `simpipe cluster status {name}`")
    scheduler = state.get("scheduler")
    if not isinstance(scheduler, str) or not scheduler:
        raise StateError(f"cluster {name!r}: its state names no scheduler address; "
                         f"`simpipe cluster down {name}` cleans it up")
    endpoints = healthy_endpoints(state)
    served = state.get("endpoint_backend")
    if backend not in ("tgi", "openai") or not endpoints:
        return scheduler, []
    if served and served != backend:
        raise StateError(
            f"cluster {name!r} serves agents.backend = {served!r} endpoints but the config "
            f"has agents.backend = {backend!r}; set --set agents.backend={served}"
        )
    return scheduler, endpoints
