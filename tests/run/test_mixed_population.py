"""Mixed populations: the back-end chosen per agent by a population attribute
(``[agents.by.<attribute>.<value>]``), checked, played in one game on a real cluster, split
by value in the round records and the report, resumable, its prompts shown per agent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simpipe.config.model import ConfigError
from simpipe.report.build import build_report
from simpipe.run.agent_prompt import PromptUnavailable, rebuild_prompt
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.stub import StubProcess
from simpipe.store.results import read_ledger, read_population, read_rounds

from support import REPO, one_error_line, simpipe_cli, small_config

QUIET = Console(quiet=True)
EXAMPLE = REPO / "examples" / "mixed-population.toml"
MODEL = {"model": {"values": {"rules": 1, "llm": 2}}}


def mixed_config(tmp_path, endpoint: str = "http://127.0.0.1:9", **agents):
    """600 agents, a third scripted and two thirds TGI (the stub at ``endpoint``)."""
    attributes = {"education": {"values": {"High School": 1, "Ph.D.": 1}}, **MODEL}
    return small_config(
        tmp_path, population={"attributes": attributes}, game={"rounds": 2},
        agents={"backend": "tgi", "tgi": {"endpoints": [endpoint]},
                "by": {"model": {"rules": {"backend": "scripted"},
                                 "llm": {"temperature": 0.7}}}, **agents})


@pytest.mark.parametrize("override,key,says", [
    ("agents.by.model.extra.backend=scripted", "agents.by.model", "not values of model"),
    ("population.attributes.model.values={scripted=1,x=1,y=1,\"gemma-t1.0\"=1,\"gemma-t0.3\"=1}",
     "agents.by.model", "no table for model = ['x', 'y']"),
    ("agents.by.education.x.backend=scripted", "agents.by", "one attribute chooses"),
    ("agents.by.model.scripted.temperature=-1", "agents.by.model.scripted.temperature = -1",
     "greater than or equal to 0"),
    ("agents.by.model.scripted.colour=1", "agents.by.model.scripted.colour", "unknown key"),
    ("agents.by.model.scripted.backend=magic", "agents.by.model.scripted.backend", "'tgi'"),
    ("agents.by.model.scripted.scripted.depth_shift.age={a=1}",
     "agents.by.model.scripted: agents.scripted.depth_shift.age", "no such attribute"),
    ('agents.by={colour={red={backend="scripted"}}}', "agents.by.colour",
     "add [population.attributes.colour]"),
    ("population.attributes.model={min=1,max=3}", "agents.by.model", "categorical"),
])
def test_a_bad_mix_is_one_line_naming_the_key(override, key, says):
    proc = simpipe_cli("validate", str(EXAMPLE), "--set", override)
    line = one_error_line(proc)
    assert key in line and says in line, line


def test_validate_prints_every_values_back_end():
    proc = simpipe_cli("validate", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert ("backend by model: scripted=scripted, gemma-t1.0=llamacpp, gemma-t0.3=llamacpp"
            in proc.stdout)
    assert "model = 'scripted': scripted (scripted (tau 1.5))" in proc.stdout
    assert "temperature = 0.3" in proc.stdout and "temperature = 1.0" in proc.stdout


def test_the_hash_follows_the_mix_not_its_servers(tmp_path):
    config = mixed_config(tmp_path)
    moved = mixed_config(tmp_path, endpoint="http://127.0.0.1:10",
                         by={"model": {"rules": {"backend": "scripted"},
                                       "llm": {"temperature": 0.7,
                                               "tgi": {"endpoints": ["http://h:1"]}}}})
    hotter = mixed_config(tmp_path, by={"model": {"rules": {"backend": "scripted"},
                                                  "llm": {"temperature": 0.9}}})
    assert config.results_hash() == moved.results_hash() != hotter.results_hash()
    plain = small_config(tmp_path)
    assert plain.results_hash() == small_config(tmp_path, agents={"by": {}}).results_hash()


def test_an_override_is_validated_against_the_config_files_shape(tmp_path):
    with pytest.raises(ConfigError, match=r"agents\.by\.model\.llm\.tgi\.endpoints"):
        mixed_config(tmp_path, by={"model": {"rules": {"backend": "scripted"},
                                             "llm": {"tgi": {"endpoints": "x"}}}})


def test_scripted_and_llm_agents_play_one_game_split_by_value(dask_client, tmp_path):
    """A third of the agents scripted, the rest over TGI (the stub): each answered by its
    own back-end, in agent order, in one game; the round records and the report split by
    ``model``; a resume replays nothing; ``show --prompt`` per agent."""
    with StubProcess() as stub:
        config = mixed_config(tmp_path, endpoint=stub.url)
        result = run_simulation(config, client=dask_client, console=QUIET)
        again = run_simulation(config, client=dask_client, console=QUIET, resume=True)
    rounds = read_rounds(config.run_dir).sort_values(["round", "agent_id"])
    population = read_population(config.run_dir).set_index("agent_id")
    model = population.loc[rounds["agent_id"], "model"].astype(str).to_numpy()
    assert (rounds["status"] == "ok").all() and len(rounds) == 2 * 600
    # Requests went out for the LLM agents only; scripted rows carry no tokens.
    assert (rounds.loc[model == "rules", "tokens_in"] == 0).all()
    assert (rounds.loc[model == "llm", "tokens_in"] > 0).all()
    ledger = read_ledger(config.run_dir)
    assert ledger.endpoints[stub.url]["requests"] == 2 * 400
    # The rows are each agent's own: per partition, in agent_id order.
    for _, part in rounds.groupby("round"):
        assert part["agent_id"].tolist() == list(range(600))
    for r in range(2):
        split = ledger.round(r).by
        assert split.attribute == "model"
        values = split.values
        assert list(values) == ["rules", "llm"]
        assert {v: values[v].n for v in values} == {"rules": 200, "llm": 400}
        this = rounds[rounds["round"] == r + 1]  # numbered from 1
        means = this.groupby(model[rounds["round"].to_numpy() == r + 1])["guess"].mean()
        for value in values:
            assert values[value].mean == pytest.approx(means[value], abs=1e-3)
            assert values[value].backend == {"rules": "scripted", "llm": "tgi"}[value]
    assert again.summary.equals(result.summary)  # resumed: nothing left to play

    llm_agent = int(np.flatnonzero(population["model"].astype(str) == "llm")[0])
    rule_agent = int(np.flatnonzero(population["model"].astype(str) == "rules")[0])
    shown = rebuild_prompt(config.run_dir, llm_agent, 1)
    assert "Round 2 of 2" in shown.text() and shown.tokens_in > 0
    with pytest.raises(PromptUnavailable, match=f"agent {rule_agent} is rule-based"):
        rebuild_prompt(config.run_dir, rule_agent, 0)

    build_report([config.run_dir], tmp_path / "report")
    by_model = pd.read_csv(tmp_path / "report" / "tables" / "by_model.csv")
    assert set(by_model["reaches_agents"]) == {"back-end"}
    assert sorted(set(by_model["level"])) == ["llm", "rules"]
    first = by_model[by_model["round"] == 1].set_index("level")["mean"]
    assert first["rules"] == pytest.approx(ledger.round(0).by.values["rules"].mean,
                                           abs=1e-3)
    runs = pd.read_csv(tmp_path / "report" / "tables" / "runs.csv")
    assert runs["backend"].iloc[0].startswith("by model: rules = scripted")


def test_two_llm_groups_each_reach_their_own_servers(dask_client, tmp_path):
    """Two LLM configurations in one run (two "models": each value's override names its own
    TGI server): each server answers exactly its group's agents, every round."""
    with StubProcess() as first, StubProcess() as second:
        config = mixed_config(tmp_path, endpoint=first.url, by={"model": {
            "rules": {"temperature": 0.2},
            "llm": {"temperature": 0.9, "tgi": {"endpoints": [second.url]}}}})
        run_simulation(config, client=dask_client, console=QUIET)
    ledger = read_ledger(config.run_dir)
    assert ledger.endpoints[first.url]["requests"] == 2 * 200
    assert ledger.endpoints[second.url]["requests"] == 2 * 400
    assert (read_rounds(config.run_dir)["status"] == "ok").all()


