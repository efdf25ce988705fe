"""Answer distributions over HTTP from llama.cpp's own server
(``agents.openai.answer_distributions = "llamacpp"``), with the real Gemma model: the same
distribution as the embedded engine's for the same prompt, and agents' draws from it against
one sampled call per agent through the same server (chi-square, fixed seeds)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from simpipe.answers.distribution import AnswerDistribution, answer_distribution
from simpipe.answers.shared import SharedAnswers, step_uniforms
from simpipe.answers.tree import TreeShape
from simpipe.games.answer_format import IntegerAnswers, number_lark
from simpipe.inference.base import GenerationRequest, OutputConstraint
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.logprobs import top_logprobs
from simpipe.inference.settings import LlamaCppSettings, OpenAISettings
from simpipe.inference.types import ChainSettings, ProbeError
from simpipe.servers.llamacpp_server import LlamaCppProcess

from support import total_variation

PROMPT = "Pick a number between 0 and 100; the winner is closest to 2/3 of the average. Mine:"
MAX_TOKENS = 4
LANG = IntegerAnswers(0, 100)
# The answer grammar in llguidance's form, which this build's server takes as `grammar`:
# GBNF costs llama.cpp more than half its speed (docs/shared-answers.md), and both are
# applied by the same sampler (draw, then resample under the grammar if rejected).
NUMBER = OutputConstraint(gbnf=number_lark(0, 100))
AGENTS = 120
SLOTS = 2


def _http(url: str) -> OpenAIBackend:
    return OpenAIBackend(OpenAISettings(endpoints=[url], answer_distributions="llamacpp",
                                        constraint="grammar", max_concurrency=SLOTS))


def _distribution(backend, settings: ChainSettings) -> AnswerDistribution:
    vocab = backend.answer_vocab(LANG.alphabet)
    with backend.logprob_session(PROMPT) as probe:
        return answer_distribution(probe, LANG, vocab, settings, MAX_TOKENS,
                                   sampler=backend.answer_sampler)


def test_the_completion_answer_is_read_and_an_old_one_refused():
    good = {"completion_probabilities": [{"id": 5, "logprob": -0.1, "top_logprobs": [
        {"id": 5, "token": "1", "bytes": [49], "logprob": -0.1},
        {"id": 7, "token": "2", "bytes": [50], "logprob": -2.5}]}],
        "timings": {"prompt_n": 16}, "tokens_predicted": 1}
    top, evaluated, generated = top_logprobs(good)
    assert (top.ids, top.logprobs, evaluated, generated) == ((5, 7), (-0.1, -2.5), 16, 1)
    with pytest.raises(ProbeError, match="old form"):
        top_logprobs({"completion_probabilities": [{"content": "1", "probs": []}]})
    with pytest.raises(ProbeError, match="no top log-probabilities.*slot unavailable"):
        top_logprobs({"error": "slot unavailable"})


@pytest.mark.slow
@pytest.mark.llm
def test_distribution_over_http_equals_the_embedded_engines():
    """Both are llama.cpp on the same GGUF, the prompt decoded alone: the distributions agree
    within what neither side saw plus float noise (measured: equal), and the vocabulary from
    /tokenize and /detokenize is the GGUF's answer tokens that the grammar can accept."""
    settings = ChainSettings(1.0)
    embedded = LlamaCppBackend(LlamaCppSettings(n_parallel=SLOTS, threads=2))
    try:
        local_vocab = embedded.answer_vocab(LANG.alphabet)
        local = _distribution(embedded, settings)
    finally:
        asyncio.run(embedded.aclose())
    # one model process at a time: the embedded engine is gone before the server starts
    with LlamaCppProcess(parallel=SLOTS, threads=2) as server:
        backend = _http(server.url)
        assert backend.supports_answer_distributions
        vocab = backend.answer_vocab(LANG.alphabet)
        remote = _distribution(backend, settings)
        again = _distribution(backend, settings)
        found = SharedAnswers(backend).lookup(PROMPT, settings, MAX_TOKENS, (0.0, 100.0), 1e-4)
    assert vocab.eog_ids == local_vocab.eog_ids
    assert set(vocab.pieces.items()) <= set(local_vocab.pieces.items())
    # the GGUF's others are runs of spaces or dashes, which no answer can hold
    shape = TreeShape(LANG, local_vocab, MAX_TOKENS)
    for prefix in ("", " ", " 1", " 10"):
        assert shape.valid(prefix) == TreeShape(LANG, vocab, MAX_TOKENS).valid(prefix)
    assert sum(p == "0" for p in vocab.pieces.values()) == 2  # "0" and the byte <0x30>
    assert remote.texts == again.texts and np.array_equal(remote.probs, again.probs)
    assert remote.calls == local.calls > 10 and remote.tokens_in > 0
    tv = total_variation(remote, local)
    assert tv <= remote.unseen_mass + local.unseen_mass + 1e-6, (tv, remote.unseen_mass)
    assert len(remote.texts) > 20  # a real spread, not one answer
    assert found.distribution is not None and found.calls == remote.calls


