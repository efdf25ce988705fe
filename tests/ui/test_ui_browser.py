"""The manager page in headless Debian Chromium (Playwright, never a downloaded browser):
runs list numbers, a live run advancing without reload, cancel + resume from the page,
delete after confirmation, a SLURM cluster brought down; no console errors anywhere.
Screenshots of each view go to test-artifacts/ui-*.png."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from simpipe.cluster import slurm
from simpipe.run import lifecycle
from simpipe.run.simulation import run_simulation
from simpipe.servers.stub import StubProcess

from support import small_config
from uiserver import ServerThread

pytestmark = [pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, dask_client) -> Path:
    root = tmp_path_factory.mktemp("ui-browser")
    config = small_config(root, run={"name": "finished-run"},
                          population={"size": 300, "partitions": 3}, game={"rounds": 4})
    run_simulation(config, client=dask_client)
    return root / "results"


@pytest.fixture(scope="module")
def server(results) -> Iterator[ServerThread]:
    with ServerThread(results) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/system-deps installs it)")
    from playwright.sync_api import sync_playwright  # after the skip: only with a browser

    with sync_playwright() as pw:
        # Playwright owns --user-data-dir: a persistent context in a fresh folder passes it.
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            headless=True, viewport={"width": 1360, "height": 1000}, args=ARGS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser):
    """A fresh tab that records every console error and uncaught exception."""
    tab = browser.new_page()
    tab.errors = []
    tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    yield tab
    errors = list(tab.errors)
    tab.close()
    assert errors == [], errors


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"ui-{name}.png"), full_page=True)


def cell(page, run: str, col: str) -> str:
    return page.inner_text(f'tr[data-run="{run}"] td[data-col="{col}"]')


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_runs_view_shows_a_finished_run_with_the_parquet_numbers(server, results, page):
    page.goto(f"{server.url}/#/runs")
    page.wait_for_selector('tr[data-run="finished-run"]')
    rounds = pd.read_parquet(results / "finished-run" / "rounds", columns=["status", "tokens_in"])
    counts = rounds["status"].value_counts()
    assert page.get_attribute('tr[data-run="finished-run"]', "data-state") == "finished"
    assert cell(page, "finished-run", "rounds") == "4/4"
    assert number(cell(page, "finished-run", "agents")) == 300
    for col in ("ok", "unparsed", "out_of_range", "error"):
        assert number(cell(page, "finished-run", col)) == int(counts.get(col, 0)), col
    assert number(cell(page, "finished-run", "tokens_in")) == int(rounds["tokens_in"].sum())
    shot(page, "runs")

    page.click('a[href="#/runs/finished-run"]')
    page.wait_for_selector("#chart-rounds circle")
    summary = pd.read_parquet(results / "finished-run" / "summary.parquet")
    table = page.eval_on_selector_all("#rounds-table tbody tr",
                                      "rows => rows.map(r => r.children[8].textContent)")
    assert table == [f"{m:.2f}" for m in summary.sort_values("round")["mean"]]
    # Three series (mean, target, winning) of four rounds, and the histogram's bars.
    assert page.locator("#chart-rounds circle").count() == 12
    assert page.locator("#chart-hist rect").count() == 20
    shot(page, "run")


def test_an_endpoint_the_run_lost_is_flagged_on_its_page(server, results, page, dask_client):
    """A run whose first endpoint refuses every connection (a server that is gone): its
    page flags that endpoint as lost, with how often it was taken out of the rotation."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once closed
    with StubProcess() as stub:
        config = small_config(results.parent, run={"name": "lost-endpoint"},
                              population={"size": 200, "partitions": 2}, game={"rounds": 1},
                              agents={"backend": "tgi", "tgi": {"endpoints": [dead, stub.url],
                                                                 "backoff_s": 0.01}})
        run_simulation(config, client=dask_client)
    page.goto(f"{server.url}/#/runs/lost-endpoint")
    page.wait_for_selector("#endpoints-table tbody tr")
    rows = page.eval_on_selector_all(
        "#endpoints-table tbody tr",
        "rows => rows.map(r => [r.className, ...[...r.children].map(c => c.textContent)])")
    by_url = {row[1].replace(" lost", ""): row for row in rows}
    lost, live = by_url[dead], by_url[stub.url]
    assert lost[0] == "endpoint-lost" and lost[1].endswith(" lost")
    assert number(lost[5]) >= 1 and number(lost[3]) >= 3  # marked down; errors
    assert live[0] == "" and number(live[5]) == 0 and number(live[2]) >= 200
    shot(page, "run-lost-endpoint")


