"""Answers walked through answer trees with the real model do not depend on what ran
before or beside: two partitions decided in either order, the second time with the
process's cache of full trees already warm, give bit-identical answers; a walk that leaves
a planned tree goes on through the exact answer logits."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd
import pytest

from simpipe.agents.llm import LLMAgents, agent_seeds, distinct_prompts
from simpipe.answers.distribution import answer_distribution
from simpipe.answers.shared import step_uniforms
from simpipe.config.model import config_from_dict
from simpipe.games.answer_format import IntegerAnswers
from simpipe.games.base import Turn
from simpipe.games.registry import game_for
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.types import ChainSettings

pytestmark = [pytest.mark.llm, pytest.mark.slow]

PERSONAS = ["You are a female person.", "You are a male person."]


def _partition(ids: range) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    n = len(ids)
    # The first 8 agents share persona and history (a full tree, cached per process);
    # the rest have their own (walked lazily, chained).
    agents = pd.DataFrame({"agent_id": np.asarray(ids, np.int64),
                           "persona": [PERSONAS[0 if k < 8 else k % 2] for k in range(n)]})
    own = np.where(np.arange(n) < 8, 50.0, np.asarray(ids) % 101).astype(float)
    return agents, own[:, None], np.full((n, 1), 33.0)


def test_answers_do_not_depend_on_partition_order_or_the_cache() -> None:
    config = config_from_dict({"game": {"rounds": 2},
                               "agents": {"backend": "llamacpp", "max_tokens": 6,
                                          "llamacpp": {"n_parallel": 2}}})
    parts = [_partition(range(0, 12)), _partition(range(12, 24))]

    def play(order: list[int]) -> dict[int, pd.DataFrame]:
        backend = LlamaCppBackend(config.agents.llamacpp)
        try:
            policy = LLMAgents(backend, config.agents)
            out = {}
            for p in order:
                agents, own, told = parts[p]
                turn = Turn(game_for(config.game), 7, 1, p, told, own)
                out[p] = policy.decide(agents, turn)
            return out
        finally:
            asyncio.run(backend.aclose())

    a, b = play([0, 1]), play([1, 0])
    for p in (0, 1):
        fa, fb = a[p].frame, b[p].frame
        assert fa["shared"].all()
        np.testing.assert_array_equal(fa["raw"].to_numpy(), fb["raw"].to_numpy())
        assert a[p].stats.prompt_tokens > 0 and a[p].stats.probes > 0
    # Partition 1 drew its full tree from the cache the first time round: only its
    # lazily walked prompts cost tokens, their distinct suffixes.
    s = a[1].stats
    assert s.prompt_tokens / (s.prompt_ids.size - 1) < 60


def test_walks_into_a_planned_trees_left_out_prefix_are_walked_on_not_sampled() -> None:
    # A planned tree pruned hard (every prefix under 0.1 left out): the agents whose walks go
    # there are walked lazily in the partition's chain, so every agent is answered from the
    # exact answer logits and the server (a second model load) never starts for them.
    config = config_from_dict({"game": {"rounds": 2},
                               "agents": {"backend": "llamacpp", "max_tokens": 6,
                                          "llamacpp": {"n_parallel": 2}}})
    n = 200
    agents = pd.DataFrame({"agent_id": np.arange(n, dtype=np.int64),
                           "persona": [PERSONAS[0]] * n})
    turn = Turn(game_for(config.game), 7, 1, 0, np.full((n, 1), 33.0), np.full((n, 1), 50.0))
    [prompt] = distinct_prompts(agents, turn, "completion")[1]
    language = IntegerAnswers(0, 100)
    backend = LlamaCppBackend(config.agents.llamacpp)
    try:
        vocab = backend.answer_vocab(language.alphabet)
        with backend.logprob_chain(vocab, ChainSettings(1.0)) as probe_for:
            tree = answer_distribution(probe_for(prompt), language, vocab, ChainSettings(1.0),
                                       6, prune_below=0.1)
        uniforms = step_uniforms(agent_seeds(7, 1, agents["agent_id"].to_numpy()), 6)
        from_tree = tree.walk(uniforms)
        off = [i for i, t in enumerate(from_tree) if t is None]
        assert tree.pruned_mass >= 0.05 and len(off) >= 5, (tree.pruned_mass, len(off))
        turn = Turn(game_for(config.game), 7, 1, 0, turn.past_feedback, turn.past_answers,
                    planned={prompt: tree}, plan_decides=True)
        decided = LLMAgents(backend, config.agents).decide(agents, turn)
        frame = decided.frame
        assert frame["shared"].all() and decided.stats.fallback_prompts == 0
        assert backend._server is None
        assert (frame["status"] == "ok").all()
        # Agents whose walks stay in the tree take its answers; the others walked on.
        kept = [i for i in range(n) if from_tree[i] is not None]
        assert frame["raw"].to_numpy()[kept].tolist() == [from_tree[i] for i in kept]
        assert decided.stats.probes > tree.calls  # the walks on cost probes of their own
    finally:
        asyncio.run(backend.aclose())
