"""Prompt text: rules, variants, memory across rounds, shared prefix, both shapes."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest

from simpipe.agents.llm import requests_for
from simpipe.answers.shared import sharing_refusal
from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.beauty_contest.prompts import (
    COMPLETION_CUE,
    PREDICTION_CUE,
    RATIONAL_PLAYERS,
    HistoryItem,
    rule_text,
    rules_text,
)
from simpipe.games.beauty_contest.reference import load_references
from simpipe.games.config import BeautyContestConfig as GameConfig
from simpipe.games.prompts import PromptBuilder
from simpipe.games.registry import game_for
from simpipe.games.text import COT_CUE, fmt_number
from simpipe.inference.settings import SamplingSettings

PERSONA = "A 34-year-old economist from Lyon."
HISTORY = [HistoryItem(0, 50.0, 33.33), HistoryItem(1, 30.5, 22.22)]


def completion(**game: object) -> PromptBuilder:
    return PromptBuilder(GameConfig(**game), "completion")


def test_round_0_has_no_history() -> None:
    for layout in ("split", "by_round"):
        text = completion(history_layout=layout).render(PERSONA, [], 0)
        assert "earlier rounds" not in text and "Winning" not in text
        assert "winning number was" not in text
        assert "Round 1 of 3." in text


def test_split_layout_shows_announced_numbers_then_the_round_then_own_numbers() -> None:
    text = completion().render(PERSONA, HISTORY, 2)
    told = text.index("Winning numbers of rounds 1 to 2: 33.33, 22.22.")
    own = text.index("Your numbers in rounds 1 to 2: 50, 30.5.")
    assert text.index(PERSONA) < told < text.index("Round 3 of 3.") < own
    assert text.endswith(f"Your numbers in rounds 1 to 2: 50, 30.5.\n{COMPLETION_CUE}")
    one = completion().render(None, HISTORY[:1], 1)
    assert "Winning number of round 1: 33.33." in one and "Your number in round 1: 50." in one


def test_split_layout_agents_differ_only_in_their_own_line() -> None:
    # What makes a distinct prompt cheap: two agents of one persona whose first answers
    # differ share the whole prompt up to their own numbers.
    builder = completion()
    a = builder.render(PERSONA, [HistoryItem(0, 11.0, 33.0), HistoryItem(1, 20.0, 25.0)], 2)
    b = builder.render(PERSONA, [HistoryItem(0, 77.0, 33.0), HistoryItem(1, 20.0, 25.0)], 2)
    shared = os.path.commonprefix([a, b])
    assert shared.endswith("Round 3 of 3.\nYour numbers in rounds 1 to 2: ")
    assert len(a) - len(shared) <= len(" 11, 20.\nMy number:")


def test_round_2_lists_both_answers_and_winning_numbers_in_order() -> None:
    text = completion(history_layout="by_round").render(PERSONA, HISTORY, 2)
    first = text.index("Round 1: you chose 50; the winning number was 33.33.")
    second = text.index("Round 2: you chose 30.5; the winning number was 22.22.")
    assert first < second < text.index("Round 3 of 3.")


def test_invalid_earlier_answer_is_shown_as_such() -> None:
    text = completion(history_layout="by_round").render(None, [HistoryItem(0, None, 40.0)], 1)
    assert "Round 1: your answer was invalid; the winning number was 40." in text
    text = completion().render(None, [HistoryItem(0, None, 40.0), HistoryItem(1, 9.0, None)], 2)
    assert "Winning numbers of rounds 1 to 2: 40, none announced." in text
    assert "Your numbers in rounds 1 to 2: invalid, 9." in text


@pytest.mark.parametrize("layout", ["split", "by_round"])
def test_agents_see_only_their_own_history(layout: str) -> None:
    builder = completion(history_layout=layout)
    a = builder.render(PERSONA, [HistoryItem(0, 11.0, 33.0)], 1)
    b = builder.render(PERSONA, [HistoryItem(0, 77.0, 33.0)], 1)
    assert "11" in a and "77" not in a
    assert "77" in b and "11" not in b


def test_variant_disclosure_only_when_set() -> None:
    assert "variation" not in completion().render(None, [], 0)
    text = completion(ratio="1/2", offset=5, disclose_variant=True).render(None, [], 0)
    assert 'variation of the well-known game "guess 2/3 of the average"' in text
    assert text.count("5 + 1/2 * the average") == 2  # the rule and the variant note


def test_cot_has_the_marker_instruction_and_basic_does_not() -> None:
    cot = completion(prompt="cot").render(PERSONA, HISTORY, 2)
    basic = completion(prompt="basic").render(PERSONA, HISTORY, 2)
    assert f'"{ANSWER_MARKER}"' in cot and "step by step" in cot
    assert cot.endswith(COT_CUE)
    assert ANSWER_MARKER not in basic and "step by step" not in basic
    assert basic.endswith(COMPLETION_CUE)


@pytest.mark.parametrize("ratio", ["2/3", "0.51", "51/100", "4/3"])
def test_ratio_text_exactly_as_configured(ratio: str) -> None:
    game = GameConfig(ratio=ratio)
    assert rule_text(game) == f"{ratio} of the average of all chosen numbers"
    assert f"The target is {ratio} of the average" in rules_text(game)


def test_float_ratio_from_toml_keeps_its_text() -> None:
    assert rule_text(GameConfig(ratio=0.51)).startswith("0.51 of the average")


def test_offset_variant_text() -> None:
    game = GameConfig(ratio="1/2", offset=5)
    assert rule_text(game) == "5 + 1/2 * the average of all chosen numbers"


def test_clipping_note_only_when_the_target_can_leave_the_range() -> None:
    assert "nearest end" not in rules_text(GameConfig(ratio="2/3"))
    assert "nearest end" in rules_text(GameConfig(ratio="4/3"))


def test_range_appears_in_rules() -> None:
    assert "between 10 and 55.5 (inclusive)" in rules_text(GameConfig(low=10, high=55.5))


@pytest.mark.parametrize("prompt", ["basic", "cot"])
def test_shared_prefix_across_agents_and_rounds(prompt: str) -> None:
    builder = completion(prompt=prompt)
    prompts = [
        builder.render("An artist.", [], 0),
        builder.render("A professor of game theory.", [], 0),
        builder.render("An artist.", HISTORY, 2),
        builder.render(None, HISTORY[:1], 1),
    ]
    common = os.path.commonprefix(prompts)
    assert common == builder.prefix
    assert builder.rules in common and builder.instruction in common
    # Round by round, an agent's round r extends its round r-1 up to the round line.
    by_round = completion(prompt=prompt, history_layout="by_round")
    r1 = by_round.render("An artist.", HISTORY[:1], 1)
    r2 = by_round.render("An artist.", HISTORY, 2)
    assert r2.startswith(r1[: r1.index("Round 2 of 3.")].removesuffix("\n"))


def test_chat_shape_is_system_then_user() -> None:
    builder = PromptBuilder(GameConfig(prompt="cot"), "chat")
    messages = builder.render(PERSONA, HISTORY, 2)
    assert isinstance(messages, tuple) and [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    assert system.startswith(builder.rules) and ANSWER_MARKER in system
    assert PERSONA not in system and "33.33" not in system
    assert user.index(PERSONA) < user.index("33.33") < user.index("Round 3 of 3.")
    assert user.endswith(builder.instruction)
    other = builder.render("Someone else.", [], 0)
    assert other[0] == messages[0]


def test_render_many_matches_render() -> None:
    builder = completion()
    personas = ["a", None, "c"]
    histories = [HISTORY, [], HISTORY[:1]]
    assert builder.render_many(personas, histories, 2) == [
        builder.render(p, h, 2) for p, h in zip(personas, histories, strict=True)
    ]
    assert builder.render_many(personas, None, 0) == [builder.render(p, [], 0) for p in personas]
    with pytest.raises(ValueError):
        builder.render_many(personas, histories[:2], 2)


def test_blank_persona_is_left_out() -> None:
    builder = completion()
    assert builder.render("  ", [], 0) == builder.render(None, [], 0)
    assert "About you" not in builder.render("", [], 0)


def test_bad_style_raises() -> None:
    with pytest.raises(ValueError, match="style"):
        PromptBuilder(GameConfig(), "json")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("x", "text"), [(5.0, "5"), (33.3333, "33.33"), (-0.0, "0"), (0.5, "0.5"), (100.0, "100")]
)
def test_fmt_number(x: float, text: str) -> None:
    assert fmt_number(x) == text


def test_rational_players_sentence_only_when_set() -> None:
    assert RATIONAL_PLAYERS not in completion().render(None, [], 0)
    builder = completion(rational_players=True)
    assert RATIONAL_PLAYERS in builder.rules  # shared by every agent and round
    chat = PromptBuilder(GameConfig(rational_players=True), "chat").render(PERSONA, [], 0)
    assert RATIONAL_PLAYERS in chat[0]["content"]


@pytest.mark.parametrize("prompt", ["basic", "cot"])
def test_predict_others_asks_for_the_prediction_then_the_marked_number(prompt: str) -> None:
    game = GameConfig(prompt=prompt, predict_others=True)
    text = PromptBuilder(game, "completion").render(PERSONA, HISTORY, 2)
    ask = "prediction of the average of the other players' numbers"
    assert ask in text and f'then write "{ANSWER_MARKER}" followed by your number' in text
    assert text.index(ask) < text.index(ANSWER_MARKER)
    assert text.endswith(PREDICTION_CUE if prompt == "basic" else COT_CUE)
    assert "Reply with your number only" not in text
    assert game.free_text_answer


@pytest.mark.parametrize("prompt", ["basic", "cot"])
def test_predict_others_answer_is_one_number_after_the_marker(prompt: str) -> None:
    answer = game_for(GameConfig(prompt=prompt, predict_others=True)).answer()
    assert answer.cot and ANSWER_MARKER in answer.grammar()
    assert re.fullmatch(answer.regex(), " 40\nFinal answer: 27")
    assert not re.fullmatch(answer.regex(), " 40")  # the prediction alone is no answer
    values, statuses = answer.parse_many(["40\nFinal answer: 27", "40\nFinal answer: 140"])
    assert values[0] == 27 and list(statuses) == ["ok", "out_of_range"]


def test_without_options_the_answer_stays_the_bare_number() -> None:
    game = GameConfig()
    assert not game.free_text_answer and not game_for(game).answer().cot
    assert completion().render(None, [], 0).endswith(COMPLETION_CUE)


def test_predict_others_gets_the_reasoning_token_budget_and_no_shared_answers() -> None:
    game = GameConfig(predict_others=True)
    sampling = SamplingSettings(max_tokens=6, cot_max_tokens=200)
    (request,) = requests_for(["p"], np.arange(1), game_for(game), sampling)
    assert request.max_tokens == 200
    (plain,) = requests_for(["p"], np.arange(1), game_for(GameConfig()), sampling)
    assert plain.max_tokens == 6
    assert "predict_others" in sharing_refusal("auto", game, "llamacpp", True, "completion")


def test_prompt_options_are_named_in_the_description() -> None:
    game = game_for(GameConfig(prompt="cot", rational_players=True, predict_others=True))
    assert game.variant() == "ratio 2/3, cot, rational players, predict others"
    assert "prompt cot, rational players, predict others" in game.describe()
    assert game_for(GameConfig()).variant() == "ratio 2/3, basic"


def test_the_paper_s_numbers_are_not_set_beside_a_prompt_option() -> None:
    rounds = pd.DataFrame({"n": [100], "n_valid": [100], "mean": [36.0], "target": [24.0]})
    plain = game_for(GameConfig())._paper_table("plain", rounds, load_references())
    assert plain.records
    varied = game_for(GameConfig(rational_players=True))
    table = varied._paper_table("rational", rounds, load_references())
    assert not table.records and "basic, rational players" in table.notes[0]


def test_a_run_with_many_invalid_answers_is_not_set_beside_published_numbers() -> None:
    # The CoT run that looked like a result: 98 of 100 answers cut at the token limit.
    game = game_for(GameConfig(prompt="cot"))
    cut = pd.DataFrame({"round": [0], "n": [100], "n_valid": [2], "n_truncated": [98],
                        "n_no_final_answer": [0], "mean": [15.6], "median": [15.0],
                        "target": [10.4]})
    paper, human = (game._paper_table("cot", cut, load_references()),
                    game._human_table("cot", cut, load_references()))
    for table in (paper, human):
        assert not table.records
        assert "98 of its 100 answers (98%) are not valid (98 truncated)" in table.notes[0]
        assert "agents.cot_max_tokens" in table.notes[0]
    # At most 5% invalid: compared.
    few = cut.assign(n_valid=95, n_truncated=5)
    assert game._paper_table("cot", few, load_references()).records