def test_the_run_page_shows_an_agents_prompt_on_request(server, results, page, dask_client):
    """An LLM run (a stub server answered it): the page's control fetches the prompt agent
    N got in round R, the same text `simpipe show --prompt` rebuilds, and it stays through
    the live view's updates."""
    from simpipe.run.agent_prompt import rebuild_prompt

    with StubProcess() as stub:
        config = small_config(results.parent, run={"name": "prompted"},
                              population={"size": 40, "partitions": 2,
                                          "persona": {"mode": "template"}},
                              game={"rounds": 2},
                              agents={"backend": "tgi", "tgi": {"endpoints": [stub.url]}})
        run_simulation(config, client=dask_client)
    page.goto(f"{server.url}/#/runs/prompted")
    page.wait_for_selector("#rounds-table tbody tr")
    page.fill("#prompt-agent", "17")
    page.fill("#prompt-round", "2")
    page.click("#show-prompt")
    page.wait_for_selector("#agent-prompt:not(:empty)")  # the page's CSP allows no eval
    expected = rebuild_prompt(config.run_dir, 17, 1).prompt
    assert page.inner_text("#agent-prompt").strip() == expected.strip()
    assert page.inner_text("#agent-prompt-note").startswith("agent 17, round 2 of 2")
    page.wait_for_timeout(5500)  # past a keep-alive redraw of the live view
    assert page.inner_text("#agent-prompt").strip() == expected.strip()
    shot(page, "run-prompt")
    page.fill("#prompt-agent", "40")
    page.click("#show-prompt")
    page.wait_for_selector("#agent-prompt-note:has-text('agents 0 to 39')")
    assert page.inner_text("#agent-prompt") == ""
    # The route's 404 is the answer asked for; the browser logs every 4xx as an error.
    assert [e for e in page.errors if "status of 404" not in e] == []
    page.errors.clear()


def _write_config(path: Path, results: Path, name: str) -> Path:
    path.write_text(f"""
[run]
name = "{name}"
seed = 7
output_dir = "{results}"
[population]
size = 400
partitions = 4
[game]
rounds = 3
[agents]
backend = "scripted"
[cluster]
kind = "local"
workers = 1
threads_per_worker = 1
dashboard_address = ""
""", encoding="utf-8")
    return path


