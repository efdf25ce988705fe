"""Results that cannot mislead (issue 28): one validity rule for every table, test, figure and
line; synthetic answers never beside published numbers; paired tests for cells that share
their draws; tests across an attribute's levels; dominated answers; the newspaper data.
Real scripted runs and experiments, and run folders changed by hand (real Parquet in the
documented schema) where a case needs answers a scripted agent never gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from simpipe.config.model import config_from_dict
from simpipe.games.beauty_contest.reference import load_references
from simpipe.games.config import BeautyContestConfig, PublicGoodsConfig
from simpipe.games.registry import game_for
from simpipe.report import figures
from simpipe.report.build import build_report
from simpipe.report.stats import power_two_sample
from simpipe.run.console import Console
from simpipe.run.experiment import _first_round, experiment_from_dict, run_experiment
from simpipe.run.simulation import _round_line, run_simulation
from simpipe.store.ledger import answers_source
from simpipe.store.record import read_ledger
from simpipe.store.round_record import RoundRecord
from simpipe.ui.runs import RunFiles, run_detail

from support import small_config

QUIET = Console(quiet=True)
TAUS = [0.5, 1.5, 3.0]


def experiment_raw(tmp_path: Path, **experiment: object) -> dict:
    return {
        "run": {"name": "v", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 120, "partitions": 2, "attributes": {"education": {"values": {
            "High School": 1, "Bachelor's Degree": 1, "Ph.D.": 1}}}},
        "game": {"rounds": 2},
        "agents": {"backend": "scripted"},
        "cluster": {"kind": "local", "workers": 1, "dashboard_address": ""},
        "experiment": {"name": "e", "grid": {"agents.scripted.tau": TAUS}, **experiment},
    }


@pytest.fixture(scope="module")
def paired(tmp_path_factory) -> Path:
    """Three cells that differ in the scripted agents' depth and share the seed."""
    experiment = experiment_from_dict(experiment_raw(tmp_path_factory.mktemp("paired")))
    run_experiment(experiment, console=QUIET)
    return experiment.folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, dask_client) -> Path:
    """A 2/3 run whose scripted agents reason deeper with more education."""
    config = small_config(tmp_path_factory.mktemp("run"), run={"name": "edu"},
                          game={"rounds": 2},
                          agents={"backend": "scripted", "scripted": {
                              "depth_shift": {"education": {"Bachelor's Degree": 0.7,
                                                            "Ph.D.": 1.5}}}})
    return run_simulation(config, client=dask_client, console=QUIET).run_dir


def first_round_dir(run: Path) -> Path:
    return sorted((run / "rounds").glob("round=*"), key=lambda p: int(p.name[6:]))[0]


def first_round(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["round"] == frame["round"].min()]


def keep_valid(run: Path, keep: int) -> None:
    """Cut all but ``keep`` first-round answers at the token limit, in the part files and
    in run.json, as a chain-of-thought run with too few tokens has them."""
    kept = 0
    for part in sorted(first_round_dir(run).glob("part-*.parquet")):
        table = pq.read_table(part)
        frame = table.to_pandas()
        frame["status"] = frame["status"].astype(object)
        for i in range(len(frame)):
            if kept < keep:
                kept += 1
                continue
            frame.loc[i, ["guess", "status"]] = [np.nan, "truncated"]
        pq.write_table(pa.Table.from_pandas(frame, schema=table.schema, preserve_index=False),
                       part)
    ledger = json.loads((run / "run.json").read_text())
    key = min(ledger["rounds"], key=int)
    ledger["rounds"][key].update(n_valid=keep, n_truncated=ledger["rounds"][key]["n"] - keep,
                                 mean=14.5)
    (run / "run.json").write_text(json.dumps(ledger))


def keep_figures(monkeypatch, drawn: list) -> None:
    """Every figure the report saves, kept in ``drawn`` as (file name, figure)."""
    save = figures._save
    monkeypatch.setattr(figures, "_save",
                        lambda fig, path: drawn.append((path.name, fig)) or save(fig, path))


def first_answers(run: Path) -> pd.Series:
    rows = pd.read_parquet(first_round_dir(run), columns=["agent_id", "guess"])
    return rows.dropna().set_index("agent_id")["guess"].sort_index()


# --- the validity rule --------------------------------------------------------------------


