"""Shared answers are distributed like one sampled call per agent, with the real model.

For the same prompt, 4,000 answers drawn from the answer distribution computed once
(``SharedAnswers``) and 400 answers from one grammar-constrained llama.cpp call each must
pass a two-sample chi-square test (bins merged until each expects at least 5 answers per
sample) at p >= 0.01. Both sides are deterministic (the per-agent calls run serially, each
batch from a clean slot; the distribution is computed as one lone sequence), so the p-values
are fixed numbers: the test cannot flake, and a wrong sampler model fails it every time.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from scipy import stats

from simpipe.agents.llm import prompting, requests_for
from simpipe.answers.shared import SharedAnswers, step_uniforms
from simpipe.config.model import config_from_dict
from simpipe.games.beauty_contest.prompts import HistoryItem
from simpipe.games.parsing import parse_many
from simpipe.games.registry import game_for
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.settings import LlamaCppSettings
from simpipe.inference.types import ChainSettings

pytestmark = [pytest.mark.llm, pytest.mark.slow]

PER_AGENT = 400
SHARED = 4000
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=8), serial=True)
    yield b
    asyncio.run(b.aclose())


def _game(**agents):
    return config_from_dict({"game": {"rounds": 3},
                             "agents": {"backend": "llamacpp", "max_tokens": MAX_TOKENS,
                                        **agents}})


def _binned_table(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2 x k counts over answer values, adjacent values merged until every cell of the
    smaller sample expects at least 5."""
    values = np.union1d(a, b)
    counts = np.array([[np.sum(a == v) for v in values], [np.sum(b == v) for v in values]])
    need = 5 * counts.sum() / min(len(a), len(b))  # pooled count that expects 5 in the smaller
    bins, current = [], np.zeros(2, int)
    for column in counts.T:
        current = current + column
        if current.sum() >= need:
            bins.append(current)
            current = np.zeros(2, int)
    if current.sum():
        bins[-1] = bins[-1] + current
    return np.array(bins).T


CASES = {
    "round 1, basic, T=1.0 top_p=1.0": ({"temperature": 1.0, "top_p": 1.0}, None),
    "round 2 with history, T=1.0": ({"temperature": 1.0, "top_p": 1.0},
                                    [HistoryItem(0, 50.0, 33.33)]),
    "round 1, basic, T=0.7 top_p=0.9": ({"temperature": 0.7, "top_p": 0.9}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shared_draws_match_one_call_per_agent(backend, case: str) -> None:
    sampling, history = CASES[case]
    config = _game(**sampling)
    builder, _ = prompting(game_for(config.game), "completion")
    round_index = 0 if history is None else len(history)
    prompt = builder.render(None, history or (), round_index)

    requests = requests_for([prompt] * PER_AGENT, np.arange(PER_AGENT), game_for(config.game),
                            config.agents)
    called = [r.text for r in asyncio.run(backend.generate(requests))]

    agents = config.agents
    found = SharedAnswers(backend).lookup(
        prompt, ChainSettings(agents.temperature, agents.top_p, agents.top_k, agents.min_p),
        MAX_TOKENS, (0, 100), agents.share_max_unseen)
    dist = found.distribution
    assert dist is not None, found.problem
    assert dist.unseen_mass <= 1e-4
    # Agents' answers as the run draws them: walked through the tree, a uniform per step.
    drawn = dist.walk(step_uniforms(np.arange(10_000, 10_000 + SHARED), MAX_TOKENS))
    assert None not in drawn

    g_called, s_called = parse_many(called, 0, 100)
    g_drawn, s_drawn = parse_many(list(drawn), 0, 100)
    assert (s_called == "ok").mean() >= 0.99 and (s_drawn == "ok").all()
    table = _binned_table(np.nan_to_num(g_called, nan=-1), np.nan_to_num(g_drawn, nan=-1))
    assert table.shape[1] >= 5  # enough bins for the test to mean something
    p = stats.chi2_contingency(table).pvalue
    print(f"{case}: p = {p:.4f}, {table.shape[1]} bins, mean called "
          f"{np.nanmean(g_called):.2f} vs drawn {np.nanmean(g_drawn):.2f}, "
          f"{dist.calls} model calls for the distribution")
    assert p >= 0.01
