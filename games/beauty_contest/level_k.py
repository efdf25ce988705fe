"""Rule-based players: a cognitive-hierarchy (level-k) model of the beauty contest.

Camerer, Ho & Chong (2004): each player has a reasoning depth k ~ Poisson(tau). Level 0
does not reason; level k believes the others are spread over levels 0..k-1 in Poisson
proportions and best-responds to their mean guess.

Calibrated to Nagel (1995), the 2/3 sessions only (``calibration`` prints the table):

* round 1: level 0 guesses uniformly over the range;
* later rounds: level 0 repeats the previous round's mean, the reference point Nagel
  found her subjects reasoning from; agents are told the winning number, and the mean is
  recovered from it (``(winning - offset) / ratio``);
* reasoning deepens as the game is repeated: round r (0-based) plays with depth
  ``tau + DEPTH_GROWTH * r`` (both the agents' own depth and their beliefs about others);
* noise is multiplicative in the distance to the equilibrium, so it shrinks as play
  converges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simpipe.games.beauty_contest.environment import equilibrium, target_of
from simpipe.games.config import BeautyContestConfig

MAX_LEVEL = 20
# Fitted on Nagel's four 2/3 sessions (round means and the first-round median; the fit is
# flat in noise between 0.1 and 0.25, so noise kept its earlier default):
TAU = 1.2
NOISE = 0.25
DEPTH_GROWTH = 0.35


@dataclass(frozen=True)
class HierarchyParams:
    tau: float = TAU  # mean depth in round 1: what agents believe about the others
    noise: float = NOISE  # sd of the log-scale factor on the distance to the equilibrium
    growth: float = DEPTH_GROWTH  # mean depth added per round played (learning)


def level_best_responses(game: BeautyContestConfig, tau: float, anchor_mean: float) -> np.ndarray:
    """Mean guess of each level 0..MAX_LEVEL when level 0 averages ``anchor_mean``."""
    share = np.array([math.exp(-tau) * tau**k / math.factorial(k) for k in range(MAX_LEVEL + 1)])
    guesses = np.empty(MAX_LEVEL + 1)
    guesses[0] = anchor_mean
    for k in range(1, MAX_LEVEL + 1):
        belief = share[:k] / share[:k].sum()
        guesses[k] = target_of(float(belief @ guesses[:k]), game)
    return guesses


def mean_behind(winning: np.ndarray, game: BeautyContestConfig) -> np.ndarray:
    """The mean guess that gives this winning number: ``(winning - offset) / ratio`` in the
    range. A winning number clipped to a bound gives the nearest such mean (4/3: a winning
    100 reads as a mean of 75)."""
    raw = (np.asarray(winning, dtype=np.float64) - game.offset) / game.ratio_value
    return np.clip(raw, game.low, game.high)


def hierarchy_guesses(
    game: BeautyContestConfig,
    params: HierarchyParams,
    depth_mean: np.ndarray,
    anchor: np.ndarray | None,
    rng: np.random.Generator,
    round_index: int = 0,
) -> np.ndarray:
    """One guess per agent.

    ``depth_mean``: each agent's own Poisson mean in round 1 (tau plus any attribute shift).
    ``anchor``: each agent's last announced winning number, or None in round 1.
    ``round_index``: 0-based; the depth grows by ``params.growth`` per round.
    """
    n = len(depth_mean)
    learned = params.growth * round_index
    belief = params.tau + learned
    depth = np.minimum(rng.poisson(np.maximum(depth_mean + learned, 0.0)), MAX_LEVEL)
    eq = equilibrium(game)
    if anchor is None:
        level0 = rng.uniform(game.low, game.high, size=n)
        responses = level_best_responses(game, belief, (game.low + game.high) / 2)
        reasoned = responses[depth]
    else:
        level0 = mean_behind(anchor, game)
        # Best responses are affine in the anchor between the clips, so computing them for
        # each distinct anchor (one per group) keeps this vectorised.
        uniq, inverse = np.unique(level0, return_inverse=True)
        table = np.stack([level_best_responses(game, belief, a) for a in uniq])
        reasoned = table[inverse, depth]
    base = np.where(depth == 0, level0, reasoned)
    factor = np.exp(rng.normal(0.0, params.noise, size=n))
    return np.clip(eq + (base - eq) * factor, game.low, game.high)