def _simpipe_run(config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simpipe.cli", "run", str(config), *extra,
                             "--set", "agents.scripted.latency_s=0.8"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class LedgerWatch(threading.Thread):
    """When each round's record first appears in run.json (its mtime), to time the page."""

    def __init__(self, ledger: Path) -> None:
        super().__init__(daemon=True)
        self.ledger, self.rounds, self.done = ledger, {}, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                data = json.loads(self.ledger.read_text(encoding="utf-8"))
                mtime = self.ledger.stat().st_mtime
            except (OSError, ValueError):
                time.sleep(0.01)
                continue
            for r, rec in data.get("rounds", {}).items():
                if rec.get("complete") and int(r) not in self.rounds:
                    self.rounds[int(r)] = mtime
            time.sleep(0.01)


OBSERVE = """() => {
  window.__noReload = true;
  window.__seen = {};
  window.__progress = [];
  const box = document.getElementById('run-view');
  let last = box.dataset.roundsDone;  // only changes seen from here on are timed
  new MutationObserver(() => {
    const r = box.dataset.roundsDone;
    if (r !== last && !(r in window.__seen)) window.__seen[r] = Date.now();
    last = r;
    const p = box.dataset.partitionsDone;
    if (p && window.__progress[window.__progress.length - 1] !== p) window.__progress.push(p);
  }).observe(box, {attributes: true});
}"""


def test_live_run_advances_then_cancel_and_resume(server, results, page, tmp_path):
    config = _write_config(tmp_path / "live.toml", results, "live")
    proc = _simpipe_run(config)
    watch = LedgerWatch(results / "live" / "run.json")
    watch.start()
    resumed = None
    try:
        page.goto(f"{server.url}/#/runs")
        page.wait_for_selector('tr[data-run="live"][data-state="running"]', timeout=90_000)
        page.click('a[href="#/runs/live"]')
        page.wait_for_selector("#run-view[data-state]")
        page.evaluate(OBSERVE)
        # Progress inside round 2 shown on the page, with no reload in between (the API
        # numbers rounds from 1).
        page.wait_for_function("() => (window.__seen['1'] !== undefined) && "
                               "window.__progress.some(p => p.startsWith('2:') && p !== '2:0')",
                               timeout=90_000)
        shot(page, "run-live")
        page.click("#cancel-run")
        page.click("#confirm-yes")
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 3, out  # RunCancelled: stopped cleanly, resumable
        ledger = json.loads((results / "live" / "run.json").read_text())
        assert ledger["state"] == "interrupted" and len(ledger["rounds"]) < 3
        page.wait_for_selector('#run-view[data-state="interrupted"]', timeout=10_000)
        progress = page.evaluate("window.__progress")
        assert len(progress) >= 2, progress  # it advanced while we watched
        assert page.evaluate("window.__noReload") is True

        resumed = _simpipe_run(config, "--resume")
        out, _ = resumed.communicate(timeout=180)
        assert resumed.returncode == 0, out
        page.wait_for_selector('#run-view[data-state="finished"]', timeout=10_000)
        assert page.get_attribute("#run-view", "data-rounds-done") == "3"
        assert page.evaluate("window.__noReload") is True
        seen = page.evaluate("window.__seen")
    finally:
        watch.done.set()
        for p in (proc, resumed):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    rounds = pd.read_parquet(results / "live" / "rounds", columns=["agent_id", "round"])
    assert rounds.groupby("round", observed=True).size().tolist() == [400, 400, 400]
    # run.json's keys number rounds from 1: round r done is r rounds done.
    latencies = {r: seen[str(r)] / 1000 - t for r, t in watch.rounds.items() if str(r) in seen}
    print("\nUI update latency (round record written -> page shows it), seconds: "
          + ", ".join(f"round {r}: {v:.2f}" for r, v in sorted(latencies.items())))
    assert latencies


def test_actions_view_deletes_a_run_after_confirmation(server, results, page):
    shutil.copytree(results / "finished-run", results / "scratch")
    page.goto(f"{server.url}/#/actions")
    button = 'button[data-action="delete"][data-run="scratch"]'
    page.wait_for_selector(button)
    shot(page, "actions")
    page.click(button)
    assert page.is_disabled("#confirm-yes")  # until the name is typed
    page.fill("#confirm-input", "scratch")
    page.click("#confirm-yes")
    page.wait_for_selector(button, state="detached", timeout=15_000)
    assert not (results / "scratch").exists() and (results / "finished-run").exists()
    # The clusters view renders (no console errors) even without any cluster or SLURM.
    page.click('a[data-nav="clusters"]')
    page.wait_for_selector("#clusters > *")


def test_broken_files_are_named_on_the_page(server, results, page):
    """A run.json that is a JSON array and a truncated round file: the page names them,
    the other runs still list, and nothing throws."""
    (results / "broken-ledger").mkdir()
    (results / "broken-ledger" / "run.json").write_text("[1, 2]")
    shutil.copytree(results / "finished-run", results / "truncated")
    os.truncate(results / "truncated" / "rounds" / "round=4" / "part-00000.parquet", 100)
    try:
        page.goto(f"{server.url}/#/runs")
        page.wait_for_selector('tr[data-run="broken-ledger"][data-state="broken"]')
        assert page.get_attribute('tr[data-run="finished-run"]', "data-state") == "finished"
        assert "run.json: a JSON array, expected an object" in page.inner_text(
            'tr[data-run="broken-ledger"] [data-col="problem"]')
        page.click('a[href="#/runs/broken-ledger"]')
        page.wait_for_selector('#run-view[data-state="broken"] #run-problem')
        page.goto(f"{server.url}/#/runs/truncated")
        page.wait_for_selector("#run-problem")
        assert page.inner_text("#run-problem").startswith(
            "rounds/round=4/part-00000.parquet: not a readable Parquet file")
        assert page.locator("#chart-rounds circle").count() == 12  # the rest still drawn
        shot(page, "run-broken-file")
    finally:
        shutil.rmtree(results / "broken-ledger")
        shutil.rmtree(results / "truncated")


def test_a_dashboard_url_becomes_a_link_only_when_it_is_http(server, page, tmp_path,
                                                            monkeypatch):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "clusters"
    folder.mkdir(parents=True)
    for name, url in (("evil", "javascript:alert(document.cookie)"),
                      ("web", "http://127.0.0.1:8787/status")):
        (folder / f"{name}.json").write_text(json.dumps({"state": "ready", "dashboard": url}))
    (folder / "bad.json").write_text('{"state": "ready", "manager_pid": "4242"}')
    page.goto(f"{server.url}/#/clusters")
    link = '[data-cluster="web"] dd[data-col="dashboard"] a'
    page.wait_for_selector(link)
    assert page.get_attribute(link, "href") == "http://127.0.0.1:8787/status"
    evil = page.locator('[data-cluster="evil"] dd[data-col="dashboard"]')
    assert evil.inner_text() == "javascript:alert(document.cookie)"
    assert evil.locator("a").count() == 0
    assert page.locator('a[href^="javascript:"]').count() == 0
    assert "manager_pid: input should be a valid integer" in page.inner_text(
        '[data-cluster="bad"]')
    assert page.get_attribute('[data-cluster="bad"] .badge', "class") == "badge broken"


def _squeue(prefix: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1].startswith(prefix)]