def test_a_cell_with_two_valid_answers_is_marked_and_gives_no_interval_test_or_human_line(
        paired, tmp_path, monkeypatch):
    folder = tmp_path / "e"
    shutil.copytree(paired, folder)
    weak = folder / "tau-0.5"
    keep_valid(weak, 2)
    drawn = []
    keep_figures(monkeypatch, drawn)
    report = build_report([folder], tmp_path / "report")

    rounds = report.section("conditions_rounds").frame
    row = first_round(rounds[rounds["condition"] == "tau-0.5"]).iloc[0]
    assert (row["n"], row["n_valid"], bool(row["valid_enough"])) == (120, 2, False)
    assert "2 of 120" in row["flag"]
    assert row[["mean_ci_low", "mean_ci_high", "median_ci_low", "median_ci_high",
                "human_mean"]].isna().all()
    strong = first_round(rounds[rounds["condition"] == "tau-1.5"]).iloc[0]
    assert strong["valid_enough"] and strong["mean_ci_low"] < strong["mean"]

    pairs = report.section("pairwise").frame.set_index(["condition_a", "condition_b"])
    untested = pairs.loc[("tau-0.5", "tau-1.5")]
    assert not untested["valid_enough"] and "tau-0.5" in untested["flag"]
    assert np.isnan(untested["rank_p"]) and np.isnan(untested["t_p"])
    assert pairs.loc[("tau-1.5", "tau-3.0"), "rank_p"] < 0.05
    notes = " ".join(report.section("pairwise").notes)
    assert "1 tests with a p value" in notes and "2 of 3 pairs not tested" in notes

    per_round = report.section("rounds").frame
    weak_round = first_round(per_round[per_round["run"] == "tau-0.5"]).iloc[0]
    assert not weak_round["valid_enough"] and weak_round["n_valid"] == 2
    assert any(n.startswith("NOT VALID ENOUGH") and "tau-0.5" in n for n in report.notes)
    assert "tau-0.5" not in set(report.section("human_reference").frame["run"])

    # The cell's own figure draws no human line and rings the flagged round.
    fig = dict(drawn)["condition-tau-0.5.png"]
    humans = [line for line in fig.axes[0].get_lines() if line.get_label() == "humans"]
    assert all(row["round"] not in line.get_xdata() for line in humans)
    assert any("not valid enough" in t.get_text() for t in fig.axes[0].texts)
    # The console's cell line says n and the mark.
    line = _first_round(weak)
    assert "first-round mean 14.50, n 2 valid of 120" in line and "NOT VALID ENOUGH" in line


def test_the_ui_marks_a_round_that_is_not_valid_enough(paired, tmp_path):
    folder = tmp_path / "e"
    shutil.copytree(paired, folder)
    keep_valid(folder / "tau-0.5", 2)
    detail = run_detail(RunFiles.open(folder, "tau-0.5"))
    assert [r["valid_enough"] for r in detail["rounds"]] == [False, True]
    assert "2 of 120" in detail["rounds"][0]["flag"]
    assert detail["answers_source"] == "rule-based"


# --- paired and independent samples -------------------------------------------------------


def test_cells_that_share_their_draws_are_compared_as_pairs_by_agent_id(paired):
    report = build_report([paired])
    pairs = report.section("pairwise").frame.set_index(["condition_a", "condition_b"])
    row = pairs.loc[("tau-0.5", "tau-3.0")]
    assert (row["design"], row["rank_test"], row["t_test"], row["d_kind"]) == (
        "paired", "Wilcoxon signed-rank", "paired t", "d_z")
    a, b = first_answers(paired / "tau-0.5"), first_answers(paired / "tau-3.0")
    common = a.index.intersection(b.index)
    diff = a.loc[common] - b.loc[common]
    assert row["n_pairs"] == len(common) == 120
    assert row["rank_p"] == pytest.approx(stats.wilcoxon(diff).pvalue)
    assert row["t_p"] == pytest.approx(stats.ttest_rel(a.loc[common], b.loc[common]).pvalue)
    assert row["d"] == pytest.approx(diff.mean() / diff.std(ddof=1))
    assert row["identical_share"] == pytest.approx((diff == 0).mean())
    assert row["pair_r"] == pytest.approx(np.corrcoef(a.loc[common], b.loc[common])[0, 1])
    assert row["rank_p"] < 1e-6 and row["d"] > 0  # deeper reasoning, lower guesses
    assert row["rank_p_holm"] >= row["rank_p"]
    notes = " ".join(report.section("pairwise").notes)
    assert "share their agents and random draws" in notes
    assert "experiment.independent_draws = true" in notes
    assert "3 tests with a p value" in notes
    conditions = report.section("conditions").frame
    assert conditions["seed"].nunique() == 1 and set(conditions["answers"]) == {"rule-based"}


