"""The UI's JSON API and its safety rules against a real scripted run (no browser)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from support import small_config
from simpipe.cli import main
from simpipe.runner import run_simulation
from uiserver import ServerThread, raw_request


@pytest.fixture(scope="module")
def results(tmp_path_factory, dask_client) -> Path:
    root = tmp_path_factory.mktemp("ui-api")
    config = small_config(root, run={"name": "done"}, population={"size": 300, "partitions": 3},
                          game={"rounds": 3})
    run_simulation(config, client=dask_client)
    return root / "results"


@pytest.fixture(scope="module")
def server(results) -> ServerThread:
    with ServerThread(results) as srv:
        yield srv


def get_json(server: ServerThread, path: str, **headers: str) -> tuple[int, dict]:
    status, _, body = raw_request(server.port, "GET", path, headers)
    return status, json.loads(body) if body.startswith(b"{") else {}


def csrf_of(server: ServerThread, headers: dict[str, str] | None = None) -> str:
    _, _, page = raw_request(server.port, "GET", "/", headers)
    return re.search(rb'name="csrf-token" content="([^"]+)"', page).group(1).decode()


def test_runs_list_matches_the_parquet_files(server, results):
    status, data = get_json(server, "/api/runs")
    assert status == 200
    [row] = [r for r in data["runs"] if r["name"] == "done"]
    rounds = pd.read_parquet(results / "done" / "rounds", columns=["status", "tokens_in"])
    counts = rounds["status"].value_counts()
    assert row["state"] == "finished" and row["rounds_done"] == row["rounds_total"] == 3
    assert row["n_agents"] == 300
    for status_name in ("ok", "unparsed", "out_of_range", "error"):
        assert row["counts"][status_name] == int(counts.get(status_name, 0))
    assert row["tokens_in"] == int(rounds["tokens_in"].sum())


def test_run_detail_matches_summary_and_last_round(server, results):
    status, run = get_json(server, "/api/runs/done")
    assert status == 200
    summary = pd.read_parquet(results / "done" / "summary.parquet").sort_values("round")
    assert [r["round"] for r in run["rounds"]] == summary["round"].tolist()
    np.testing.assert_allclose([r["mean"] for r in run["rounds"]], summary["mean"])
    np.testing.assert_allclose([r["target"] for r in run["rounds"]], summary["target"])
    np.testing.assert_allclose([r["winning_guess"] for r in run["rounds"]],
                               summary["winning_guess"])
    assert run["equilibrium"] == 0.0
    last = pd.read_parquet(results / "done" / "rounds" / "round=2")
    valid = last.loc[last["status"] == "ok", "guess"]
    counts, _ = np.histogram(valid, bins=len(run["histogram"]["counts"]), range=(0, 100))
    assert run["histogram"]["round"] == 2 and run["histogram"]["counts"] == counts.tolist()


def test_live_stream_sends_the_run(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        # HTTP/1.0: no chunked framing, the event arrives as plain text.
        sock.sendall(b"GET /api/runs/done/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while not re.search(rb"data: .*\n\n", data):
            data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    assert b" 200 " in head.splitlines()[0] and b"text/event-stream" in head
    event = re.search(rb"data: (.*)\n\n", body).group(1)
    assert json.loads(event)["name"] == "done"


TRAVERSALS = [
    "/api/runs/..%2f..%2fetc%2fpasswd",
    "/api/runs/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/api/runs/%2e%2e",
    "/api/runs/..",
    "/api/runs/%252e%252e%252fetc%252fpasswd",  # double-encoded
    "/api/runs/..%5c..%5cwindows",  # backslashes
    "/api/runs/%5cetc%5cpasswd",
    "/api/runs/%2fetc%2fpasswd",  # absolute
    "/api/runs/C:%5cWindows",
    "/api/runs/.hidden",
    "/api/runs/done%00",
    "/runs/..%2f..%2fetc%2fpasswd/report",
    "/api/runs/..%2fdone/events",
    "/api/clusters/..%2f..%2fetc%2fpasswd",
    "/api/clusters/%2e%2e%2fclusters",
    "/api/clusters/%252e%252e%252fx",
]
RAW_TRAVERSALS = [  # dot segments the HTTP layer sees unencoded
    "/api/runs/../../etc/passwd",
    "/api/runs/../../../../../../etc/passwd",
    "/static/../app.py",
    "/static/..%2fsecurity.py",
    "/static/%2e%2e%2fsecurity.py",
    "//etc/passwd",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_path_traversal_names_are_refused(server, path):
    status, _, body = raw_request(server.port, "GET", path)
    assert status == 400, (path, status, body[:200])
    assert b"root:" not in body


@pytest.mark.parametrize("path", RAW_TRAVERSALS)
def test_raw_dot_segments_never_reach_a_file(server, path):
    status, _, body = raw_request(server.port, "GET", path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"import" not in body


def test_traversal_actions_change_nothing(server, results, tmp_path):
    outside = results.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "run.json").write_text(json.dumps({"state": "finished"}))
    token = csrf_of(server)
    for path in ("/api/runs/..%2foutside/delete", "/api/runs/%2e%2e%2foutside/delete",
                 "/api/runs/..%5coutside/delete", "/api/clusters/..%2f..%2foutside/down"):
        status, _, _ = raw_request(server.port, "POST", path,
                                   {"X-CSRF-Token": token, "Content-Type": "application/json"},
                                   b'{"confirm": "../outside"}')
        assert status == 400, path
    assert (outside / "run.json").exists()


def test_symlink_out_of_the_results_root_is_refused(server, results, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "run.json").write_text(json.dumps({"state": "finished"}))
    (results / "link").symlink_to(elsewhere, target_is_directory=True)
    try:
        assert raw_request(server.port, "GET", "/api/runs/link")[0] == 400
        assert "link" not in [r["name"] for r in get_json(server, "/api/runs")[1]["runs"]]
    finally:
        (results / "link").unlink()


def test_actions_are_post_only_with_csrf(server, results):
    assert raw_request(server.port, "GET", "/api/runs/done/cancel")[0] == 405
    assert raw_request(server.port, "GET", "/api/runs/done/delete")[0] == 405
    assert raw_request(server.port, "POST", "/api/runs/done/cancel", body=b"{}")[0] == 403
    assert raw_request(server.port, "POST", "/api/runs/done/cancel",
                       {"X-CSRF-Token": "forged"}, b"{}")[0] == 403
    token = csrf_of(server)
    assert raw_request(server.port, "POST", "/api/runs/done/cancel",
                       {"X-CSRF-Token": token, "Origin": "http://evil.example"}, b"{}")[0] == 403
    assert raw_request(server.port, "POST", "/api/runs/done/cancel",
                       {"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"}, b"{}")[0] == 403
    # The right token: a finished run cannot be cancelled, and deleting needs its name.
    assert raw_request(server.port, "POST", "/api/runs/done/cancel",
                       {"X-CSRF-Token": token}, b"{}")[0] == 409
    assert raw_request(server.port, "POST", "/api/runs/done/delete",
                       {"X-CSRF-Token": token}, b'{"confirm": "nope"}')[0] == 409
    assert (results / "done" / "run.json").exists()


def test_delete_removes_a_finished_run(server, results):
    shutil.copytree(results / "done", results / "copy")
    token = csrf_of(server)
    status, _, _ = raw_request(server.port, "POST", "/api/runs/copy/delete",
                               {"X-CSRF-Token": token, "Origin": server.url},
                               b'{"confirm": "copy"}')
    assert status == 200 and not (results / "copy").exists()
    assert raw_request(server.port, "GET", "/api/runs/copy")[0] == 404


def test_report_link_serves_the_report_page(server, results):
    shutil.copytree(results / "done", results / "reported")
    (results / "reported" / "report").mkdir()
    (results / "reported" / "report" / "report.html").write_text("<h1>report</h1>")
    try:
        rows = {r["name"]: r for r in get_json(server, "/api/runs")[1]["runs"]}
        assert rows["reported"]["has_report"] and not rows["done"]["has_report"]
        status, headers, body = raw_request(server.port, "GET", "/runs/reported/report")
        assert status == 200 and body == b"<h1>report</h1>"
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert raw_request(server.port, "GET", "/runs/done/report")[0] == 404
    finally:
        shutil.rmtree(results / "reported")


def test_foreign_host_header_is_refused_without_a_token(server):
    # DNS rebinding: a page from evil.example that resolves to 127.0.0.1.
    assert raw_request(server.port, "GET", "/api/runs", {"Host": "evil.example"})[0] == 421
    assert raw_request(server.port, "GET", "/api/runs", {"Host": "localhost:1"})[0] == 200


def test_token_is_required_off_loopback(results):
    with ServerThread(results, token="s3cret-token", loopback_only=False) as srv:
        for path in ("/", "/api/runs", "/api/runs/done", "/static/app.js",
                     "/api/runs/done/events", "/api/clusters", "/runs/done/report"):
            assert raw_request(srv.port, "GET", path)[0] == 401, path
        assert raw_request(srv.port, "GET", "/api/runs", {"X-Simpipe-Token": "wrong"})[0] == 401
        assert raw_request(srv.port, "GET", "/?token=wrong")[0] == 401
        assert raw_request(srv.port, "POST", "/api/runs/done/cancel", body=b"{}")[0] == 401
        assert raw_request(srv.port, "GET", "/api/runs",
                           {"Authorization": "Bearer s3cret-token"})[0] == 200
        # First visit with ?token= moves it into an HttpOnly cookie and out of the URL.
        status, headers, _ = raw_request(srv.port, "GET", "/?token=s3cret-token")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        jar = {"Cookie": cookie.split(";", 1)[0]}
        assert raw_request(srv.port, "GET", "/api/runs", jar)[0] == 200
        # With the token, actions still need the CSRF token.
        assert raw_request(srv.port, "POST", "/api/runs/done/cancel", jar, b"{}")[0] == 403
        csrf = csrf_of(srv, jar)
        assert raw_request(srv.port, "POST", "/api/runs/done/cancel",
                           {**jar, "X-CSRF-Token": csrf}, b"{}")[0] == 409


def test_cli_refuses_a_public_host_without_a_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_UI_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["ui", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code == 2 and "SIMPIPE_UI_TOKEN" in result.output


def test_a_dead_running_run_is_shown_interrupted(server, results):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, extra, age in (("died-pid", {"pid": dead.pid, "host": socket.gethostname()}, 0),
                             ("died-quiet", {}, 7200), ("alive", {}, 0)):
        shutil.copytree(results / "done", results / name)
        ledger = json.loads((results / name / "run.json").read_text())
        if name == "died-quiet":  # a ledger from before runs recorded their pid
            ledger.pop("pid", None)
            ledger.pop("host", None)
        ledger.update(state="running", progress={"round": 1, "partitions_done": 1,
                                                 "partitions_total": 3, "agents_done": 100,
                                                 "elapsed_s": 1.0, "agents_per_s": 100.0},
                      **extra)
        (results / name / "run.json").write_text(json.dumps(ledger))
        if age:
            past = time.time() - age
            for p in [results / name / "run.json", results / name / "run.log",
                      results / name / "rounds" / "round=1"]:
                os.utime(p, (past, past))
    try:
        rows = {r["name"]: r for r in get_json(server, "/api/runs")[1]["runs"]}
        assert rows["died-pid"]["state"] == "interrupted"
        assert "gone" in rows["died-pid"]["state_note"]
        assert rows["died-quiet"]["state"] == "interrupted"
        assert rows["alive"]["state"] == "running" and rows["alive"]["progress"]["round"] == 1
    finally:
        for name in ("died-pid", "died-quiet", "alive"):
            shutil.rmtree(results / name)


def test_simpipe_ui_command_serves_the_page(results):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.cli", "ui", "--port", str(port),
                             "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert f"http://127.0.0.1:{port}/" in proc.stdout.readline()
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _, body = raw_request(port, "GET", "/")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert status == 200 and b"/static/app.js" in body
        assert raw_request(port, "GET", "/static/app.js")[0] == 200
    finally:
        proc.terminate()
        proc.wait(10)
