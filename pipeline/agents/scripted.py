"""``backend = "scripted"``: cognitive-hierarchy agents, no LLM, optional simulated I/O wait."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd

from simpipe.agents.base import AgentPolicy, Decisions, Turn, decisions_frame
from simpipe.aio import CoalescedClock, gc_paused, run_async
from simpipe.games.level_k import HierarchyParams, hierarchy_guesses

_STREAM = 0x5C1


class ScriptedAgents(AgentPolicy):
    def __init__(self, tau: float, noise: float, latency_s: float,
                 depth_shift: dict[str, dict[str, float]]) -> None:
        self.params = HierarchyParams(tau=tau, noise=noise)
        self.latency_s = latency_s
        self.depth_shift = depth_shift

    def decide(self, agents: pd.DataFrame, turn: Turn) -> Decisions:
        n = len(agents)
        depth_mean = np.full(n, self.params.tau)
        for attr, shifts in self.depth_shift.items():
            values = agents[attr].astype(object)
            depth_mean += values.map(shifts).fillna(0.0).to_numpy(dtype=np.float64)
        anchor = turn.past_winning[:, -1] if turn.round_index > 0 else None
        # Two decimals, as a person (or the LLM answer grammar) would write them; it also keeps
        # the per-partition value counts that the reduce receives small.
        guesses = hierarchy_guesses(turn.game, self.params, depth_mean, anchor, turn.rng(_STREAM))
        guesses = np.round(guesses, 2)
        latency = None
        if self.latency_s > 0:
            with gc_paused():
                latency = run_async(_wait_each(n, self.latency_s))
        return Decisions(decisions_frame(guesses, np.full(n, "ok"), latency_s=latency))


async def _wait_each(n: int, delay: float) -> np.ndarray:
    """Every agent awaits its own wait (the paper's dummy agent); returns each one's latency."""
    loop = asyncio.get_running_loop()
    clock = CoalescedClock()

    async def agent() -> float:
        start = loop.time()
        await clock.sleep(delay)
        return loop.time() - start

    return np.fromiter(await asyncio.gather(*[agent() for _ in range(n)]), np.float64, n)
