"""Shared answers are distributed like one sampled call per agent, with the real model.

For the same prompt, 4,000 answers drawn from the answer distribution computed once
(``SharedAnswers``) and 200 answers from one grammar-constrained llama.cpp call each must
pass a two-sample chi-square test (bins merged until each expects at least 5 answers per
sample) at p >= 0.01. Both sides are deterministic (the per-agent calls run serially, each
batch from a clean slot; the distribution is computed as one lone sequence), so the p-values
are fixed numbers: the test cannot flake.

200 calls are enough to tell a wrong sampler model (it was 400; the per-agent calls are the
test's cost): each case also draws from the distribution of other sampling settings
(llama.cpp's own defaults, the nucleus left out) or of the prompt without its history, and
the same 200 calls must reject that one at p < 0.01. So the test shows its own power at
the size it runs.
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

PER_AGENT = 200
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


#: llama.cpp's own sampler defaults, which the back-end overrides (``build_params``): a
#: distribution computed with them is the wrong model most likely to slip in.
LLAMACPP_DEFAULTS = ChainSettings(0.8, top_p=0.95, top_k=40, min_p=0.05)

#: case: (the agents' sampling settings, the history shown, and a wrong model of them that
#: the per-agent calls must reject: other settings, or the prompt without its history).
CASES = {
    "round 1, basic, T=1.0 top_p=1.0": ({"temperature": 1.0, "top_p": 1.0}, None,
                                        (LLAMACPP_DEFAULTS, None)),
    "round 2 with history, T=1.0": ({"temperature": 1.0, "top_p": 1.0},
                                    [HistoryItem(0, 50.0, 33.33)],
                                    (ChainSettings(1.0, 1.0), None)),
    "round 1, basic, T=0.7 top_p=0.9": ({"temperature": 0.7, "top_p": 0.9}, None,
                                        (ChainSettings(0.7, 1.0), None)),
}


def _drawn(backend, prompt: str, settings: ChainSettings, max_unseen: float) -> list:
    """SHARED answers as the run draws them: walked through the prompt's answer tree, a
    uniform per step."""
    found = SharedAnswers(backend).lookup(prompt, settings, MAX_TOKENS, (0, 100), max_unseen)
    dist = found.distribution
    assert dist is not None, found.problem
    assert dist.unseen_mass <= 1e-4
    drawn = dist.walk(step_uniforms(np.arange(10_000, 10_000 + SHARED), MAX_TOKENS))
    assert None not in drawn
    return list(drawn)


def _p_value(called: list[str], drawn: list[str]) -> tuple[float, str]:
    g_called, s_called = parse_many(called, 0, 100)
    g_drawn, s_drawn = parse_many(drawn, 0, 100)
    assert (s_called == "ok").mean() >= 0.99 and (s_drawn == "ok").all()
    table = _binned_table(np.nan_to_num(g_called, nan=-1), np.nan_to_num(g_drawn, nan=-1))
    assert table.shape[1] >= 5  # enough bins for the test to mean something
    p = stats.chi2_contingency(table).pvalue
    return p, (f"p = {p:.4f}, {table.shape[1]} bins, mean called {np.nanmean(g_called):.2f} "
               f"vs drawn {np.nanmean(g_drawn):.2f}")


@pytest.mark.parametrize("case", list(CASES))
def test_shared_draws_match_one_call_per_agent(backend, case: str) -> None:
    sampling, history, (wrong_settings, wrong_history) = CASES[case]
    config = _game(**sampling)
    builder, _ = prompting(game_for(config.game), "completion")

    def render(shown: list | None) -> str:
        return builder.render(None, shown or (), 0 if shown is None else len(shown))

    prompt = render(history)

    requests = requests_for([prompt] * PER_AGENT, np.arange(PER_AGENT), game_for(config.game),
                            config.agents)
    called = [r.text for r in asyncio.run(backend.generate(requests))]

    agents = config.agents
    right = ChainSettings(agents.temperature, agents.top_p, agents.top_k, agents.min_p)
    p, summary = _p_value(called, _drawn(backend, prompt, right, agents.share_max_unseen))
    p_wrong, summary_wrong = _p_value(called, _drawn(backend, render(wrong_history),
                                                     wrong_settings, agents.share_max_unseen))
    print(f"{case}: {summary}; a wrong model ({wrong_settings}, history {wrong_history}): "
          f"{summary_wrong}")
    assert p >= 0.01
    assert p_wrong < 0.01, "the test could not tell a wrong sampler model at this size"
