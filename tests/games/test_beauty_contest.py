import numpy as np
import pandas as pd
import pytest

from simpipe.games.beauty_contest.environment import (
    Partial,
    equilibrium,
    partial_from_rows,
    reduce_round,
    target_of,
)
from simpipe.games.config import BeautyContestConfig as GameConfig


def rows(guesses, groups=None, status=None):
    n = len(guesses)
    return pd.DataFrame({
        "group_id": groups if groups is not None else [0] * n,
        "guess": guesses,
        "status": status if status is not None else ["ok"] * n,
    })


def summary_of(frame, game, parts=1):
    chunks = np.array_split(np.arange(len(frame)), parts)
    partial = Partial.concat([partial_from_rows(frame.iloc[c]) for c in chunks])
    return reduce_round(partial, game, 0)


def test_target_is_offset_plus_ratio_times_mean_clipped():
    assert target_of(60.0, GameConfig()) == pytest.approx(40.0)
    assert target_of(60.0, GameConfig(ratio="1/2", offset=5)) == pytest.approx(35.0)
    assert target_of(90.0, GameConfig(ratio="4/3")) == 100.0  # 120 clipped to high
    assert target_of(10.0, GameConfig(ratio="1/2", offset=-20)) == 0.0  # -15 clipped to low
    assert target_of(50.0, GameConfig(ratio="51/100")) == pytest.approx(25.5)


def test_equilibria():
    assert equilibrium(GameConfig()) == 0
    assert equilibrium(GameConfig(ratio="1/2", offset=5)) == pytest.approx(10)
    assert equilibrium(GameConfig(ratio="4/3")) == 100


def test_hand_computed_round():
    # mean 30, median 25, target 20: the 20 wins alone
    s = summary_of(rows([10, 20, 30, 40, 50, 30]), GameConfig())
    row = s.iloc[0]
    assert (row["n"], row["n_valid"]) == (6, 6)
    assert row["mean"] == pytest.approx(30.0)
    assert row["median"] == pytest.approx(30.0)
    assert row["target"] == pytest.approx(20.0)
    assert row["winning_guess"] == 20 and row["n_winners"] == 1


def test_even_count_median_and_split_partitions_agree():
    frame = rows([1, 2, 3, 4, 100, 7, 7, 9])
    one = summary_of(frame, GameConfig())
    three = summary_of(frame, GameConfig(), parts=3)
    pd.testing.assert_frame_equal(one, three)
    assert one.iloc[0]["median"] == pytest.approx(5.5)


def test_ties_same_value_and_equidistant_values():
    # mean 30 -> target 20; two agents said 20
    s = summary_of(rows([20, 20, 50]), GameConfig())
    assert s.iloc[0]["n_winners"] == 2 and s.iloc[0]["winning_guess"] == 20
    # mean 45 -> target 30: 29 and 31 are equally close; both win, the lower is reported
    s = summary_of(rows([29, 31, 75]), GameConfig())
    assert s.iloc[0]["target"] == pytest.approx(30.0)
    assert s.iloc[0]["n_winners"] == 2 and s.iloc[0]["winning_guess"] == 29


def test_invalid_answers_never_enter_the_mean():
    frame = rows([30, 60, 0, 0], status=["ok", "ok", "unparsed", "error"])
    frame.loc[2:, "guess"] = np.nan
    row = summary_of(frame, GameConfig()).iloc[0]
    assert (row["n"], row["n_valid"], row["n_unparsed"], row["n_error"]) == (4, 2, 1, 1)
    assert row["mean"] == pytest.approx(45.0)


def test_groups_are_reduced_separately_and_an_all_invalid_group_has_no_target():
    frame = rows([10, 20, 90, 0], groups=[0, 0, 1, 2], status=["ok", "ok", "ok", "unparsed"])
    s = summary_of(frame, GameConfig(ratio="1/2", offset=5)).set_index("group_id")
    assert s.loc[0, "target"] == pytest.approx(5 + 0.5 * 15)
    assert s.loc[1, "target"] == pytest.approx(50.0)
    assert np.isnan(s.loc[2, "target"]) and s.loc[2, "n_winners"] == 0
    assert list(s.index) == [0, 1, 2]
