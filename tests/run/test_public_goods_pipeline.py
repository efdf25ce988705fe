"""The public goods game through the whole pipeline: a real Dask cluster, real Parquet files,
the CLI, --resume and the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simpipe.config.model import ConfigError
from simpipe.games.public_goods.environment import SUMMARY_COLUMNS
from simpipe.run.console import Console
from simpipe.run.simulation import RunCancelled, run_simulation
from simpipe.servers.stub import StubProcess
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_ledger, read_rounds, read_summary

from support import REPO, CancelAfterFirstRound, one_error_line, simpipe_cli, small_config

QUIET = Console(quiet=True)
GAME = {"kind": "public_goods", "rounds": 4}
EXAMPLE = REPO / "examples" / "public-goods.toml"


def pg_config(tmp_path, **sections):
    return small_config(tmp_path, game={**GAME, **sections.pop("game", {})}, **sections)


def test_a_scripted_run_plays_groups_of_four_with_their_own_feedback(dask_client, tmp_path):
    config = pg_config(tmp_path)
    result = run_simulation(config, client=dask_client, console=QUIET)
    summary = read_summary(config.run_dir)
    assert tuple(summary.columns) == SUMMARY_COLUMNS
    pd.testing.assert_frame_equal(summary, result.summary)
    assert (summary["n"] == 4).all() and len(summary) == 4 * 600 // 4
    rounds = read_rounds(config.run_dir)
    assert (rounds["status"] == "ok").all()
    assert rounds["guess"].between(0, 20).all() and (rounds["guess"] % 1 == 0).all()
    # Each group's row is its members' contributions; payoffs follow from them.
    totals = rounds.groupby(["round", "group_id"])["guess"].sum()
    by_group = summary.set_index(["round", "group_id"])
    np.testing.assert_array_equal(by_group["total_contribution"], totals.loc[by_group.index])
    merged = rounds.join(by_group["total_contribution"], on=["round", "group_id"])
    payoff = 20 - merged["guess"] + 0.4 * merged["total_contribution"]
    np.testing.assert_allclose(by_group["mean_payoff"],
                               payoff.groupby([merged["round"], merged["group_id"]]).mean()
                               .loc[by_group.index])
    # Contributions decay, as the scripted agents are calibrated to.
    pct = summary.groupby("round")["contribution_pct"].mean()
    assert pct.is_monotonic_decreasing and pct.iloc[0] > 30
    ledger = read_ledger(config.run_dir)
    first = ledger.round(0)
    assert first.numbers["contribution_pct"] == pytest.approx(pct.iloc[0])
    assert first.mean == pytest.approx(rounds.loc[rounds["round"] == 1, "guess"].mean())
    log = RunPaths(config.run_dir).log.read_text()
    assert "round 1/4: contribution" in log and "humans in period 1: 39.5%" in log


def test_cooperators_answer_their_own_groups_feedback(dask_client, tmp_path):
    """Agents whose group gave more last round give more this round: the feedback that
    reached them is their own group's."""
    config = pg_config(tmp_path, game={"rounds": 2})
    run_simulation(config, client=dask_client, console=QUIET)
    rounds = read_rounds(config.run_dir).sort_values(["round", "agent_id"])
    first = rounds[rounds["round"] == 1].set_index("agent_id")
    second = rounds[rounds["round"] == 2].set_index("agent_id")
    others = (first.groupby("group_id")["guess"].transform("sum") - first["guess"]) / 3
    cooperators = second["guess"] > 0
    assert np.corrcoef(others[cooperators], second.loc[cooperators, "guess"])[0, 1] > 0.5


def test_a_cancelled_run_resumes_to_the_same_results(dask_client, tmp_path):
    reference = pg_config(tmp_path / "ref")
    run_simulation(reference, client=dask_client, console=QUIET)
    config = pg_config(tmp_path / "cancel")
    with pytest.raises(RunCancelled):
        run_simulation(config, client=dask_client, console=QUIET,
                       observer=CancelAfterFirstRound(config.run_dir))
    assert 0 < read_ledger(config.run_dir).rounds_done < 4
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    pd.testing.assert_frame_equal(read_summary(config.run_dir), read_summary(reference.run_dir))
    pd.testing.assert_frame_equal(read_rounds(config.run_dir), read_rounds(reference.run_dir))


