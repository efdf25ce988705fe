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

from simpipe.cli import main
from simpipe.run.simulation import run_simulation

from support import small_config
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
    last = pd.read_parquet(results / "done" / "rounds" / "round=3")  # rounds from 1
    valid = last.loc[last["status"] == "ok", "guess"]
    counts, _ = np.histogram(valid, bins=len(run["histogram"]["counts"]), range=(0, 100))
    assert run["histogram"]["round"] == 3 and run["histogram"]["counts"] == counts.tolist()


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


def test_a_running_runs_progress_counts_agents_prompts_calls_and_eta(server, results):
    shutil.copytree(results / "done", results / "live")
    try:
        ledger = json.loads((results / "live" / "run.json").read_text())
        ledger.update(state="running", pid=os.getpid(), host=socket.gethostname(),
                      progress={"round": 1, "partitions_done": 0, "partitions_total": 4,
                                "agents_done": 150, "agents_total": 600,
                                "distinct_prompts": 40, "model_calls": 55,
                                "elapsed_s": 3.0, "agents_per_s": 50.0, "eta_s": 9.0})
        (results / "live" / "run.json").write_text(json.dumps(ledger))
        status, run = get_json(server, "/api/runs/live")
        assert status == 200 and run["state"] == "running"
        progress = run["progress"]
        assert (progress["agents_done"], progress["agents_total"]) == (150, 600)
        assert (progress["distinct_prompts"], progress["model_calls"]) == (40, 55)
        assert progress["eta_s"] == 9.0
    finally:
        shutil.rmtree(results / "live")


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


# --- broken files never cost the other runs (docs/ui.md, docs/security.md) -------------

def _copy_run(results: Path, name: str) -> Path:
    shutil.copytree(results / "done", results / name)
    return results / name


@pytest.mark.parametrize("text, problem", [
    ("[1, 2]", "run.json: a JSON array, expected an object"),
    ('{"state": "finished", "rounds": {"0": {"complete": true, "n_valid": "many"}}}',
     "run.json: rounds.0.n_valid: input should be a valid integer (found 'many')"),
    ('{"state": "finished", "rounds_total": 3, ', "run.json: not valid JSON"),
])
def test_a_broken_run_json_is_listed_as_broken_and_the_others_still_list(server, results,
                                                                          text, problem):
    run = _copy_run(results, "broken-ledger")
    (run / "run.json").write_text(text)
    try:
        status, data = get_json(server, "/api/runs")
        assert status == 200
        rows = {r["name"]: r for r in data["runs"]}
        assert rows["done"]["state"] == "finished" and rows["done"]["problem"] is None
        assert rows["broken-ledger"]["state"] == "broken"
        assert rows["broken-ledger"]["problem"].startswith(problem)
        status, detail = get_json(server, "/api/runs/broken-ledger")
        assert status == 200 and detail["state"] == "broken"
        assert detail["problem"].startswith(problem)
        # Actions on it change nothing and say why.
        token = csrf_of(server)
        status, _, body = raw_request(server.port, "POST", "/api/runs/broken-ledger/delete",
                                      {"X-CSRF-Token": token}, b'{"confirm": "broken-ledger"}')
        assert status == 409 and problem.encode() in body and run.exists()
    finally:
        shutil.rmtree(run)


@pytest.mark.parametrize("damaged, problem", [
    ("rounds/round=3/part-00001.parquet", "not a readable Parquet file"),
    ("summary.parquet", "not a readable Parquet file"),
])
def test_a_truncated_results_file_is_named_on_the_run_page(server, results, damaged, problem):
    run = _copy_run(results, "truncated")
    os.truncate(run / damaged, 100)
    try:
        status, detail = get_json(server, "/api/runs/truncated")
        assert status == 200 and detail["state"] == "finished"
        assert detail["problem"].startswith(f"{damaged}: {problem}")
        assert "--resume" in detail["problem"]
        assert len(detail["rounds"]) == 3  # what can still be read is shown
    finally:
        shutil.rmtree(run)


def test_report_symlink_out_of_the_results_root_is_refused(server, results, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "report").mkdir(parents=True)
    (elsewhere / "report" / "report.html").write_text("<h1>secret</h1>")
    run = _copy_run(results, "report-link")
    (run / "report").symlink_to(elsewhere / "report", target_is_directory=True)
    try:
        status, _, body = raw_request(server.port, "GET", "/runs/report-link/report")
        assert status == 403 and b"secret" not in body
        assert b"report-link/report/report.html leads outside the results root" in body
        rows = {r["name"]: r for r in get_json(server, "/api/runs")[1]["runs"]}
        assert rows["report-link"]["has_report"] is False
    finally:
        shutil.rmtree(run)


def test_run_json_symlink_out_of_the_results_root_is_refused(server, results, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"state": "finished", "name": "s3cret-name"}))
    (results / "json-link").mkdir()
    (results / "json-link" / "run.json").symlink_to(secret)
    try:
        status, _, body = raw_request(server.port, "GET", "/api/runs/json-link")
        assert status == 403 and b"s3cret-name" not in body
        assert b"json-link/run.json leads outside the results root" in body
        status, _, body = raw_request(server.port, "GET", "/api/runs")
        assert status == 200 and b"s3cret-name" not in body
        rows = {r["name"]: r for r in json.loads(body)["runs"]}
        assert rows["json-link"]["state"] == "broken"
    finally:
        shutil.rmtree(results / "json-link")


