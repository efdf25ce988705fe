from itertools import pairwise

import numpy as np

from simpipe.games.beauty_contest.environment import target_of
from simpipe.games.beauty_contest.level_k import (
    TAU,
    HierarchyParams,
    hierarchy_guesses,
    mean_behind,
)
from simpipe.games.config import BeautyContestConfig as GameConfig


def play(game, rounds, n=20000, tau=TAU, shift=0.0, seed=0, growth=None):
    rng = np.random.default_rng(seed)
    params = HierarchyParams(tau=tau) if growth is None else HierarchyParams(tau=tau, growth=growth)
    depth = np.full(n, tau + shift)
    x = hierarchy_guesses(game, params, depth, None, rng)
    means = [x.mean()]
    for r in range(1, rounds):
        anchor = np.full(n, float(target_of(x.mean(), game)))
        x = hierarchy_guesses(game, params, depth, anchor, rng, r)
        means.append(x.mean())
    return x, means


def test_first_round_in_the_human_range():
    # Nagel (1995): 2/3 -> mean 36.73, median 33; 1/2 -> mean 27.05
    x, _ = play(GameConfig(ratio="2/3"), 1)
    assert 30 <= x.mean() <= 42 and 25 <= np.median(x) <= 38
    x, _ = play(GameConfig(ratio="1/2"), 1)
    assert 22 <= x.mean() <= 32


def test_repeated_play_converges_to_the_equilibrium():
    _, means = play(GameConfig(ratio="2/3"), 8)
    assert all(b < a for a, b in pairwise(means))
    assert means[-1] < 1.0
    _, means = play(GameConfig(ratio="1/2", offset=5), 8)
    assert abs(means[-1] - 10) < 0.5


def test_level_0_repeats_the_mean_behind_the_winning_number():
    # Nobody reasons (tau 0, no growth, no noise): round 2 repeats round 1's mean.
    game = GameConfig(ratio="2/3")
    rng = np.random.default_rng(0)
    x = hierarchy_guesses(game, HierarchyParams(tau=0.0, noise=0.0, growth=0.0), np.zeros(3),
                          np.array([20.0, 20.0, 40.0]), rng, 1)
    np.testing.assert_allclose(x, [30.0, 30.0, 60.0])
    # A winning number clipped at the top reads as the lowest mean that gives it.
    np.testing.assert_allclose(mean_behind(np.array([100.0]), GameConfig(ratio="4/3")), [75.0])
    np.testing.assert_allclose(mean_behind(np.array([12.5]), GameConfig(ratio="1/2", offset=5)),
                               [15.0])


def test_reasoning_deepens_with_each_round():
    # From the same anchor, round 3 (two rounds of growth) guesses lower than round 2.
    game, anchor = GameConfig(ratio="2/3"), np.full(20000, 30.0)
    params = HierarchyParams(noise=0.0)
    early = hierarchy_guesses(game, params, np.full(20000, TAU), anchor,
                              np.random.default_rng(1), 1)
    later = hierarchy_guesses(game, params, np.full(20000, TAU), anchor,
                              np.random.default_rng(1), 3)
    assert later.mean() < early.mean() - 1
    flat = HierarchyParams(noise=0.0, growth=0.0)
    same = [hierarchy_guesses(game, flat, np.full(20000, TAU), anchor,
                              np.random.default_rng(1), r).mean() for r in (1, 3)]
    assert same[0] == same[1]


def test_deeper_reasoners_guess_lower_and_guesses_stay_in_range():
    shallow, _ = play(GameConfig(), 1, shift=-1.0)
    deep, _ = play(GameConfig(), 1, shift=+1.5)
    assert deep.mean() < shallow.mean() - 3
    assert shallow.min() >= 0 and shallow.max() <= 100
