"""`simpipe report` on public goods runs: the game's own tables and figures, its human data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from simpipe.cli import main
from simpipe.report.build import build_report
from simpipe.run.simulation import run_simulation

from support import small_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dask_client) -> dict[str, Path]:
    """Scripted public goods runs: the experiment's design (3 rounds), another MPCR, and a
    beauty contest to refuse mixing with."""
    root = tmp_path_factory.mktemp("pg-report")
    configs = {
        "pg": small_config(root, run={"name": "pg"},
                           game={"kind": "public_goods", "rounds": 3}),
        "half": small_config(root, run={"name": "half"},
                             game={"kind": "public_goods", "rounds": 2, "mpcr": 0.5}),
        "bc": small_config(root, run={"name": "bc"}, game={"rounds": 1}),
    }
    return {name: run_simulation(cfg, client=dask_client).run_dir for name, cfg in configs.items()}


def test_the_rounds_table_is_the_contributions(runs, tmp_path):
    report = build_report([runs["pg"]], tmp_path / "r")
    table = pd.read_csv(tmp_path / "r" / "tables" / "rounds.csv")
    rows = pd.read_parquet(runs["pg"] / "rounds", columns=["round", "guess"])
    rows["round"] = rows["round"].astype(int)
    by_round = rows.groupby("round")["guess"]
    assert table["round"].tolist() == [1, 2, 3] and (table["n"] == 600).all()
    np.testing.assert_allclose(table["mean_contribution"], by_round.mean())
    np.testing.assert_allclose(table["contribution_pct"], 100 * by_round.mean() / 20)
    np.testing.assert_allclose(table["sd"], by_round.std())
    summary = pd.read_parquet(runs["pg"] / "summary.parquet")
    payoff = (summary["mean_payoff"] * summary["n"]).groupby(summary["round"]).sum() / 600
    np.testing.assert_allclose(table["mean_payoff"], payoff)
    assert report.section("rounds").notes[-1].startswith("An invalid answer counts as")
    per_run = pd.read_csv(tmp_path / "r" / "tables" / "runs.csv").iloc[0]
    assert (per_run["endowment"], per_run["mpcr"], per_run["group_size"]) == (20, 0.4, 4)
    assert per_run["first_pct"] == pytest.approx(table["contribution_pct"].iloc[0])
    assert per_run["last_pct"] == pytest.approx(table["contribution_pct"].iloc[-1])
    assert not (tmp_path / "r" / "tables" / "paper_reference.csv").exists()


def test_first_and_last_period_beside_the_human_data(runs, tmp_path):
    report = build_report([runs["pg"], runs["half"]], tmp_path / "r")
    human = pd.read_csv(tmp_path / "r" / "tables" / "human_reference.csv")
    assert human["run"].tolist() == ["pg", "pg"] and human["period"].tolist() == [1, 3]
    assert human["human_pct"].tolist() == [39.5, 31.3] and (human["human_n"] == 140).all()
    rounds = pd.read_csv(tmp_path / "r" / "tables" / "rounds.csv").set_index(["run", "round"])
    assert human["run_pct"].tolist() == pytest.approx(
        [rounds.loc[("pg", 1), "contribution_pct"], rounds.loc[("pg", 3), "contribution_pct"]])
    section = report.section("human_reference")
    assert "Fischbacher" in section.citation and "Gaechter" in section.citation
    assert any("replication data" in n and "could not be re-checked" in n
               for n in section.notes)
    assert any(n.startswith("half: no human data") and "MPCR 0.5" in n for n in section.notes)
    names = {p.name for p in (tmp_path / "r" / "figures").glob("*.png")}
    assert {"pg-guesses.png", "pg-convergence.png", "half-convergence.png",
            "compare-convergence.png", "compare-guesses.png"} <= names
    for path in (tmp_path / "r" / "figures").glob("*.png"):
        assert path.read_bytes()[:8] == PNG_MAGIC
    page = (tmp_path / "r" / "report.html").read_text()
    assert "First and last period beside human subjects" in page
    assert "Mean contribution by education" in page


def test_runs_of_different_games_are_refused_in_one_line(runs, tmp_path):
    result = CliRunner().invoke(main, ["report", str(runs["pg"]), str(runs["bc"]),
                                       "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "different games" in lines[0]
    assert "is public_goods" in lines[0] and "is beauty_contest" in lines[0]
    assert not (tmp_path / "o").exists()


def test_the_cli_prints_the_games_tables(runs, tmp_path):
    result = CliRunner().invoke(main, ["report", str(runs["pg"]), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    for heading in ("## Per run", "## Per round", "## First and last period beside human "
                    "subjects", "## Mean contribution by education"):
        assert heading in result.output
    assert "39.5" in result.output and "Fischbacher" in result.output