def test_a_population_that_does_not_divide_into_groups_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"game: population.size = 602 does not divide into "
                                          r"groups of game.group_size = 4.*600 or 604"):
        pg_config(tmp_path, population={"size": 602})
    line = one_error_line(simpipe_cli("validate", str(EXAMPLE), "--set",
                                      "population.size=1001"))
    assert "population.size = 1,001" in line and "1,000 or 1,004" in line


def test_a_key_of_the_other_game_is_named(tmp_path):
    line = one_error_line(simpipe_cli("validate", str(EXAMPLE), "--set", "game.ratio=0.5"))
    assert "game.ratio" in line and "a key of kind = 'beauty_contest'" in line


def test_the_example_runs_and_reports(tmp_path):
    out = tmp_path / "results"
    proc = simpipe_cli("run", str(EXAMPLE), "--set", f"run.output_dir='{out}'",
                       "--set", "population.size=2000", "--set", "game.rounds=3",
                       "--set", "cluster.dashboard_address=''")
    assert proc.returncode == 0, proc.stderr
    assert "round 3/3: contribution" in proc.stdout and "Nash equilibrium" in proc.stdout
    report = simpipe_cli("report", str(out / "public-goods"), "--quiet")
    assert report.returncode == 0, report.stderr
    human = pd.read_csv(out / "public-goods" / "report" / "tables" / "human_reference.csv")
    assert human["period"].tolist() == [1, 3] and human["human_pct"].tolist() == [39.5, 31.3]
    assert simpipe_cli("validate", str(REPO / "examples" / "public-goods-llm.toml")
                       ).returncode == 0


@pytest.mark.llm
@pytest.mark.slow
def test_the_llm_example_plays_with_the_embedded_model(tmp_path):
    """Two rounds of 8 agents with Gemma 3 270M: every answer a whole contribution in range
    (the grammar), two groups of 4 reduced per round."""
    out = tmp_path / "results"
    proc = simpipe_cli("run", str(REPO / "examples" / "public-goods-llm.toml"),
                       "--set", f"run.output_dir='{out}'", "--set", "population.size=8",
                       "--set", "population.partitions=1", "--set", "game.rounds=2",
                       "--set", "cluster.dashboard_address=''")
    assert proc.returncode == 0, proc.stderr
    rounds = read_rounds(out / "public-goods-llm")
    assert len(rounds) == 16 and (rounds["status"] == "ok").all()
    assert rounds["guess"].between(0, 20).all() and (rounds["guess"] % 1 == 0).all()
    summary = read_summary(out / "public-goods-llm")
    assert (summary["n"] == 4).all() and len(summary) == 4
    assert "round 2/2: contribution" in proc.stdout


@pytest.mark.parametrize("agents", [
    {"backend": "tgi"},
    {"backend": "openai"},
    {"backend": "openai", "openai": {"api": "chat"}},
], ids=["tgi", "openai-completions", "openai-chat"])
def test_http_back_ends_play_the_game_through_their_protocols(dask_client, tmp_path, agents):
    """A real server process speaking TGI's and the OpenAI protocol (the stub answers at
    once, a number matching the request's answer constraint): every contribution comes back
    over HTTP inside 0..endowment, so the game's constraint is what each back-end sent."""
    with StubProcess() as stub:
        backend = agents["backend"]
        settings = {**agents.get(backend, {}), "endpoints": [stub.url]}
        config = pg_config(tmp_path, game={"rounds": 2},
                           agents={**agents, backend: settings})
        run_simulation(config, client=dask_client, console=QUIET)
    rounds = read_rounds(config.run_dir)
    assert len(rounds) == 2 * 600 and (rounds["status"] == "ok").all()
    assert rounds["guess"].between(0, 20).all() and (rounds["guess"] % 1 == 0).all()
    # 0..100 answers (the beauty contest's range) would be out of range: the stub draws
    # uniformly, so a wrong constraint would show within 1,200 answers.
    assert rounds["guess"].nunique() > 10
    summary = read_summary(config.run_dir)
    totals = rounds.groupby(["round", "group_id"])["guess"].sum()
    by_group = summary.set_index(["round", "group_id"])
    np.testing.assert_array_equal(by_group["total_contribution"], totals.loc[by_group.index])
    counters = read_ledger(config.run_dir).endpoints[stub.url]
    assert counters["requests"] == 2 * 600
