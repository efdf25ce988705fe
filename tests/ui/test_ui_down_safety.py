"""The web UI's "bring down" (POST /api/clusters/<name>/down) never signals a process that a
cluster state file merely names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from uiserver import ServerThread, raw_request


def test_bring_down_leaves_an_unproven_manager_pid_alone(tmp_path: Path, monkeypatch, bystander):
    home = tmp_path / "home"
    monkeypatch.setenv("SIMPIPE_HOME", str(home))  # the server runs in this process
    (home / "clusters").mkdir(parents=True)
    state = home / "clusters" / "evil.json"
    state.write_text(json.dumps({"name": "evil", "state": "ready",
                                 "manager_pid": bystander.pid}))
    (tmp_path / "results").mkdir()
    with ServerThread(tmp_path / "results") as server:
        _, _, page = raw_request(server.port, "GET", "/")
        csrf = re.search(rb'name="csrf-token" content="([^"]+)"', page).group(1).decode()
        status, _, body = raw_request(server.port, "POST", "/api/clusters/evil/down",
                                      {"X-CSRF-Token": csrf, "Origin": server.url}, b"{}")
        listed = json.loads(raw_request(server.port, "GET", "/api/clusters")[2])
    assert status == 409, body  # refused with the reason, not a server error
    assert b"manager" in body
    assert bystander.poll() is None  # alive: never signalled
    assert state.exists()
    [row] = listed["clusters"]
    assert row["name"] == "evil"
