"""The linear public goods game: payoffs, the exact reduce, what agents are told."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from simpipe.games.config import PublicGoodsConfig
from simpipe.games.prompts import PromptBuilder
from simpipe.games.public_goods.environment import SUMMARY_COLUMNS, payoffs
from simpipe.games.public_goods.prompts import ContributionItem, history_line
from simpipe.games.registry import game_for

GAME = PublicGoodsConfig()


def rows(contributions, groups, status=None) -> pd.DataFrame:
    n = len(contributions)
    status = status or ["ok"] * n
    guess = [c if s == "ok" else np.nan for c, s in zip(contributions, status, strict=True)]
    return pd.DataFrame({"group_id": groups, "guess": guess, "status": status})


def summary_of(frame: pd.DataFrame, game=GAME, parts: int = 1) -> pd.DataFrame:
    g = game_for(game)
    chunks = np.array_split(np.arange(len(frame)), parts)
    return g.reduce([g.partial(frame.iloc[c]) for c in chunks], 0)


def test_payoff_is_kept_points_plus_the_share_of_the_project() -> None:
    # group of 4 gives 8 + 10 + 18 + 0 = 36: each earns 0.4 * 36 = 14.4 from the project
    assert payoffs(np.array([8.0, 0.0]), np.array([36.0, 36.0]), GAME).tolist() == [
        pytest.approx(26.4), pytest.approx(34.4)]
    assert payoffs(np.array([np.nan]), np.array([28.0]), GAME)[0] == pytest.approx(31.2)


def test_hand_computed_groups() -> None:
    s = summary_of(rows([8, 10, 18, 0, 20, 20, 20, 20], [0, 0, 0, 0, 1, 1, 1, 1]))
    assert tuple(s.columns) == SUMMARY_COLUMNS
    g0, g1 = s.iloc[0], s.iloc[1]
    assert (g0["n"], g0["n_valid"], g0["total_contribution"]) == (4, 4, 36.0)
    assert g0["mean_contribution"] == 9.0 and g0["contribution_pct"] == 45.0
    assert g0["mean_payoff"] == pytest.approx(20 - 9 + 0.4 * 36)  # 25.4
    assert g1["total_contribution"] == 80 and g1["mean_payoff"] == pytest.approx(32.0)


def test_an_invalid_answer_contributes_0_and_is_counted() -> None:
    frame = rows([8, 99, 12, 0], [0, 0, 0, 0], status=["ok", "out_of_range", "ok", "error"])
    row = summary_of(frame).iloc[0]
    assert (row["n"], row["n_valid"], row["n_out_of_range"], row["n_error"]) == (4, 2, 1, 1)
    assert row["total_contribution"] == 20 and row["mean_contribution"] == 5.0
    assert row["mean_payoff"] == pytest.approx(20 - 5 + 0.4 * 20)


def test_a_group_without_a_valid_answer_keeps_its_endowment() -> None:
    row = summary_of(rows([0, 0], [3, 3], status=["unparsed", "error"])).iloc[0]
    assert row["group_id"] == 3 and row["total_contribution"] == 0
    assert row["mean_payoff"] == 20.0


def test_the_reduce_does_not_depend_on_how_agents_are_split_into_partitions() -> None:
    rng = np.random.default_rng(5)
    n = 4000
    frame = rows(rng.integers(0, 21, n).astype(float).tolist(),
                 rng.permutation(n) % (n // 4),
                 status=rng.choice(["ok", "ok", "ok", "unparsed"], n).tolist())
    one = summary_of(frame)
    pd.testing.assert_frame_equal(one, summary_of(frame, parts=7))
    assert one["n"].sum() == n and len(one) == n // 4


def test_feedback_is_each_groups_total_contribution() -> None:
    game = game_for(GAME)
    summary = summary_of(rows([8, 10, 18, 0, 20, 20, 20, 20], [0, 0, 0, 0, 1, 1, 1, 1]))
    table = game.feedback_table(summary, 2, 1)
    assert table.tolist() == [[36.0], [80.0]]


def test_the_history_line_says_contribution_total_and_payoff() -> None:
    line = history_line(ContributionItem(1, 8.0, 36.0, 26.4))
    assert line == ("Round 2: you contributed 8; your group contributed 36 in total; "
                    "your payoff was 26.40.")
    assert history_line(ContributionItem(0, None, 28.0, 31.2)) == (
        "Round 1: your answer was invalid and counted as contributing 0; your group "
        "contributed 28 in total; your payoff was 31.20.")


def test_agents_see_their_own_contributions_and_payoffs_in_order() -> None:
    game = game_for(GAME)
    own = np.array([[8.0, np.nan], [20.0, 0.0]])
    totals = np.array([[36.0, 28.0], [36.0, 28.0]])
    builder = PromptBuilder(GAME, "completion")
    first, second = (builder.render(None, h, 2) for h in game.histories(own, totals))
    lines = ["Round 1: you contributed 8; your group contributed 36 in total; "
             "your payoff was 26.40.",
             "Round 2: your answer was invalid and counted as contributing 0; your group "
             "contributed 28 in total; your payoff was 31.20.",
             "Round 3 of 10."]
    assert [first.index(line) for line in lines] == sorted(first.index(line) for line in lines)
    assert ("Round 1: you contributed 20; your group contributed 36 in total; your payoff "
            "was 14.40.") in second
    assert "you contributed 8" not in second
    assert game.histories(None, totals) is None


def test_rules_state_the_design_and_the_cue_asks_for_a_contribution() -> None:
    game = PublicGoodsConfig(group_size=5, endowment=10, mpcr=0.3, rounds=6)
    text = PromptBuilder(game, "completion").render(None, [], 0)
    assert "a group of 5 players" in text and "receives 10 points" in text
    assert "from 0 to 10" in text and "by 1.5 and shares it" in text
    assert "earns 0.3 points for each point" in text and "lasts 6 rounds" in text
    assert text.endswith("Round 1 of 6.\nMy contribution:")
    cot = PromptBuilder(PublicGoodsConfig(prompt="cot"), "completion").render(None, [], 0)
    assert 'then write "Final answer:" followed by your contribution.' in cot


def test_answers_are_whole_points_from_0_to_the_endowment() -> None:
    answer = game_for(GAME).answer()
    values, statuses = answer.parse_many([" 7", "20", "21", "7.5", "-1", "none"])
    assert statuses.tolist() == ["ok", "ok", "out_of_range", "out_of_range", "out_of_range",
                                 "unparsed"]
    assert values[:2].tolist() == [7.0, 20.0] and np.isnan(values[2:]).all()
    assert answer.language().is_complete(" 20") and not answer.language().is_prefix(" 21")
    assert answer.json_schema()["properties"]["number"] == {
        "type": "integer", "minimum": 0, "maximum": 20}


def test_a_population_must_divide_into_whole_groups() -> None:
    game = game_for(GAME)
    assert game.population_problem(1000) is None
    problem = game.population_problem(1002)
    assert "population.size = 1,002" in problem and "game.group_size = 4" in problem
    assert "1,000 or 1,004" in problem
    assert "smaller than game.group_size" in game.population_problem(3)


def test_the_round_line_reads_contributions_beside_the_human_data() -> None:
    game = game_for(GAME)
    summary = summary_of(rows([8, 10, 18, 0, 20, 20, 20, 20], [0, 0, 0, 0, 1, 1, 1, 1]))
    numbers = game.round_numbers(summary)
    assert numbers["mean"] == 14.5 and numbers["contribution_pct"] == 72.5
    assert game.round_text(summary, numbers) == "contribution 14.50 of 20 (72.5%)  payoff 28.70"
    assert game.reference_text(2) == "Nash equilibrium: contribute 0; humans in period 3: 31.3%"
    assert game.reference_text(10) == "Nash equilibrium: contribute 0"
    other = game_for(PublicGoodsConfig(mpcr=0.5))
    assert other.human_reference() is None and other.round_chart().reference is None


def test_a_chain_of_thought_answer_ends_in_the_marked_contribution() -> None:
    answer = game_for(PublicGoodsConfig(prompt="cot")).answer()
    text = "The others gave 30 last round, so about 10 each. Final answer: 9"
    assert re.fullmatch(answer.regex(), text)
    assert not re.fullmatch(answer.regex(), "Final answer: 21")
    assert 'root ::= r0 "Final answer:"' in answer.grammar()
    values, statuses = answer.parse_many([text, "I keep everything. Final answer: 0"])
    assert values.tolist() == [9.0, 0.0] and statuses.tolist() == ["ok", "ok"]
    assert answer.json_schema() is None
