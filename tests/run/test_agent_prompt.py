"""See the treatment: the exact prompt of any agent and round, rebuilt from a run's files
(``simpipe show --prompt``; the UI's route: tests/ui/test_ui_prompt.py), and
``simpipe validate``'s resolved settings.

Exactness is checked against what a real server received: the stub answers each request
with a number that is a hash of (seed, prompt), and counts len(prompt) // 4 prompt tokens,
so a rebuilt prompt that differs from the sent one by a single character gives another
number (or token count) than the run stored."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpipe.agents.llm import agent_seeds
from simpipe.cli.settings import resolved_settings
from simpipe.games.registry import game_for
from simpipe.run.agent_prompt import PromptUnavailable, rebuild_prompt
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.contract import answer_number, prompt_tokens
from simpipe.servers.stub import StubProcess
from simpipe.store.results import read_rounds

from support import one_error_line, simpipe_cli, small_config

QUIET = Console(quiet=True)
PERSONAS = {"size": 60, "partitions": 3,
            "persona": {"mode": "template",
                        "template": "You are {age} and your education is {education}."}}


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("prompts")
    with StubProcess() as stub:
        config = small_config(root, run={"name": "stubbed"}, population=PERSONAS,
                              game={"rounds": 3, "group_size": 6},
                              agents={"backend": "tgi", "tgi": {"endpoints": [stub.url]}})
        run_simulation(config, client=dask_client, console=QUIET)
    return config


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory, dask_client):
    config = small_config(tmp_path_factory.mktemp("scripted"), run={"name": "rules"},
                          population={"size": 40, "partitions": 2}, game={"rounds": 1})
    run_simulation(config, client=dask_client, console=QUIET)
    return config


def test_a_rebuilt_prompt_is_the_one_the_server_got(llm_run):
    rows = read_rounds(llm_run.run_dir).set_index(["round", "agent_id"])
    regex = game_for(llm_run.game).answer().regex()
    checked = 0
    for r in range(3):
        for agent in (0, 7, 19, 20, 41, 59):  # every partition, first and last agents
            shown = rebuild_prompt(llm_run.run_dir, agent, r)
            stored = rows.loc[(r + 1, agent)]  # rounds numbered from 1 in the files
            seed = int(agent_seeds(llm_run.run.seed, r, np.array([agent]))[0])
            assert answer_number(seed, shown.prompt, regex) == stored["raw"], (r, agent)
            assert shown.tokens_in == prompt_tokens(shown.prompt) == stored["tokens_in"]
            assert shown.group_id == stored["group_id"] and shown.style == "completion"
            checked += 1
    assert checked == 18
    late = rebuild_prompt(llm_run.run_dir, 7, 2)
    assert "About you: You are" in late.prompt and "Round 3 of 3." in late.prompt
    assert "Winning numbers of rounds 1 to 2: " in late.prompt
    assert "Your numbers in rounds 1 to 2: " in late.prompt


def test_show_prints_the_prompt_of_an_agent_and_round(llm_run):
    proc = simpipe_cli("show", str(llm_run.run_dir), "--prompt", "7", "--round", "2")
    assert proc.returncode == 0, proc.stderr
    header, text = proc.stdout.split("\n", 1)
    assert header.startswith("# agent 7, round 2 of 3 (group ")
    assert "completion prompt, tokens_in" in header
    assert text.rstrip("\n") == rebuild_prompt(llm_run.run_dir, 7, 1).prompt


@pytest.mark.parametrize(("args", "message"), [
    (("--prompt", "60"), "agent 60: the run has agents 0 to 59"),
    (("--prompt", "0", "--round", "4"), "round 4: the run has rounds 1 to 3"),
    (("--round", "2"), "--round goes with --prompt AGENT_ID"),
])
def test_show_prompt_refuses_what_the_run_does_not_have(llm_run, args, message):
    assert message in one_error_line(simpipe_cli("show", str(llm_run.run_dir), *args))


def test_rule_based_agents_have_no_prompt(scripted_run):
    line = one_error_line(simpipe_cli("show", str(scripted_run.run_dir), "--prompt", "0"))
    assert "rule-based" in line and "they get no prompt" in line


def test_a_later_round_needs_the_earlier_rounds(llm_run, tmp_path):
    ledger = json.loads((llm_run.run_dir / "run.json").read_text())
    ledger["rounds"]["2"]["complete"] = False  # run.json's keys number rounds from 1
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "run.json").write_text(json.dumps(ledger))
    with pytest.raises(PromptUnavailable, match="round 2 has not finished"):
        rebuild_prompt(copy, 0, 2)


def test_validate_prints_the_resolved_settings_and_agent_0s_first_prompt(llm_run):
    text = resolved_settings(llm_run)
    for line in ("game:", "prompt:      basic", "back-end:    tgi", "population:  60 agents",
                 "cluster:     ", "prompt of agent 0, round 1"):
        assert line in text, line
    assert "template 'You are {age} and your education is {education}.'" in text
    # The example is the prompt agent 0 got: the same persona, rules and cue.
    example = text.split("---\n", 1)[1].rsplit("\n---", 1)[0]
    assert example == rebuild_prompt(llm_run.run_dir, 0, 0).prompt


def test_validate_on_the_command_line_says_rule_based_agents_get_no_prompt():
    proc = simpipe_cli("validate", "examples/scripted.toml")
    assert proc.returncode == 0, proc.stderr
    assert "back-end:    scripted" in proc.stdout
    assert "prompt of agent 0, round 1: none (rule-based agents get no prompt)" in proc.stdout

