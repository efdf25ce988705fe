"""Rule-based players: a cognitive-hierarchy (level-k) model of the beauty contest.

Camerer, Ho & Chong (2004): each player has a reasoning depth k ~ Poisson(tau). Level 0
does not reason (round 1: uniform over the range; later rounds: stays near the last
announced winning number). Level k believes the others are spread over levels 0..k-1 in
Poisson proportions and best-responds to their mean guess. With tau = 1.5 and ratio 2/3 the
first-round mean is about 35 (Nagel 1995 measured 36.73); from round 2 on the level-0
anchor is the last winning number, so play moves towards the equilibrium every round.
Noise is multiplicative in the distance to the equilibrium, so it shrinks as play converges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simpipe.games.beauty_contest.environment import equilibrium, target_of
from simpipe.games.config import BeautyContestConfig

MAX_LEVEL = 20


@dataclass(frozen=True)
class HierarchyParams:
    tau: float = 1.5  # mean depth: what agents believe about the others
    noise: float = 0.25  # sd of the log-scale factor on the distance to the equilibrium


def level_best_responses(game: BeautyContestConfig, tau: float, anchor_mean: float) -> np.ndarray:
    """Mean guess of each level 0..MAX_LEVEL when level 0 averages ``anchor_mean``."""
    share = np.array([math.exp(-tau) * tau**k / math.factorial(k) for k in range(MAX_LEVEL + 1)])
    guesses = np.empty(MAX_LEVEL + 1)
    guesses[0] = anchor_mean
    for k in range(1, MAX_LEVEL + 1):
        belief = share[:k] / share[:k].sum()
        guesses[k] = target_of(float(belief @ guesses[:k]), game)
    return guesses


def hierarchy_guesses(
    game: BeautyContestConfig,
    params: HierarchyParams,
    depth_mean: np.ndarray,
    anchor: np.ndarray | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """One guess per agent.

    ``depth_mean``: each agent's own Poisson mean (tau plus any attribute shift).
    ``anchor``: each agent's last announced winning number, or None in round 1.
    """
    n = len(depth_mean)
    depth = np.minimum(rng.poisson(np.maximum(depth_mean, 0.0)), MAX_LEVEL)
    eq = equilibrium(game)
    if anchor is None:
        level0 = rng.uniform(game.low, game.high, size=n)
        responses = level_best_responses(game, params.tau, (game.low + game.high) / 2)
        reasoned = responses[depth]
    else:
        anchor = np.asarray(anchor, dtype=np.float64)
        level0 = anchor
        # Best responses are affine in the anchor between the clips, so computing them for
        # each distinct anchor (one per group) keeps this vectorised.
        uniq, inverse = np.unique(anchor, return_inverse=True)
        table = np.stack([level_best_responses(game, params.tau, a) for a in uniq])
        reasoned = table[inverse, depth]
    base = np.where(depth == 0, level0, reasoned)
    factor = np.exp(rng.normal(0.0, params.noise, size=n))
    return np.clip(eq + (base - eq) * factor, game.low, game.high)
