"""`simpipe cluster down` signals a manager only when it can prove the process is the one
the cluster's manager started as; a state file naming any other process is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpipe.cluster.process_identity import check_manager, own_identity, signal_manager
from simpipe.cluster.state import StateError, pid_alive, state_path
from simpipe.run import lifecycle

from support import one_error_line, simpipe_cli


def write_state(home: Path, name: str, state: dict) -> Path:
    path = home / "clusters" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "state": "ready", **state}))
    return path


def cluster_down(home: Path, name: str) -> subprocess.CompletedProcess:
    return simpipe_cli("cluster", "down", name, env={**os.environ, "SIMPIPE_HOME": str(home)})


def test_down_refuses_to_signal_a_pid_the_state_file_merely_names(tmp_path, bystander):
    path = write_state(tmp_path, "evil", {"manager_pid": bystander.pid})
    line = one_error_line(cluster_down(tmp_path, "evil"))
    assert f"process {bystander.pid} runs" in line and "not signalled" in line
    assert bystander.poll() is None  # alive: never signalled
    assert path.exists()  # kept, so nothing is lost


def test_down_treats_a_reused_pid_as_a_gone_manager(tmp_path, bystander):
    # The right command line but another start time: the manager died, its pid was reused.
    identity = {"manager_pid": bystander.pid, "manager_start_time": 1,
                "manager_cmdline": ["sleep", "300"], "manager_host": os.uname().nodename}
    path = write_state(tmp_path, "stale", identity)
    proc = cluster_down(tmp_path, "stale")
    assert proc.returncode == 0, proc.stderr
    assert bystander.poll() is None
    assert not path.exists()


@pytest.mark.parametrize("pid", [0, -1, True, "1", 2**40, None])
def test_nonsense_pids_are_never_alive_and_never_signalled(pid):
    assert not pid_alive(pid)
    assert check_manager({"manager_pid": pid}).verdict != "ours"
    assert not signal_manager({"manager_pid": pid}, signal.SIGCONT)


def test_a_process_of_another_user_is_not_proven_ours(monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: 12345)
    state = {"manager_pid": os.getpid(), **own_identity()}
    check = check_manager(state)
    assert check.verdict == "unproven" and "uid" in check.reason


MANAGER = """
import json, sys, time
from simpipe.cluster.process_identity import own_identity
from simpipe.cluster.state import update_state
update_state(sys.argv[1], state="ready", **own_identity())
time.sleep(300)
"""


def test_down_stops_the_process_that_recorded_itself(tmp_path, monkeypatch):
    # What pipeline/run/manager.py does at start, without SLURM: record own_identity().
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    manager = subprocess.Popen([sys.executable, "-c", MANAGER, "real"],
                               env={**os.environ, "SIMPIPE_HOME": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not state_path("real").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert check_manager(json.loads(state_path("real").read_text())).verdict == "ours"
        lifecycle.down("real", timeout=30)
        assert manager.wait(timeout=30) == -signal.SIGTERM
        assert not state_path("real").exists()
    finally:
        manager.kill()
        manager.wait()


def test_down_in_process_raises_a_state_error_naming_the_fix(tmp_path, monkeypatch, bystander):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    write_state(tmp_path, "forged", {"manager_pid": bystander.pid, "manager_host": "elsewhere"})
    with pytest.raises(StateError, match="runs on host 'elsewhere'.*not signalled"):
        lifecycle.down("forged")
    assert bystander.poll() is None and state_path("forged").exists()
