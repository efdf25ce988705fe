"""How a partition of agents decides: the interface between the round loop and agents.

A policy answers for a whole partition at once (vectorised for scripted agents, batched
requests for LLM agents) and returns one decision row per agent.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simpipe.games.base import Game
from simpipe.games.base import Turn as Turn  # what a partition's agents know; games read it
from simpipe.games.partials import STATUSES

DECISION_COLUMNS = ("guess", "status", "raw", "raw_truncated", "tokens_in", "tokens_out",
                    "latency_s", "error", "shared")


@dataclass
class DecisionStats:
    """What deciding one partition took, summed over partitions into ``run.json``."""

    # Stable 64-bit ids of the distinct prompts (the round's distinct prompts are the union)
    prompt_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    model_calls: int = 0  # calls to the model: one per agent, or per node of a shared tree
    shared_agents: int = 0  # agents whose answer was drawn from a shared distribution
    fallback_prompts: int = 0  # distinct prompts that could not be shared (unseen mass)
    unseen_mass_max: float = 0.0  # largest unseen mass of a shared distribution used
    problem: str | None = None  # why the first fallback prompt could not be shared
    # Prompt tokens the model evaluated (a cached prefix is not evaluated again; a sampled
    # call counts the prompt tokens it reports)
    prompt_tokens: int = 0
    probes: int = 0  # of model_calls, one-token probes of answer trees


@dataclass
class Decisions:
    frame: pd.DataFrame  # one row per agent (same order as the agents) with DECISION_COLUMNS
    stats: DecisionStats = field(default_factory=DecisionStats)


class AgentPolicy(abc.ABC):
    def needs_own_answers(self, game: Game) -> bool:
        """Whether ``Turn.past_answers`` must be filled in for ``game`` (reading them costs
        a file per earlier round)."""
        return False

    @abc.abstractmethod
    def decide(self, agents: pd.DataFrame, turn: Turn) -> Decisions:
        """One decision per agent (same order as ``agents``), and what it took."""

    def counters(self) -> dict[str, dict]:
        """Per-endpoint counters since this policy was created (empty without endpoints)."""
        return {}


def stored_raw(texts: list[str | None], max_chars: int) -> tuple[list[str | None], np.ndarray]:
    """The answer texts as stored: each cut to its first ``max_chars`` characters, and
    which ones were cut. A server's answer can be a megabyte; a million rows of that would
    be a terabyte of Parquet, so storage keeps a prefix (parsing has used the full text)."""
    truncated = np.fromiter((t is not None and len(t) > max_chars for t in texts), bool,
                            len(texts))
    if not truncated.any():
        return texts, truncated
    kept = [t[:max_chars] if cut else t for t, cut in zip(texts, truncated.tolist(), strict=True)]
    return kept, truncated


def _int32_counts(counts: np.ndarray) -> np.ndarray:
    """Token counts as the int32 column. Each count a server reports is checked to be within
    int32, but an agent's row can hold a sum (a shared distribution's probes split over few
    agents, plus a call of its own): beyond 2**31-1 it is stored as 2**31-1, never wrapped
    to a negative count (which failed run.json's check and with it the run)."""
    top = np.iinfo(np.int32).max
    return np.clip(counts, 0, top).astype(np.int32)


def decisions_frame(
    guess: np.ndarray,
    status: np.ndarray | list[str],
    *,
    raw: list[str | None] | None = None,
    raw_truncated: np.ndarray | None = None,
    tokens_in: np.ndarray | None = None,
    tokens_out: np.ndarray | None = None,
    latency_s: np.ndarray | None = None,
    error: list[str | None] | None = None,
    shared: np.ndarray | None = None,
) -> pd.DataFrame:
    """Build the decision frame with the result schema's column types."""
    n = len(guess)
    # Plain object columns of None: the writer's schema types them as strings, and building
    # pandas string arrays of a million Nones costs more than the agents' decisions.
    none = np.full(n, None, dtype=object)
    return pd.DataFrame(
        {
            "guess": np.asarray(guess, dtype=np.float64),
            "status": pd.Categorical(status, categories=STATUSES),
            "raw": np.asarray(raw, dtype=object) if raw is not None else none,
            "raw_truncated": np.zeros(n, bool) if raw_truncated is None else raw_truncated,
            "tokens_in": (np.zeros(n, np.int32) if tokens_in is None
                          else _int32_counts(tokens_in)),
            "tokens_out": (np.zeros(n, np.int32) if tokens_out is None
                           else _int32_counts(tokens_out)),
            "latency_s": np.zeros(n) if latency_s is None else np.asarray(latency_s, np.float64),
            "error": np.asarray(error, dtype=object) if error is not None else none,
            "shared": np.zeros(n, bool) if shared is None else np.asarray(shared, bool),
        }
    )
