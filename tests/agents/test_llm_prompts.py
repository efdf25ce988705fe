"""LLM agents' prompts for a partition: each distinct prompt rendered once, and every agent
still gets exactly the prompt it would get rendered alone (persona, own history, round)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simpipe.agents.base import Turn
from simpipe.agents.llm import distinct_prompts, prompting
from simpipe.answers.shared import prompt_key as _prompt_key
from simpipe.games.config import BeautyContestConfig as GameConfig
from simpipe.games.prompts import PromptBuilder
from simpipe.games.registry import game_for

GAME = GameConfig(rounds=4)


def partition(n: int, round_index: int, personas: bool, seed: int = 1):
    rng = np.random.default_rng(seed)
    agents = pd.DataFrame({"agent_id": np.arange(n)})
    if personas:
        agents["persona"] = rng.choice(["A nurse.", "A cook, 41.", "   ", "A pilot."], n)
    # invalid answers (NaN), -0.0 beside 0.0, and a winning number with many decimals
    guesses = rng.choice([10.0, 20.0, np.nan, -0.0, 0.0], (n, round_index))
    winning = rng.choice([33.3333, np.nan, 5.0], (n, round_index))
    return agents, Turn(game_for(GAME), 1, round_index, 0, winning,
                        guesses if round_index else None)


@pytest.mark.parametrize("style", ["completion", "chat"])
@pytest.mark.parametrize("round_index", [0, 1, 3])
@pytest.mark.parametrize("personas", [False, True])
def test_each_agent_gets_the_prompt_it_would_get_alone(style, round_index, personas):
    agents, turn = partition(3000, round_index, personas)
    codes, prompts = distinct_prompts(agents, turn, style)
    builder, _ = prompting(game_for(GAME), style)
    alone = builder.render_many(
        agents["persona"].tolist() if personas else [None] * len(agents),
        game_for(GAME).histories(turn.past_answers, turn.past_feedback), round_index)
    assert [prompts[c] for c in codes.tolist()] == alone
    # numbered in order of first appearance, one number per distinct text
    expected_codes, expected = pd.factorize(pd.Series([_prompt_key(p) for p in alone],
                                                      dtype=object))
    assert codes.tolist() == expected_codes.tolist()
    assert [_prompt_key(p) for p in prompts] == list(expected)


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """One entry per prompt the builder renders."""
    calls: list[int] = []
    render = PromptBuilder._render
    monkeypatch.setattr(PromptBuilder, "_render",
                        lambda self, *a: calls.append(1) or render(self, *a))
    return calls


def test_round_one_without_personas_is_one_prompt_rendered_once(renders):
    agents, turn = partition(5000, 0, personas=False)
    codes, prompts = distinct_prompts(agents, turn, "completion")
    assert len(prompts) == 1 and len(renders) == 1 and not codes.any()


def test_later_rounds_render_each_distinct_history_once(renders):
    agents, turn = partition(5000, 2, personas=True)
    turn.past_answers[turn.past_answers == 0] = 0.0  # no -0.0: each key renders its own text
    codes, prompts = distinct_prompts(agents, turn, "completion")
    assert len(renders) == len(prompts) <= 4 * 12**2  # personas x (guesses x winning)^rounds


def test_an_empty_partition_has_no_prompts():
    agents, turn = partition(0, 2, personas=False)
    codes, prompts = distinct_prompts(agents, turn, "completion")
    assert codes.size == 0 and prompts == []
