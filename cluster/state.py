"""Persistent clusters on disk, under ``$SIMPIPE_HOME/clusters/`` (default
``~/.simpipe/clusters``); the only module that spells these paths:

- ``<name>.json``, the state, written by the manager process of ``simpipe cluster up``: what
  other commands need to find and reuse the cluster (the scheduler address, the SLURM job
  names and ids, the server endpoints, the manager's identity);
- ``<name>/cluster.json``, the ``[cluster]`` section the cluster was started with (the
  manager builds the cluster from it; status probes and runs read its servers' settings);
- ``<name>/manager.log`` and ``<name>/logs/``, the manager's output and its jobs' logs.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Strict, ValidationError

from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.process_identity import is_process_id
from simpipe.core.errors import SimpipeError
from simpipe.core.files import write_json_atomic
from simpipe.core.home import simpipe_home
from simpipe.core.records import (
    CorruptFile,
    ProcessId,
    StrictRecord,
    read_bounded,
    read_json_record,
)

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_STATE_BYTES = 2**20  # a state file lists jobs and servers: kilobytes


class StateError(SimpipeError, RuntimeError):
    """No such cluster, or its state file is unreadable; the message says what to do."""


def clusters_dir() -> Path:
    return simpipe_home() / "clusters"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise StateError(f"cluster name {name!r}: use letters, digits, '.', '_' or '-' "
                         "(at most 64, not starting with '.' or '-')")
    return name


def state_path(name: str) -> Path:
    return clusters_dir() / f"{check_name(name)}.json"


def _work_dir(name: str) -> Path:
    """Logs and the cluster section the manager reads."""
    return clusters_dir() / check_name(name)


def section_path(name: str) -> Path:
    """The ``[cluster]`` section cluster ``name`` was started with."""
    return _work_dir(name) / "cluster.json"


def manager_log(name: str) -> Path:
    return _work_dir(name) / "manager.log"


def job_log_dir(name: str) -> Path:
    """Where the cluster's SLURM jobs write their output (unless cluster.log_directory)."""
    return _work_dir(name) / "logs"


def write_section(name: str, cluster: SlurmClusterConfig) -> None:
    """Keep the section for the manager; the work folder and its logs folder are created."""
    job_log_dir(name).mkdir(parents=True, exist_ok=True)
    section_path(name).write_text(cluster.model_dump_json(), encoding="utf-8")


def read_section(name: str) -> SlurmClusterConfig:
    """The section ``write_section`` kept; StateError naming the file when it is missing or
    is not a SLURM cluster section."""
    path = section_path(name)
    try:  # a regular file of bounded size: a FIFO or a device here must not hang us
        return SlurmClusterConfig.model_validate_json(read_bounded(path, MAX_STATE_BYTES))
    except CorruptFile as exc:
        problem = exc.problem
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        problem = ("not the [cluster] section of a SLURM cluster "
                   f"({f'{where}: ' if where else ''}{err['msg']})")
    raise StateError(f"{path}: {problem}; `simpipe cluster down {name}` cleans the cluster up, "
                     f"then `simpipe cluster up CONFIG --name {name}` starts it again")


class _Server(StrictRecord):
    index: int
    job_id: str | int
    url: str | None = None
    healthy: bool | None = None


class ClusterState(StrEnum):
    """A persistent cluster's ``state`` in its state file, as its manager process moves it
    along (``simpipe.run.manager``); written as its word."""

    STARTING = "starting"  # the manager is starting the workers and servers
    READY = "ready"  # runs may use it (``run --cluster NAME``)
    STOPPING = "stopping"  # the manager got SIGTERM and is cancelling its jobs
    FAILED = "failed"  # the start failed; ``error`` says why
    UNKNOWN = "unknown"  # a state file without a state: never written by the manager


class _ClusterState(StrictRecord):
    """The fields of a state file that commands and the web UI use, with their types."""

    # By value: JSON holds the word, and strict validation would want the member itself.
    state: Annotated[ClusterState, Strict(False)] = ClusterState.UNKNOWN
    scheduler: str | None = None
    dashboard: str | None = None
    manager_pid: ProcessId | None = None
    error: str | None = None
    worker_jobs: list[str | int] = []
    servers: list[_Server] = []
    worker_job_name: str | None = None
    server_job_name: str | None = None


def read_state_file(path: Path) -> dict[str, Any]:
    """A state file, checked: CorruptFile when it is missing, too big, not a JSON object or
    a field has the wrong type (the web UI reads any file in the folder this way)."""
    return read_json_record(path, _ClusterState, MAX_STATE_BYTES)


def read_state(name: str) -> dict[str, Any]:
    """Cluster ``name``'s state; StateError saying what to do when it is missing or broken."""
    path = state_path(name)
    if not path.exists():
        folder = clusters_dir()
        known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise StateError(f"no cluster named {name!r} ({path} missing); start one with "
                         f"`simpipe cluster up CONFIG --name {name}`"
                         + (f"; known: {', '.join(known)}" if known else ""))
    try:
        return read_state_file(path)
    except CorruptFile as exc:
        raise StateError(f"{exc}; `simpipe cluster down {name}` cleans it up") from None


def write_state(name: str, data: dict[str, Any]) -> None:
    """Atomic: readers never see half a file."""
    write_json_atomic(data, state_path(name))


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


def run_target(state: dict[str, Any], backend: str,
               takes_endpoints: bool) -> tuple[str, list[str]]:
    """What points a run at this cluster: its scheduler address and, for a back-end that
    takes endpoints (``takes_endpoints``, its plug-in's attribute in ``simpipe.config.backends``,
    a layer above this one), its healthy servers' URLs for ``agents.<backend>.endpoints``
    (empty otherwise)."""
    name = state.get("name", "?")
    if state.get("state") != ClusterState.READY:
        raise StateError(f"cluster {name!r} is {state.get('state', ClusterState.UNKNOWN)!r}, "
                         "not ready; "
                         f"see `simpipe cluster status {name}`")
    scheduler = state.get("scheduler")
    if not isinstance(scheduler, str) or not scheduler:
        raise StateError(f"cluster {name!r}: its state names no scheduler address; "
                         f"`simpipe cluster down {name}` cleans it up")
    endpoints = healthy_endpoints(state)
    served = state.get("endpoint_backend")
    if not takes_endpoints or not endpoints:
        return scheduler, []
    if served and served != backend:
        raise StateError(
            f"cluster {name!r} serves agents.backend = {served!r} endpoints but the config "
            f"has agents.backend = {backend!r}; set --set agents.backend={served}"
        )
    return scheduler, endpoints
