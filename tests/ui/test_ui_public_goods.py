"""The run page of a public goods run: the game's own statistics, histogram and human
reference line, from the API and in headless Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simpipe.run.simulation import run_simulation

from support import small_config
from uiserver import ServerThread, raw_request

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def server(tmp_path_factory, dask_client) -> Iterator[ServerThread]:
    config = small_config(tmp_path_factory.mktemp("ui-pg"), run={"name": "pg"},
                          population={"size": 400, "partitions": 2},
                          game={"kind": "public_goods", "rounds": 3})
    run_simulation(config, client=dask_client)
    with ServerThread(config.run_dir.parent) as srv:
        yield srv


@pytest.fixture(scope="module")
def results(server) -> Path:
    return server.results


def test_the_api_gives_the_games_statistics_and_reference(server, results):
    status, _, body = raw_request(server.port, "GET", "/api/runs/pg")
    assert status == 200
    run = json.loads(body)
    summary = pd.read_parquet(results / "pg" / "summary.parquet")
    by_round = summary.groupby("round")
    pct = 100 * by_round["total_contribution"].sum() / by_round["n"].sum() / 20
    assert run["kind"] == "public_goods" and run["equilibrium"] == 0.0
    assert [r["round"] for r in run["rounds"]] == [1, 2, 3]
    np.testing.assert_allclose([r["contribution_pct"] for r in run["rounds"]], pct)
    np.testing.assert_allclose([r["mean"] for r in run["rounds"]], pct / 100 * 20)
    assert run["chart"]["series"] == [["contribution_pct", "mean contribution"]]
    assert run["chart"]["y_range"] == [0.0, 100.0]
    assert run["chart"]["reference"]["values"][:3] == [39.5, 38.7, 31.3]
    assert ["contribution_pct", "% of endowment"] in run["round_columns"]
    assert "groups of 4, endowment 20, MPCR 0.4" in run["describe"]
    # One bar per whole number of points, counted from the last round's part files.
    last = pd.read_parquet(results / "pg" / "rounds" / "round=3")
    hist = run["histogram"]
    assert hist["edges"][0] == -0.5 and hist["edges"][-1] == 20.5 and len(hist["counts"]) == 21
    assert hist["counts"] == np.bincount(last["guess"].astype(int), minlength=21).tolist()
    assert hist["mark"]["label"] == "mean contribution"
    assert hist["mark"]["value"] == pytest.approx(last["guess"].mean())


@pytest.mark.browser
def test_the_page_shows_contributions_beside_the_human_data(server, results, tmp_path):
    """The rounds table's own columns, the chart's series and human line, a bar per point;
    a screenshot goes to test-artifacts/ui-run-public-goods.png."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("Debian chromium is not installed (.ci/system-deps installs it)")
    from playwright.sync_api import sync_playwright  # after the skip: only with a browser

    errors: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(chromium), headless=True,
            viewport={"width": 1360, "height": 1000},
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{server.url}/#/runs/pg")
            page.wait_for_selector("#chart-rounds circle")
            headers = page.eval_on_selector_all("#rounds-table th",
                                                "hs => hs.map(h => h.textContent)")
            cells = page.eval_on_selector_all('#rounds-table td[data-col="contribution_pct"]',
                                              "cs => cs.map(c => c.textContent)")
            circles = page.locator("#chart-rounds circle").count()
            reference = page.locator("#chart-reference").count()
            bars = page.locator("#chart-hist rect").count()
            heading = page.inner_text("#run-view .grid h3")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "ui-run-public-goods.png"), full_page=True)
        finally:
            context.close()
    summary = pd.read_parquet(results / "pg" / "summary.parquet").groupby("round")
    pct = 100 * summary["total_contribution"].sum() / summary["n"].sum() / 20
    assert "% of endowment" in headers and "payoff" in headers and "winning" not in headers
    assert cells == [f"{v:.2f}" for v in pct]
    assert circles == 3 and reference == 1 and bars == 21
    assert heading == "Mean contribution per round"
    assert errors == []
