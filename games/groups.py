"""Who plays with whom: a deterministic split of the agents into groups."""

from __future__ import annotations

import numpy as np


def assign_groups(n_agents: int, group_size: int, seed: int) -> np.ndarray:
    """``group_id`` per agent id (int32).

    ``group_size`` 0 (or at least ``n_agents``): everyone in group 0. Otherwise
    ``n_agents // group_size`` groups of a seeded random membership; the remainder is
    spread over the groups, so no agent is dropped and sizes differ by at most one.
    """
    if group_size < 0:
        raise ValueError(f"group_size must be >= 0, got {group_size}")
    if group_size == 0 or group_size >= n_agents:
        return np.zeros(n_agents, dtype=np.int32)
    n_groups = n_agents // group_size
    order = np.random.default_rng([seed, 0x6A0]).permutation(n_agents)
    groups = np.empty(n_agents, dtype=np.int32)
    groups[order] = np.arange(n_agents, dtype=np.int64) % n_groups
    return groups
