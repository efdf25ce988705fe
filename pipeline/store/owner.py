"""Which process plays a run, and whether it still does: one process per run folder.

Two processes playing into one folder write the same part files and ``run.json`` under each
other, and ``--force`` would delete the folder of a run in progress. So ``run.json`` records
its owner (pid, host, and the process's start time, which tells the owner from a later
process that got the same pid, as ``simpipe.cluster.process_identity`` proves a cluster's
manager), and a run that is ``created`` or ``running`` is refused to every other process
while its owner lives. A dead owner, or a pid now held by a later process, is taken over.
Another host's process cannot be checked from here: ``--resume`` is refused and ``--force``
takes the run over.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from simpipe.cluster.process_identity import read_identity
from simpipe.cluster.state import pid_alive
from simpipe.store.record import RunRecord
from simpipe.store.states import LIVE_STATES


def this_process() -> dict[str, Any]:
    """The owner fields of ``run.json`` for the calling process."""
    me = read_identity(os.getpid()) or {}
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "pid_start_time": me.get("start_time")}


def owner_alive(record: RunRecord) -> bool:
    """Whether the process ``record`` names (on this host) still runs and is the one that
    wrote it: same pid and, where recorded, the same start time."""
    pid = record.pid
    if pid is None or pid == os.getpid():
        return False
    if not Path("/proc/self/stat").exists():  # no /proc: the pid is all there is
        return pid_alive(pid)
    live = read_identity(pid)
    if live is None:
        return False
    # A run.json of an older version has no start time: a live pid then counts as the owner.
    return record.pid_start_time is None or live["start_time"] == record.pid_start_time


def owner_problem(record: RunRecord, root: Path, *, resume: bool, force: bool) -> str | None:
    """Why this process must not open the run in ``root`` as asked (one line naming the owner
    and what to do), or None when no other process plays it."""
    if record.state not in LIVE_STATES or record.pid is None:
        return None
    here = socket.gethostname()
    host = record.host or here
    if host != here:
        if force:
            return None
        return (f"{root} is marked {record.state} by process {record.pid} on host {host!r}, "
                f"which cannot be checked from here ({here!r}); if that run has stopped, pass "
                "--force to start it over here (--resume is refused while another host may "
                "still be playing into it)")
    if not owner_alive(record):
        return None
    total = "?" if record.rounds_total is None else record.rounds_total
    return (f"{root} is in use: process {record.pid} on {host} is playing this run "
            f"({record.rounds_done}/{total} rounds); neither --resume nor --force while it "
            f"runs: wait for it to end, or stop it (Ctrl-C there, or `kill "
            f"{record.pid}`), then pass --resume to continue it")