@pytest.mark.llm
@pytest.mark.slow
def test_the_example_mixes_scripted_and_embedded_llm_agents(tmp_path):
    """The example, small, with the real embedded model on a real LocalCluster: every agent
    answers, the scripted third with no tokens, the round lines split by model."""
    out = tmp_path / "results"
    proc = simpipe_cli("run", str(EXAMPLE), "--set", f"run.output_dir='{out}'",
                       "--set", "population.size=12", "--set", "population.partitions=1",
                       "--set", "game.rounds=2", "--set", "agents.share_answers=off",
                       "--set", "cluster.dashboard_address=''")
    assert proc.returncode == 0, proc.stderr
    run_dir = out / "mixed-population"
    rounds = read_rounds(run_dir)
    population = read_population(run_dir).set_index("agent_id")
    model = population.loc[rounds["agent_id"], "model"].astype(str).to_numpy()
    assert len(rounds) == 24 and (rounds["status"] == "ok").mean() > 0.9
    assert (rounds.loc[model == "scripted", "tokens_in"] == 0).all()
    assert (rounds.loc[model != "scripted", "tokens_in"] > 0).all()
    assert proc.stdout.count("mean by model: scripted") == 2
    split = read_ledger(run_dir).round(0).by.values
    assert {v: split[v].n for v in split} == {"scripted": 4, "gemma-t1.0": 4,
                                                 "gemma-t0.3": 4}
