"""``backend = "scripted"``: the game's rule-based agents, no LLM, optional simulated I/O wait."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd

from simpipe.agents.base import AgentPolicy, Decisions, Turn, decisions_frame
from simpipe.agents.progress import report_agents
from simpipe.core.aio import CoalescedClock, gc_paused, run_async
from simpipe.games.base import Game, ScriptedSettings


class ScriptedAgents(AgentPolicy):
    def __init__(self, settings: ScriptedSettings, latency_s: float) -> None:
        # The beauty contest's cognitive hierarchy reads these; other games ignore them.
        self.settings = settings
        self.latency_s = latency_s

    def needs_own_answers(self, game: Game) -> bool:
        return game.scripted_needs_own_answers

    def decide(self, agents: pd.DataFrame, turn: Turn) -> Decisions:
        n = len(agents)
        answers = turn.game.scripted_answers(agents, turn, self.settings)
        latency = None
        if self.latency_s > 0:
            with gc_paused():
                latency = run_async(_wait_each(n, self.latency_s))
        report_agents(n)
        return Decisions(decisions_frame(answers, np.full(n, "ok"), latency_s=latency))


async def _wait_each(n: int, delay: float) -> np.ndarray:
    """Every agent awaits its own wait (the paper's dummy agent); returns each one's latency."""
    loop = asyncio.get_running_loop()
    clock = CoalescedClock()

    async def agent() -> float:
        start = loop.time()
        await clock.sleep(delay)
        return loop.time() - start

    return np.fromiter(await asyncio.gather(*[agent() for _ in range(n)]), np.float64, n)