@pytest.fixture
def cluster_home(tmp_path, monkeypatch) -> Path:
    """An empty cluster state directory for the server (it runs in this process)."""
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "clusters"
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("text, problem", [
    ('{"state": "ready", "manager_pid": "4242"}',
     "manager_pid: input should be a valid integer (found '4242')"),
    ("[1, 2]", "a JSON array, expected an object"),
    # os.kill(-1, SIGTERM) would signal every process of the user.
    ('{"state": "ready", "manager_pid": -1}', "manager_pid: input should be greater than"),
    ('{"state": "ready", "servers": [{"url": "http://x:1"}]}', "servers.0.index: field required"),
])
def test_a_broken_cluster_state_file_is_listed_as_broken(server, cluster_home, text, problem):
    (cluster_home / "bad.json").write_text(text)
    (cluster_home / "good.json").write_text(json.dumps({"state": "failed", "error": "boom"}))
    status, data = get_json(server, "/api/clusters")
    assert status == 200
    rows = {c["name"]: c for c in data["clusters"]}
    assert rows["good"]["state"] == "failed" and rows["good"]["problem"] is None
    assert rows["bad"]["state"] == "broken"
    assert rows["bad"]["problem"].startswith(f"state file bad.json: {problem}")
    status, detail = get_json(server, "/api/clusters/bad")
    assert status == 200 and detail["state"] == "broken" and problem in detail["problem"]
    status, _, body = raw_request(server.port, "POST", "/api/clusters/bad/down",
                                  {"X-CSRF-Token": csrf_of(server)}, b"{}")
    assert status == 409 and b"nothing was stopped" in body
    assert (cluster_home / "bad.json").exists()


def test_a_cluster_state_symlink_out_of_its_directory_is_never_read(server, cluster_home,
                                                                     tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"state": "ready", "scheduler": "tcp://s3cret:8786"}))
    (cluster_home / "link.json").symlink_to(outside)
    status, _, body = raw_request(server.port, "GET", "/api/clusters")
    assert status == 200 and b"s3cret" not in body
    [row] = json.loads(body)["clusters"]
    assert row["state"] == "broken"
    assert row["problem"] == "state file link.json leads outside the cluster state directory"


def test_only_http_dashboard_urls_become_links(server, cluster_home):
    for name, url in (("js", "javascript:alert(document.cookie)"),
                      ("data", "data:text/html,<script>alert(1)</script>"),
                      ("web", "http://127.0.0.1:8787/status")):
        (cluster_home / f"{name}.json").write_text(json.dumps({"state": "ready",
                                                               "dashboard": url}))
    rows = {c["name"]: c for c in get_json(server, "/api/clusters")[1]["clusters"]}
    assert rows["js"]["dashboard"] == "javascript:alert(document.cookie)"
    assert rows["js"]["dashboard_url"] is None and rows["data"]["dashboard_url"] is None
    assert rows["web"]["dashboard_url"] == "http://127.0.0.1:8787/status"


def test_cluster_names_follow_the_cluster_modules_rule(server, cluster_home):
    long_name = "c" * 100  # a valid run name, too long for a cluster (64)
    (cluster_home / f"{long_name}.json").write_text("{}")
    token = csrf_of(server)
    assert raw_request(server.port, "GET", f"/api/clusters/{long_name}")[0] == 400
    status, _, body = raw_request(server.port, "POST", f"/api/clusters/{long_name}/down",
                                  {"X-CSRF-Token": token}, b"{}")
    assert status == 400 and b"64 for a cluster" in body


def test_an_origin_with_another_scheme_is_cross_origin(server):
    token = csrf_of(server)
    for origin in (f"https://127.0.0.1:{server.port}", f"ftp://127.0.0.1:{server.port}"):
        status, _, body = raw_request(server.port, "POST", "/api/runs/done/cancel",
                                      {"X-CSRF-Token": token, "Origin": origin}, b"{}")
        assert status == 403 and b"cross-origin" in body, origin
    # The page's own origin passes the check (and the finished run cannot be cancelled).
    assert raw_request(server.port, "POST", "/api/runs/done/cancel",
                       {"X-CSRF-Token": token, "Origin": server.url}, b"{}")[0] == 409


def test_the_bearer_scheme_is_case_insensitive(results):
    with ServerThread(results, token="s3cret-token", loopback_only=False) as srv:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            headers = {"Authorization": f"{scheme} s3cret-token"}
            assert raw_request(srv.port, "GET", "/api/runs", headers)[0] == 200, scheme
        assert raw_request(srv.port, "GET", "/api/runs",
                           {"Authorization": "bearer wrong"})[0] == 401
        assert raw_request(srv.port, "GET", "/api/runs",
                           {"Authorization": "Basic s3cret-token"})[0] == 401


def test_ui_help_names_the_token_variable_the_server_reads():
    # The option's help spells the variable out (importing simpipe.ui.security would load
    # aiohttp for `simpipe --help`); it must stay the one the server checks.
    from simpipe.ui.security import TOKEN_ENV

    result = CliRunner().invoke(main, ["ui", "--help"])
    assert result.exit_code == 0, result.output
    assert re.search(rf"\${TOKEN_ENV}\b", result.output), result.output
