"""Rule-based players of the public goods game: free riders and conditional cooperators.

Each agent is, for the whole game, a free rider (contributes 0) with probability
``free_rider_share``, otherwise a conditional cooperator. A cooperator's first contribution
comes from a normal distribution (rounded to whole points, clipped to the endowment). From
then on it contributes ``slope`` times what it expects the other members of its group to give
(plus a little noise): it starts with an optimistic expectation (``prior_belief``) and after
every round moves it towards what the others really gave on average (``memory`` is the
weight the old expectation keeps). Cooperators who give less than they expect (slope < 1)
and free riders make contributions decay, the pattern of human play.

The parameters were set by hand so that 10,000 agents in groups of 4 (endowment 20, MPCR 0.4)
follow the per-period mean contributions Fischbacher & Gaechter (2010) report for that design
to within 3 percentage points in every period (tests/games/test_conditional_cooperation.py);
they are a calibration of population means, not estimates of individual behaviour. Amounts
are shares of the endowment, so the same behaviour scales to other endowments.

Everything is vectorised over a partition's agents; an agent's type and prior expectation
depend only on (seed, partition, its position), its per-round noise on (seed, round,
partition), so the same seed gives the same contributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TYPES_STREAM = 0x9C7  # types and priors: the same in every round


@dataclass(frozen=True)
class CooperationParams:
    free_rider_share: float = 0.25
    first_mean: float = 0.53  # a cooperator's first contribution, share of the endowment
    first_sd: float = 0.30
    prior_belief: float = 0.80  # what a cooperator expects the others to give at first
    prior_sd: float = 0.15
    memory: float = 0.6  # weight of the old expectation when updating it
    slope: float = 0.8  # contribution per point expected from the others
    noise_sd: float = 0.05  # per round, share of the endowment


def agent_types(seed: int, partition: int, n: int,
                params: CooperationParams) -> tuple[np.ndarray, np.ndarray]:
    """``(free_rider, prior)`` of a partition's ``n`` agents: the same every round."""
    rng = np.random.default_rng([seed, _TYPES_STREAM, partition])
    free_rider = rng.random(n) < params.free_rider_share
    prior = np.clip(rng.normal(params.prior_belief, params.prior_sd, n), 0.0, 1.0)
    return free_rider, prior


def expectations(prior: np.ndarray, own: np.ndarray, group_totals: np.ndarray,
                 group_size: int, endowment: int, memory: float) -> np.ndarray:
    """What each agent expects the others to give next, as a share of the endowment, after
    the rounds in ``own`` / ``group_totals`` (agents, rounds so far; own NaN counts 0)."""
    belief = prior.copy()
    own = np.nan_to_num(own, nan=0.0)
    for r in range(own.shape[1]):
        others = (group_totals[:, r] - own[:, r]) / max(group_size - 1, 1) / endowment
        # A round whose total was not announced leaves the expectation as it was.
        others = np.where(np.isfinite(others), others, belief)
        belief = memory * belief + (1.0 - memory) * others
    return belief


def contributions(seed: int, partition: int, rng: np.random.Generator,
                  own: np.ndarray | None, group_totals: np.ndarray, group_size: int,
                  endowment: int, params: CooperationParams = CooperationParams()) -> np.ndarray:
    """One whole-number contribution per agent for the next round.

    ``own`` and ``group_totals``: (agents, rounds so far); ``own`` may be None in round 1.
    """
    n = group_totals.shape[0]
    free_rider, prior = agent_types(seed, partition, n, params)
    if own is None or group_totals.shape[1] == 0:
        share = rng.normal(params.first_mean, params.first_sd, n)
    else:
        belief = expectations(prior, own, group_totals, group_size, endowment, params.memory)
        share = params.slope * belief + rng.normal(0.0, params.noise_sd, n)
    amount = np.clip(np.rint(share * endowment), 0, endowment)
    return np.where(free_rider, 0.0, amount)
