"""Proof that a process id still names the process simpipe started, before it is signalled.

A cluster's state file says which process is its manager, and ``simpipe cluster down``
(also the web UI's "bring down") terminates it. The file is plain JSON in the user's home:
it may be stale (the manager died and the pid was reused) or written by something else
(``{"manager_pid": -1}`` would mean every process). So the manager records its identity at
start: pid, host, start time (``/proc/<pid>/stat`` field 22, clock ticks after boot) and
command line; a process is signalled only if it is alive, on this host, owned by this user,
and has that exact start time and command line. Signals go through a pidfd where the
system has them, so a pid reused between the check and the signal cannot be hit.

Linux only (``/proc``); elsewhere nothing can be proven and nothing is signalled.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PID_MAX = 2**31 - 1  # pid_t is a signed 32-bit int


def is_process_id(value: object) -> bool:
    """Only a positive int is one process: to ``kill``, 0 means this process group, -1
    every process we may signal, and True is 1 (init)."""
    return type(value) is int and 0 < value <= PID_MAX


def read_identity(pid: int) -> dict[str, Any] | None:
    """``{"start_time", "cmdline", "uid"}`` of a running process, None if there is none
    (or it has exited and waits to be reaped: a zombie has no command line)."""
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
        uid = proc.stat().st_uid
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ")".
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None  # exited; only its exit status is left for the parent to collect
    return {"start_time": int(fields[19]),
            "cmdline": [arg.decode(errors="replace") for arg in cmdline.split(b"\0") if arg],
            "uid": uid}


def own_identity() -> dict[str, Any]:
    """What a manager records about itself: the ``manager_*`` keys of the state file."""
    me = read_identity(os.getpid()) or {}
    return {"manager_pid": os.getpid(), "manager_host": socket.gethostname(),
            "manager_start_time": me.get("start_time"), "manager_cmdline": me.get("cmdline")}


Verdict = Literal["ours", "gone", "unproven"]


@dataclass(frozen=True)
class ManagerCheck:
    """``ours``: alive and proven ours, safe to signal; ``gone``: nothing of ours runs under
    that pid; ``unproven``: something runs there that cannot be proven ours."""

    verdict: Verdict
    pid: int | None
    reason: str


def check_manager(state: dict[str, Any]) -> ManagerCheck:
    """Whether the process the state file names as manager is one we may signal."""
    pid = state.get("manager_pid")
    if pid is None:
        return ManagerCheck("gone", None, "no manager recorded")
    if not is_process_id(pid):
        return ManagerCheck("unproven", None, f"manager_pid = {pid!r} is not a process id")
    host = state.get("manager_host")
    if host is not None and host != socket.gethostname():
        return ManagerCheck("unproven", pid, f"its manager (pid {pid}) runs on host {host!r}, "
                                             f"not here ({socket.gethostname()!r}); run the "
                                             "command there")
    if not Path("/proc/self/stat").exists():
        return ManagerCheck("unproven", pid, "this system has no /proc to prove that process "
                                             f"{pid} is the manager")
    live = read_identity(pid)
    if live is None:
        return ManagerCheck("gone", pid, f"manager process {pid} has exited")
    if live["uid"] != os.getuid():
        return ManagerCheck("unproven", pid, f"process {pid} belongs to uid {live['uid']}, "
                                             f"not to you (uid {os.getuid()})")
    start, cmdline = state.get("manager_start_time"), state.get("manager_cmdline")
    if type(start) is not int or not isinstance(cmdline, list):
        return ManagerCheck("unproven", pid, f"process {pid} runs, but the state file does not "
                                             "record its start time and command line (it was "
                                             "not written by a simpipe manager)")
    if live["start_time"] != start:
        return ManagerCheck("gone", pid, f"manager process {pid} has exited (the pid now "
                                         "belongs to a later process)")
    if live["cmdline"] != cmdline:
        return ManagerCheck("unproven", pid, f"process {pid} started when the manager did but "
                                             f"runs {' '.join(live['cmdline'])[:120]!r}")
    return ManagerCheck("ours", pid, "")


def signal_manager(state: dict[str, Any], sig: signal.Signals) -> bool:
    """Send ``sig`` to the manager only if it is proven ours at this moment; whether sent."""
    pid = state.get("manager_pid")
    if not is_process_id(pid):
        return False
    pidfd_open = getattr(os, "pidfd_open", None)
    try:
        fd = pidfd_open(pid) if pidfd_open else None
    except ProcessLookupError:
        return False
    except OSError:
        fd = None  # a kernel without pidfds: the check and os.kill stay a few us apart
    try:
        if check_manager(state).verdict != "ours":
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