def _p_same(a: list[str], b: list[str]) -> float:
    """Chi-square test of homogeneity over answers pooled so each cell expects >= 5."""
    values, counts = np.unique(a + b, return_counts=True)
    keep = {v for v, c in zip(values, counts, strict=True) if c >= 10}
    bins = sorted(keep) + ["other"]
    table = np.array([[sum(1 for x in s if (x if x in keep else "other") == v) for v in bins]
                      for s in (a, b)])
    return float(chi2_contingency(table[:, table.sum(axis=0) > 0])[1])


@pytest.mark.slow
@pytest.mark.llm
def test_shared_draws_match_per_agent_calls_through_the_server():
    """120 agents with one prompt: each agent's draw from the distribution against one
    grammar-constrained sampled call per agent, same server, fixed seeds. The same test tells
    draws at temperature 0.3 apart (its power)."""
    seeds = (np.arange(AGENTS, dtype=np.int64) * 7919 + 13) % (2**31 - 1)
    uniforms = step_uniforms(seeds, MAX_TOKENS)
    with LlamaCppProcess(parallel=SLOTS, threads=2) as server:
        backend = _http(server.url)
        dist = _distribution(backend, ChainSettings(1.0))
        colder = _distribution(backend, ChainSettings(0.3))
        request = GenerationRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0,
                                    constraint=NUMBER)

        async def per_agent():
            cols = await backend.generate_many([request], np.zeros(AGENTS, np.int64), seeds)
            await backend.aclose()
            return cols

        cols = asyncio.run(per_agent())
    assert cols.error == [None] * AGENTS, cols.error[:3]
    sampled = [t.strip() for t in cols.text]
    shared = [(t or "pruned").strip() for t in dist.walk(uniforms)]
    cold = [(t or "pruned").strip() for t in colder.walk(uniforms)]
    assert all(LANG.is_complete(t) for t in sampled)
    assert _p_same(sampled, shared) > 0.001
    assert _p_same(sampled, cold) < 0.001
    assert len(set(shared)) > 5


class _Watched:
    """The /completion bodies a back-end posts, and the most it had in flight at once."""

    def __init__(self, backend: OpenAIBackend) -> None:
        self._post, self._lock = backend._post, threading.Lock()
        self.bodies: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        backend._post = self.post  # the sessions post through the instance's _post

    def post(self, path: str, body: dict, prefer: int | None = None):
        with self._lock:
            self.bodies.append(body)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return self._post(path, body, prefer)
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.mark.slow
@pytest.mark.llm
def test_trees_run_side_by_side_on_the_servers_slots_unless_lone():
    """A list's trees through a llama.cpp server: lone (``agents.reproducible``), one
    session after the other on slot 0, each prompt decoded afresh; otherwise as many
    sessions at once as the back-end keeps requests in flight, on slots the server picks,
    building on what they cached. Both give each prompt its distribution: they agree within
    what llama.cpp's batched decodes move (log-probabilities by up to 0.05 for likely
    tokens, docs/shared-answers.md, over an answer's 2-3 tokens), far closer than two of
    the prompts, whose last rounds' numbers differ, are to each other."""
    prompts = [PROMPT.replace("Mine:", f"Last round the winning number was {n}. Mine:")
               for n in (3, 18, 33, 48, 63, 78)]
    args = (ChainSettings(1.0), MAX_TOKENS, (0.0, 100.0), 1e-3)
    with LlamaCppProcess(parallel=4, threads=2) as server:
        backend = OpenAIBackend(OpenAISettings(
            endpoints=[server.url], answer_distributions="llamacpp", constraint="lark",
            max_concurrency=4))
        post = backend._post
        lone_watch = _Watched(backend)
        lone = SharedAnswers(backend).compute_chain(prompts, *args)
        backend._post = post
        side_watch = _Watched(backend)
        side = SharedAnswers(backend, lone_sessions=False).compute_chain(prompts, *args)
    assert backend.session_concurrency == 4
    assert lone_watch.most_in_flight == 1
    assert all(b["id_slot"] == 0 for b in lone_watch.bodies)
    assert sum(not b["cache_prompt"] for b in lone_watch.bodies) == len(prompts)
    assert side_watch.most_in_flight == 4
    assert not any("id_slot" in b for b in side_watch.bodies)
    assert all(b["cache_prompt"] for b in side_watch.bodies)
    for a, b in zip(lone, side, strict=True):
        assert a.distribution is not None and b.distribution is not None
        assert a.calls > 10 and b.calls > 10
        assert total_variation(a.distribution, b.distribution) <= BATCH_TV
    apart = [total_variation(a.distribution, b.distribution)
             for a, b in zip(lone, lone[1:], strict=False)]
    assert min(apart) > 2.5 * BATCH_TV, apart


#: How far a tree computed among other sessions' probes may lie from the lone one, in total
#: variation: measured 0.012-0.040 on these prompts, which lie 0.24-0.35 apart.
BATCH_TV = 0.08
