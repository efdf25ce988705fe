"""LLM agents: prompts with memory, one batched call per partition, numbers parsed.

The back-end gets the whole partition at once and overlaps the calls itself; the answer
is constrained to a number in range where the server supports it, and parsed tolerantly
either way, so every agent ends with a guess or a status saying why not.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from simpipe.agents.base import AgentPolicy, Turn, decisions_frame, stored_raw
from simpipe.aio import run_async
from simpipe.games.answer_format import number_grammar, number_json_schema, number_regex
from simpipe.games.config import GameConfig
from simpipe.games.parsing import parse_many
from simpipe.games.prompts import HistoryItem, PromptBuilder
from simpipe.inference.base import Backend, GenerationRequest, OutputConstraint
from simpipe.inference.settings import SamplingSettings


def agent_seeds(seed: int, round_index: int, agent_ids: np.ndarray) -> np.ndarray:
    """A per-agent, per-round request seed (splitmix64 of the triple), in [0, 2**31)."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(round_index) * np.uint64(0xBF58476D1CE4E5B9)
             + agent_ids.astype(np.uint64))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(33)).astype(np.int64)


def histories(past_guesses: np.ndarray | None, past_winning: np.ndarray) -> list[list[HistoryItem]] | None:
    """Each agent's own earlier answers beside the winning numbers it was told."""
    if past_guesses is None or past_winning.shape[1] == 0:
        return None
    out = []
    for guesses, winning in zip(past_guesses.tolist(), past_winning.tolist(), strict=True):
        out.append([
            HistoryItem(r, None if math.isnan(g) else g, None if math.isnan(w) else w)
            for r, (g, w) in enumerate(zip(guesses, winning))
        ])
    return out


@functools.lru_cache(maxsize=64)
def _prompting(game_json: str, style: str) -> tuple[PromptBuilder, OutputConstraint]:
    game = GameConfig.model_validate_json(game_json)
    cot = game.prompt == "cot"
    constraint = OutputConstraint(
        gbnf=number_grammar(game.low, game.high, cot),
        regex=number_regex(game.low, game.high, cot),
        json_schema=None if cot else number_json_schema(game.low, game.high),
    )
    return PromptBuilder(game, style), constraint


def prompting(game: GameConfig, style: str) -> tuple[PromptBuilder, OutputConstraint]:
    """The prompt builder and answer constraint of a game (built once per process)."""
    return _prompting(game.model_dump_json(), style)


def build_requests(agents: pd.DataFrame, turn: Turn, style: str,
                   sampling: SamplingSettings) -> list[GenerationRequest]:
    """One request per agent: its prompt (rules, persona, own history), seed and limits."""
    builder, constraint = prompting(turn.game, style)
    personas = agents["persona"].tolist() if "persona" in agents else [None] * len(agents)
    prompts = builder.render_many(personas, histories(turn.past_guesses, turn.past_winning),
                                  turn.round_index)
    seeds = agent_seeds(turn.seed, turn.round_index, agents["agent_id"].to_numpy())
    common = {
        "max_tokens": sampling.cot_max_tokens if turn.game.prompt == "cot" else sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "constraint": constraint,
    }
    return [
        GenerationRequest(prompt=p, seed=seed, **common) if isinstance(p, str)
        else GenerationRequest(messages=p, seed=seed, **common)
        for p, seed in zip(prompts, seeds.tolist())
    ]


class LLMAgents(AgentPolicy):
    needs_own_history = True

    def __init__(self, backend: Backend, sampling: SamplingSettings, max_raw_chars: int) -> None:
        self.backend = backend
        self.sampling = sampling
        self.max_raw_chars = max_raw_chars

    def decide(self, agents: pd.DataFrame, turn: Turn) -> pd.DataFrame:
        game = turn.game
        requests = build_requests(agents, turn, self.backend.prompt_style, self.sampling)
        results = run_async(self.backend.generate(requests))
        texts = [r.text for r in results]
        guesses, statuses = parse_many(texts, game.low, game.high, game.prompt == "cot")
        failed = np.fromiter((r.status == "error" for r in results), bool, len(results))
        statuses[failed] = "error"
        guesses[failed] = np.nan
        raw, raw_truncated = stored_raw(texts, self.max_raw_chars)
        return decisions_frame(
            guesses, statuses,
            raw=raw,
            raw_truncated=raw_truncated,
            tokens_in=np.fromiter((r.tokens_in for r in results), np.int64, len(results)),
            tokens_out=np.fromiter((r.tokens_out for r in results), np.int64, len(results)),
            latency_s=np.fromiter((r.latency_s for r in results), np.float64, len(results)),
            error=[r.error for r in results],
        )

    def counters(self) -> dict[str, dict]:
        return self.backend.counters()
