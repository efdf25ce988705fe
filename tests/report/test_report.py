"""`simpipe report` on real scripted runs: files, tables recomputed with pandas, the CLI."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy import stats

from simpipe.cli import main
from simpipe.games.beauty_contest.game import rounds_to_equilibrium
from simpipe.games.beauty_contest.reference import load_references
from simpipe.report.build import build_report
from simpipe.report.tables import confidence_interval
from simpipe.run.simulation import run_simulation

from support import small_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dask_client) -> dict[str, Path]:
    """Three real scripted runs: 2/3 over five rounds, 1/2, and one without attributes in groups."""
    root = tmp_path_factory.mktemp("report-runs")
    configs = {
        "base": small_config(root, run={"name": "base"}, game={"rounds": 5}),
        "half": small_config(root, run={"name": "half"}, game={"ratio": "1/2", "rounds": 3}),
        "plain": small_config(root, run={"name": "plain"},
                              population={"size": 400, "attributes": {}},
                              game={"rounds": 2, "group_size": 100}),
    }
    return {name: run_simulation(cfg, client=dask_client).run_dir for name, cfg in configs.items()}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def assert_figures_valid(paths: list[Path]) -> None:
    assert paths
    for path in paths:
        width, height = png_size(path)
        assert width >= 300 and height >= 200, path
        assert path.stat().st_size > 10_000, path


def test_single_run_writes_figures_tables_and_page(runs, tmp_path):
    out = tmp_path / "report"
    report = build_report([runs["base"]], out)

    figures = sorted((out / "figures").glob("*.png"))
    assert {p.name for p in figures} == {"base-guesses.png", "base-convergence.png",
                                         "base-by-education.png", "base-by-age.png"}
    assert_figures_valid(figures)
    assert {p.name for p in (out / "tables").glob("*.csv")} == {
        "runs.csv", "rounds.csv", "human_reference.csv", "paper_reference.csv",
        "by_education.csv", "by_age.csv", "tests_by_education.csv", "tests_by_age.csv"}
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("<img src='data:image/png;base64,") == len(figures) == len(report.figures)
    assert "Nagel" in page and "36.73" in page and "2407.17789" in page


def test_round_table_matches_pandas(runs, tmp_path):
    run_dir = runs["base"]
    build_report([run_dir], tmp_path / "r")
    table = pd.read_csv(tmp_path / "r" / "tables" / "rounds.csv")

    rounds = pd.read_parquet(run_dir / "rounds")
    rounds["round"] = rounds["round"].astype(int)
    valid = rounds[rounds["status"] == "ok"].groupby("round")["guess"]
    summary = pd.read_parquet(run_dir / "summary.parquet").set_index("round")
    assert table["round"].tolist() == [1, 2, 3, 4, 5]  # numbered from 1, as the folders
    assert table["n"].tolist() == rounds.groupby("round").size().tolist()
    np.testing.assert_allclose(table["mean"], valid.mean())
    np.testing.assert_allclose(table["median"], valid.median())
    np.testing.assert_allclose(table["sd"], valid.std())
    np.testing.assert_allclose(table["valid_share"], valid.size() / rounds.groupby("round").size())
    np.testing.assert_allclose(table["target"], summary["target"])
    np.testing.assert_allclose(table["winning_guess"], summary["winning_guess"])
    # The environment's mean (from value counts on the workers) agrees with the pooled one.
    np.testing.assert_allclose(table["mean"], summary["mean"])


def test_attribute_table_matches_pandas(runs, tmp_path):
    run_dir = runs["base"]
    build_report([run_dir], tmp_path / "r", by=["education"])
    table = pd.read_csv(tmp_path / "r" / "tables" / "by_education.csv")

    rounds = pd.read_parquet(run_dir / "rounds")
    population = pd.read_parquet(run_dir / "population")
    joined = rounds[rounds["guess"].notna()].merge(population, on="agent_id")
    joined["round"] = joined["round"].astype(int)
    expected = (joined.groupby(["education", "round"], observed=True)["guess"]
                .agg(["size", "mean", "std"]).reset_index())
    merged = table.merge(expected, left_on=["level", "round"], right_on=["education", "round"])
    assert len(merged) == len(table) == 3 * 5
    assert (merged["n"] == merged["size"]).all()
    np.testing.assert_allclose(merged["mean_x"], merged["mean_y"])
    low, high = stats.t.interval(0.95, merged["size"] - 1, loc=merged["mean_y"],
                                 scale=merged["std"] / np.sqrt(merged["size"]))
    np.testing.assert_allclose(merged["ci_low"], low)
    np.testing.assert_allclose(merged["ci_high"], high)
    # Levels in the config's order, not alphabetical.
    assert list(dict.fromkeys(table["level"])) == ["High School", "Bachelor's Degree", "Ph.D."]
    # Only the attribute asked for.
    assert not (tmp_path / "r" / "tables" / "by_age.csv").exists()


def test_run_and_reference_tables(runs, tmp_path):
    run_dir = runs["base"]
    build_report([run_dir], tmp_path / "r")
    per_run = pd.read_csv(tmp_path / "r" / "tables" / "runs.csv").iloc[0]
    ledger = json.loads((run_dir / "run.json").read_text())
    rounds = pd.read_parquet(run_dir / "rounds")
    means = rounds.groupby(rounds["round"].astype(int))["guess"].mean()
    assert per_run["run"] == "base" and per_run["rounds"] == 5
    assert per_run["first_mean"] == pytest.approx(means.iloc[0])
    assert per_run["last_mean"] == pytest.approx(means.iloc[-1])
    assert per_run["tokens_in"] == rounds["tokens_in"].sum()
    assert per_run["wall_s"] == pytest.approx(ledger["timings"]["wall_s"])
    within = [r for r, m in means.items() if abs(m) <= 1]
    if within:
        assert per_run["rounds_to_within_1"] == within[0]  # rounds numbered from 1
    else:
        assert np.isnan(per_run["rounds_to_within_1"])

    human = pd.read_csv(tmp_path / "r" / "tables" / "human_reference.csv").iloc[0]
    assert (human["human_n"], human["human_mean"], human["human_median"]) == (67, 36.73, 33)
    assert human["run_mean"] == pytest.approx(means.iloc[0])

    paper = pd.read_csv(tmp_path / "r" / "tables" / "paper_reference.csv")
    assert set(paper["paper_model"]) == {"most models", "Mixtral-8x7B", "Mixtral-8x22B",
                                         "Qwen2-72B"}
    assert set(paper["prompt"]) == {"basic"}  # the run's prompt only
    summary = pd.read_parquet(run_dir / "summary.parquet")
    five = paper[paper["metric"] == "five_round_average_winning_number"].iloc[0]
    assert five["paper_value"] == 25.16
    assert five["run_value"] == pytest.approx(summary["target"].iloc[:5].mean())


def test_several_runs_side_by_side(runs, tmp_path):
    out = tmp_path / "cmp"
    report = build_report([runs["base"], runs["half"]], out)
    names = {p.name for p in (out / "figures").glob("*.png")}
    assert {"compare-convergence.png", "compare-guesses.png", "compare-by-education.png",
            "half-guesses.png", "base-guesses.png"} <= names
    assert_figures_valid(sorted((out / "figures").glob("*.png")))
    rounds = pd.read_csv(out / "tables" / "rounds.csv")
    assert rounds.groupby("run").size().to_dict() == {"base": 5, "half": 3}
    human = pd.read_csv(out / "tables" / "human_reference.csv")
    human = human[human["study"].str.startswith("Nagel")].set_index("run")
    assert human.loc["half", "human_mean"] == 27.05 and human.loc["base", "human_mean"] == 36.73
    # The paper's numbers are for 2/3: the 1/2 run gets a note, not rows.
    assert set(pd.read_csv(out / "tables" / "paper_reference.csv")["run"]) == {"base"}
    assert any("half" in note for note in report.section("paper_reference").notes)
    per_run = pd.read_csv(out / "tables" / "runs.csv")
    assert per_run["ratio"].tolist() == ["2/3", "1/2"]


def test_run_without_attributes_still_reports(runs, tmp_path):
    out = tmp_path / "plain"
    result = CliRunner().invoke(main, ["report", str(runs["plain"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no persona attributes" in result.output
    assert not list((out / "tables").glob("by_*.csv"))
    assert_figures_valid(sorted((out / "figures").glob("*.png")))
    # Four groups of 100: the announced numbers are averaged over the groups.
    table = pd.read_csv(out / "tables" / "rounds.csv")
    summary = pd.read_parquet(runs["plain"] / "summary.parquet")
    np.testing.assert_allclose(table["target"], summary.groupby("round")["target"].mean())


def test_persona_text_is_not_an_attribute(dask_client, tmp_path):
    config = small_config(tmp_path, run={"name": "personas"}, game={"rounds": 1},
                          population={"size": 200, "persona": {
                              "mode": "template",
                              "template": "You hold a {education} and are {age} years old."}})
    run_dir = run_simulation(config, client=dask_client).run_dir
    assert "persona" in pd.read_parquet(run_dir / "population").columns
    report = build_report([run_dir], tmp_path / "r")
    assert [s.key for s in report.sections if s.attribute] == ["by_education", "by_age"]


def test_cli_prints_the_tables(runs, tmp_path):
    result = CliRunner().invoke(main, ["report", str(runs["base"]), "--out", str(tmp_path / "o"),
                                       "--by", "education"])
    assert result.exit_code == 0, result.output
    for heading in ("## Per run", "## Per round", "## First round beside human subjects",
                    "## Beside the paper's LLM agents", "## Mean guess by education"):
        assert heading in result.output
    assert "| Ph.D." in result.output and "36.73" in result.output
    assert f"report: {tmp_path / 'o' / 'report.html'}" in result.output


def test_not_a_run_directory_exits_2(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "run.json" in lines[0]
    assert not (tmp_path / "o").exists()


def test_unknown_attribute_exits_2(runs, tmp_path):
    result = CliRunner().invoke(main, ["report", str(runs["base"]), "--by", "shoe_size",
                                       "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "shoe_size" in result.output and "education, age" in result.output


def test_reference_data_has_the_published_numbers():
    refs = load_references()
    assert "Nagel" in refs.human_citation and "American Economic Review" in refs.human_citation
    assert {(r.ratio, r.n, r.mean, r.median) for r in refs.human} == {
        ("1/2", 48, 27.05, 17), ("2/3", 67, 36.73, 33), ("4/3", 51, 60.12, 66)}
    assert refs.human_for("0.5", 0).mean == 27.05
    assert refs.human_for("2/3", 5) is None and refs.human_for("51/100", 0) is None
    values = {(r.model, r.prompt, r.metric): r.value for r in refs.llm}
    assert values[("Mixtral-8x7B", "basic", "first_round_mean")] == 36.63
    assert values[("Mixtral-8x22B", "basic", "first_round_mean")] == 31.69
    assert values[("Qwen2-72B", "cot", "first_round_winning_number")] == 12.76
    assert values[("Qwen2-72B", "basic", "five_round_average_winning_number")] == 25.16
    assert values[("Qwen2-72B", "cot", "five_round_average_winning_number")] == 2.02


def test_confidence_interval_and_rounds_to_equilibrium():
    low, high = confidence_interval(np.array([10.0, 5.0]), np.array([2.0, 1.0]), np.array([25, 1]))
    expected = stats.t.interval(0.95, 24, loc=10, scale=2 / 5)
    assert (low[0], high[0]) == pytest.approx(expected)
    assert np.isnan(low[1]) and np.isnan(high[1])
    table = pd.DataFrame({"round": [1, 2, 3], "mean": [30.0, 1.5, 0.9]})
    assert rounds_to_equilibrium(table, 0.0) == 3
    assert rounds_to_equilibrium(table, 1.0) == 2
    assert np.isnan(rounds_to_equilibrium(table, 50.0))


CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.mark.browser
def test_page_loads_in_headless_chromium(runs, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/system-deps installs it)")
    from playwright.sync_api import sync_playwright

    report = build_report([runs["base"], runs["half"]], tmp_path / "page")
    errors: list[str] = []
    with sync_playwright() as pw:
        # Playwright owns --user-data-dir: a persistent context in a fresh folder passes it.
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            viewport={"width": 1280, "height": 900},
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"])
        try:
            page = context.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.html.resolve().as_uri(), wait_until="load")
            widths = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            context.close()
    assert errors == []
    assert len(widths) == len(report.figures) and all(w > 0 for w in widths), widths
    assert "First round beside human subjects" in headings and "Runs side by side" in headings


def test_breakdowns_by_attributes_the_agents_never_saw_are_marked(runs, dask_client, tmp_path):
    # Scripted agents whose rules use education (depth_shift) but never age.
    shifted = small_config(tmp_path, run={"name": "shifted"}, game={"rounds": 2},
                           agents={"backend": "scripted",
                                   "scripted": {"depth_shift": {"education": {"Ph.D.": 1.0}}}})
    run_dir = run_simulation(shifted, client=dask_client).run_dir
    report = build_report([run_dir, runs["base"]], tmp_path / "out")
    education, age = report.section("by_education"), report.section("by_age")
    reach = education.frame.groupby("run")["reaches_agents"].first().to_dict()
    assert reach == {"shifted": "rules", "base": "not shown to the agents"}
    assert "not shown to the agents" not in education.title  # one of the runs used it
    assert any("education was not shown to the agents in base" in n for n in education.notes)
    assert age.title == "Mean guess by age (not shown to the agents)"
    assert set(age.frame["reaches_agents"]) == {"not shown to the agents"}
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Mean guess by age (not shown to the agents)" in page