@pytest.mark.slurm
@pytest.mark.slow
def test_cluster_brought_down_from_the_page(server, page, tmp_path, monkeypatch):
    problem = slurm.controller_problem(timeout=10)
    if problem:
        pytest.skip(f"no SLURM controller ({problem}); run `bash cluster/local-slurm.sh up`")
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path / "home"))
    name = f"ui{os.getpid()}"
    config = tmp_path / "cluster.toml"
    config.write_text(f"""
[cluster]
kind = "slurm"
jobs = 1
cores = 1
memory = "1GB"
walltime = "00:15:00"
interface = "lo"
dashboard_address = ""
log_directory = "{tmp_path / 'logs'}"
""", encoding="utf-8")
    try:
        up = subprocess.run([sys.executable, "-m", "simpipe.cli", "cluster", "up", str(config),
                             "--name", name], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "SIMPIPE_HOME": str(tmp_path / "home")})
        assert up.returncode == 0, up.stdout + up.stderr
        assert _squeue(f"simpipe-{name}-")
        page.goto(f"{server.url}/#/clusters")
        page.wait_for_selector(f'table[data-jobs="{name}"] tbody tr', timeout=60_000)
        shot(page, "clusters")
        page.click(f'[data-cluster="{name}"] button[data-action="down"]')
        page.click("#confirm-yes")
        page.wait_for_selector("#toast >> text=is down", timeout=120_000)
        assert _squeue(f"simpipe-{name}-") == []
        assert not (tmp_path / "home" / "clusters" / f"{name}.json").exists()
    finally:
        lifecycle.down(name)  # no-op when the page already did it
        assert _squeue(f"simpipe-{name}-") == []


def test_a_round_being_planned_shows_its_tasks_not_an_empty_bar(server, results, page):
    # A million agents' round 3 spends hours in its plan before any agent plays: the page
    # shows the plan's stage and tasks (what run.json's progress.planning says), not "0
    # agents".
    shutil.copytree(results / "finished-run", results / "planning-run")
    try:
        ledger = json.loads((results / "planning-run" / "run.json").read_text())
        ledger.update(state="running", pid=os.getpid(), host=socket.gethostname(),
                      progress={"round": 3, "partitions_total": 16, "agents_total": 1_000_000,
                                "elapsed_s": 600.0,
                                "planning": {"stage": "distributions", "tasks_done": 1_200,
                                             "tasks_total": 4_081, "eta_s": 1_440.0}})
        (results / "planning-run" / "run.json").write_text(json.dumps(ledger))
        page.goto(f"{server.url}/#/runs/planning-run")
        page.wait_for_selector("#plan-tasks")
        assert page.inner_text("#plan-tasks") == "1,200/4,081"
        card = page.inner_text("#progress")
        assert "planning the answers (distributions)" in card and "1,000,000 agents" in card
        assert "ETA" in card and page.locator("#agents-done").count() == 0
        bar = page.locator("#progress .bar > div")
        assert bar.evaluate("e => e.style.width") == "29.4%"  # a run.json of before: tasks
        # The bar is the share of the work done: the big walk chunks that are left weigh
        # more than the small trees that ended first.
        ledger["progress"]["planning"]["work_done"] = 0.1234
        (results / "planning-run" / "run.json").write_text(json.dumps(ledger))
        page.wait_for_selector("#plan-work")  # the page polls run.json
        assert page.inner_text("#plan-work") == " (12 % of the work)"
        assert bar.evaluate("e => e.style.width") == "12.3%"
        shot(page, "run-planning")
    finally:
        shutil.rmtree(results / "planning-run")
