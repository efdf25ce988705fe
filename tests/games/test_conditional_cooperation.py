"""The public goods game's scripted agents against the human data they are calibrated to.

A statistical claim, checked at fixed seeds: 10,000 agents in groups of 4 (endowment 20,
MPCR 0.4) played through the game interface as the round loop plays them (partitions,
partials, the reduce, the feedback table) stay within TOLERANCE percentage points of
Fischbacher & Gaechter (2010)'s mean contribution in each of the 10 periods.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simpipe.games.base import ScriptedSettings, Turn
from simpipe.games.config import PublicGoodsConfig
from simpipe.games.groups import assign_groups
from simpipe.games.public_goods.conditional_cooperation import CooperationParams, agent_types
from simpipe.games.registry import game_for

TOLERANCE = 3.0  # percentage points of the endowment, every period
UNUSED = ScriptedSettings()  # the beauty contest's knobs: not read here


def play(game_config: PublicGoodsConfig, n: int, seed: int, partitions: int = 4):
    """Every round's contributions (agents, rounds) and summaries, as the pipeline plays."""
    game = game_for(game_config)
    groups = assign_groups(n, game_config.group_size, seed)
    n_groups = int(groups.max()) + 1
    bounds = np.array_split(np.arange(n), partitions)
    own = np.empty((n, 0))
    summary = pd.DataFrame()
    for r in range(game_config.rounds):
        feedback = game.feedback_table(summary, n_groups, r)
        answers, partials = [], []
        for k, ids in enumerate(bounds):
            turn = Turn(game, seed, r, k, feedback[groups[ids]],
                        own[ids] if r else None)
            agents = pd.DataFrame({"agent_id": ids})
            c = game.scripted_answers(agents, turn, UNUSED)
            answers.append(c)
            partials.append(game.partial(pd.DataFrame(
                {"group_id": groups[ids], "guess": c, "status": "ok"})))
        own = np.column_stack([own, np.concatenate(answers)])
        summary = pd.concat([summary, game.reduce(partials, r)], ignore_index=True)
    return own, summary


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_period_means_follow_the_human_data(seed: int) -> None:
    game = PublicGoodsConfig()
    own, summary = play(game, 10_000, seed)
    pct = game_for(game).summary_by_round(summary)["contribution_pct"].to_numpy()
    human = np.array(game_for(game).human_reference().by_round)
    assert pct.shape == human.shape == (10,)
    np.testing.assert_allclose(pct, 100 * own.mean(axis=0) / 20)  # summary == the rows
    assert np.abs(pct - human).max() <= TOLERANCE, np.round(pct - human, 2)
    assert pct[-1] < pct[0] - 20  # contributions decay, as they do with people


def test_contributions_are_whole_points_and_free_riders_give_nothing() -> None:
    own, _ = play(PublicGoodsConfig(rounds=4), 2000, seed=7, partitions=1)
    assert np.array_equal(own, np.round(own)) and own.min() >= 0 and own.max() <= 20
    free_rider, _ = agent_types(7, 0, 2000, CooperationParams())
    assert (own[free_rider] == 0).all()
    assert 0.2 < free_rider.mean() < 0.3 and own[~free_rider, 0].mean() > 8


def test_the_same_seed_gives_the_same_game_and_another_seed_another() -> None:
    a, summary_a = play(PublicGoodsConfig(rounds=3), 800, seed=11)
    b, summary_b = play(PublicGoodsConfig(rounds=3), 800, seed=11)
    c, _ = play(PublicGoodsConfig(rounds=3), 800, seed=12)
    assert np.array_equal(a, b)
    pd.testing.assert_frame_equal(summary_a, summary_b)
    assert not np.array_equal(a, c)


def test_cooperators_answer_what_their_own_group_gave() -> None:
    """Two groups that gave everything and nothing last round: the cooperators of the first
    give much more in the next round than those of the second."""
    game = PublicGoodsConfig(rounds=2)
    n = 4000
    groups = np.arange(n) // 4
    rich = groups % 2 == 0
    totals = np.where(rich, 80.0, 0.0)[:, None]
    own = np.where(rich, 20.0, 0.0)[:, None]
    turn = Turn(game_for(game), 3, 1, 0, totals, own)
    c = game_for(game).scripted_answers(pd.DataFrame({"agent_id": np.arange(n)}), turn, UNUSED)
    free_rider, _ = agent_types(3, 0, n, CooperationParams())
    assert c[rich & ~free_rider].mean() > 12 and c[~rich & ~free_rider].mean() < 8