def test_independent_draws_give_each_cell_its_own_seed_and_independent_tests(tmp_path):
    raw = experiment_raw(tmp_path, independent_draws=True)
    raw["experiment"]["grid"] = {"agents.scripted.tau": [0.5, 3.0]}
    experiment = experiment_from_dict(raw)
    seeds = [c.config.run.seed for c in experiment.cells]
    assert len(set(seeds)) == 2 and 5 not in seeds
    assert [c.config.run.seed for c in experiment_from_dict(raw).cells] == seeds  # stable
    shared = dict(raw, experiment={"name": "e", "grid": raw["experiment"]["grid"]})
    assert {c.config.run.seed for c in experiment_from_dict(shared).cells} == {5}

    run_experiment(experiment, console=QUIET)
    pairs = build_report([experiment.folder]).section("pairwise").frame
    row = pairs.iloc[0]
    assert (row["design"], row["rank_test"], row["d_kind"]) == (
        "independent", "Mann-Whitney U", "Cohen's d")
    a = first_answers(experiment.folder / "tau-0.5")
    b = first_answers(experiment.folder / "tau-3.0")
    assert row["rank_p"] == pytest.approx(
        stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert row["t_p"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)


# --- synthetic answers ----------------------------------------------------------------------


def test_runs_record_where_their_answers_come_from(run_dir, tmp_path):
    assert read_ledger(run_dir / "run.json").answers_source == "rule-based"
    old = json.loads((run_dir / "run.json").read_text())
    old.pop("answers_source")
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert read_ledger(tmp_path / "run.json").answers_source == "model"  # written before the field
    base = {"run": {"name": "x", "output_dir": str(tmp_path)},
            "population": {"size": 20, "partitions": 1}, "game": {"rounds": 1}}
    emulated = config_from_dict({**base, "agents": {"backend": "tgi"},
                                 "cluster": {"kind": "local", "servers": {"kind": "emulated"}}})
    assert answers_source(emulated) == "synthetic"
    assert answers_source(config_from_dict({**base, "agents": {"backend": "llamacpp"}})) == "model"


def test_a_synthetic_run_is_never_set_beside_published_numbers(run_dir, tmp_path):
    fake = tmp_path / "fake"
    shutil.copytree(run_dir, fake)
    ledger = json.loads((fake / "run.json").read_text())
    ledger["answers_source"] = "synthetic"
    (fake / "run.json").write_text(json.dumps(ledger))
    report = build_report([fake], tmp_path / "r")
    for key in ("human_reference", "paper_reference"):
        section = report.section(key)
        assert section.frame.empty
        assert any("synthetic" in n for n in section.notes)
    assert report.notes[0].startswith("SYNTHETIC ANSWERS")
    page = report.html.read_text()
    assert "<h1>simpipe report: SYNTHETIC answers" in page
    assert pd.read_csv(tmp_path / "r" / "tables" / "runs.csv")["answers"].tolist() == [
        "synthetic"]


def test_the_round_line_says_synthetic_and_no_sharing_factor_where_nothing_was_shared(
        run_dir, tmp_path):
    config = config_from_dict({
        "run": {"name": "x", "output_dir": str(tmp_path)},
        "population": {"size": 20000, "partitions": 4}, "game": {"rounds": 1},
        "agents": {"backend": "tgi"},
        "cluster": {"kind": "local", "servers": {"kind": "emulated"}}})
    summary = pd.read_parquet(run_dir / "summary.parquet")
    rows = summary[summary["round"] == summary["round"].min()]
    record = RoundRecord(n=20000, n_valid=20000, mean=50.37, elapsed_s=1.0,
                         agents_per_s=20000.0, distinct_prompts=1, sharing_factor=20000.0,
                         model_calls=20000, shared_agents=0, fallback_prompts=0)
    line = _round_line(config, game_for(config.game), 0, rows, record)
    assert "synthetic answers" in line
    assert "sharing factor" not in line and "answers not shared" in line


# --- by attribute ---------------------------------------------------------------------------


def test_an_attribute_gets_a_test_across_its_levels_a_trend_and_the_power(run_dir, tmp_path,
                                                                            monkeypatch):
    drawn = []
    keep_figures(monkeypatch, drawn)
    report = build_report([run_dir], tmp_path / "r", by=["education"])
    tests = first_round(report.section("tests_by_education").frame).iloc[0]
    rows = pd.read_parquet(first_round_dir(run_dir), columns=["agent_id", "guess"])
    people = pd.read_parquet(run_dir / "population", columns=["agent_id", "education"])
    joined = rows.merge(people, on="agent_id")
    order = ["High School", "Bachelor's Degree", "Ph.D."]
    groups = [joined.loc[joined["education"] == level, "guess"] for level in order]
    kw = stats.kruskal(*groups)
    assert tests["kw_p"] == pytest.approx(kw.pvalue)
    assert tests["epsilon_sq"] == pytest.approx(kw.statistic / (len(joined) - 1))
    rank = joined["education"].map({level: i for i, level in enumerate(order)})
    rho = stats.spearmanr(rank, joined["guess"])
    assert (tests["trend_rho"], tests["trend_p"]) == pytest.approx((rho.statistic, rho.pvalue))
    assert tests["trend_order"] == "config order"
    assert tests["trend_rho"] < 0 and tests["trend_p"] < 0.01  # more education, lower guesses
    sizes = sorted(len(g) for g in groups)
    assert tests["power_d05"] == pytest.approx(power_two_sample(0.5, *sizes[:2]))
    assert 0 < tests["power_d02"] < tests["power_d05"] <= 1
    table = report.section("by_education").frame
    assert (table["n"] == table["n_valid"]).all() and table["valid_enough"].all()
    # Figures by attribute start at the answer range's lower bound, not at the data.
    fig = dict(drawn)["edu-by-education.png"]
    assert fig.axes[0].get_ylim()[0] == 0.0


def test_power_of_a_two_sample_t_test_matches_the_textbook_values():
    assert power_two_sample(0.5, 64, 64) == pytest.approx(0.80, abs=0.01)
    assert power_two_sample(0.2, 394, 394) == pytest.approx(0.80, abs=0.01)


# --- notes, dominated answers, references ---------------------------------------------------


def test_the_experiment_report_finds_attributes_and_uses_one_nagel_mean(paired):
    report = build_report([paired])
    assert not any("no persona attributes" in n for n in report.notes)
    rounds = report.section("conditions_rounds").frame
    human = report.section("human_reference").frame
    nagel = human.loc[human["study"].str.startswith("Nagel"), "human_mean"]
    assert set(nagel) == {36.73}
    assert set(first_round(rounds)["human_mean"]) == {36.73}


def test_dominated_answers_are_counted_beside_the_mean(run_dir, tmp_path):
    game = game_for(BeautyContestConfig())
    shares = game.dominated_shares(np.array([100.0, 70.0, 66.67, 66.66, 10.0]))
    assert shares == {"dominated_share": pytest.approx(0.6), "top_share": pytest.approx(0.2)}
    assert game_for(PublicGoodsConfig()).dominated_shares(np.array([1.0])) is None
    report = build_report([run_dir], tmp_path / "r")
    table = pd.read_csv(tmp_path / "r" / "tables" / "rounds.csv")
    first = first_round(table).iloc[0]
    guesses = pd.read_parquet(first_round_dir(run_dir), columns=["guess"])["guess"].dropna()
    assert first["dominated_share"] == pytest.approx((guesses > 200 / 3).mean())
    assert first["dominated_share"] > 0  # level-0 players guess anywhere in round 1
    assert first["top_share"] == pytest.approx((guesses >= 100).mean())
    assert list(table.columns).index("dominated_share") == list(table.columns).index("sd") + 1
    paper = report.section("paper_reference").frame
    means = paper[paper["metric"] == "first_round_mean"]
    assert (means["run_dominated_share"] == first["dominated_share"]).all()


def test_the_newspaper_experiments_stand_beside_a_two_thirds_run(run_dir, tmp_path):
    refs = load_references()
    assert "Bosch-Domènech" in refs.newspaper_citation and "92(5)" in refs.newspaper_citation
    assert "original table" in refs.newspaper_caveat
    report = build_report([run_dir], tmp_path / "r")
    human = pd.read_csv(tmp_path / "r" / "tables" / "human_reference.csv").set_index("study")
    assert human.loc["Financial Times (UK), newspaper", ["human_n", "human_mean",
                                                        "human_target"]].tolist() == [
        1476, 18.91, 13]
    assert human.loc["Spektrum der Wissenschaft (Germany), newspaper", "human_mean"] == 22.08
    assert human.loc["Expansión (Spain), newspaper", "human_n"] == 3696
    assert "Bosch-Domènech" in report.section("human_reference").citation
    assert any("original table" in n for n in report.section("human_reference").notes)
