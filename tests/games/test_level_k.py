from itertools import pairwise

import numpy as np

from simpipe.games.beauty_contest.environment import target_of
from simpipe.games.beauty_contest.level_k import HierarchyParams, hierarchy_guesses
from simpipe.games.config import BeautyContestConfig as GameConfig


def play(game, rounds, n=20000, tau=1.5, shift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    depth = np.full(n, tau + shift)
    x = hierarchy_guesses(game, HierarchyParams(tau=tau), depth, None, rng)
    means = [x.mean()]
    for _ in range(rounds - 1):
        anchor = np.full(n, float(target_of(x.mean(), game)))
        x = hierarchy_guesses(game, HierarchyParams(tau=tau), depth, anchor, rng)
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


def test_deeper_reasoners_guess_lower_and_guesses_stay_in_range():
    shallow, _ = play(GameConfig(), 1, shift=-1.0)
    deep, _ = play(GameConfig(), 1, shift=+1.5)
    assert deep.mean() < shallow.mean() - 3
    assert shallow.min() >= 0 and shallow.max() <= 100
