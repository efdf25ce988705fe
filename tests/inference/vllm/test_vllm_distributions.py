"""Answer distributions over HTTP against vLLM's contract: the sampler model, and the whole
walk against the emulator's vLLM routes (``/tokenize``, token-id prompts, ``logprobs``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simpipe.answers.shared import SharedAnswers
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.settings import OpenAISettings
from simpipe.inference.types import ChainSettings, TopLogprobs
from simpipe.inference.vllm.sampler import next_token
from simpipe.servers import synthetic_tokens
from simpipe.servers.emulator import EmulatorProcess

MODEL = "simpipe/emulated"


def _exact(logits: np.ndarray, valid: list[int], s: ChainSettings) -> dict[int, float]:
    """vLLM's chain over the whole vocabulary, written out: mask, temperature, min_p,
    top_k, top_p."""
    z = np.full(logits.size, -np.inf)
    z[valid] = logits[valid] / s.temperature
    order = np.argsort(-z, kind="stable")
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = [t for t in order if np.isfinite(z[t])]
    if s.min_p > 0:
        keep = [t for t in keep if p[t] >= s.min_p * p[keep[0]]]
    if s.top_k > 0:
        keep = keep[: s.top_k]
    if s.top_p < 1:
        q = p[keep] / p[keep].sum()
        cut = int(np.nonzero(np.cumsum(q) >= s.top_p)[0][0]) + 1
        keep = keep[:cut]
    q = p[keep] / p[keep].sum()
    return dict(zip(keep, q.tolist(), strict=True))


@pytest.mark.parametrize("settings", [
    ChainSettings(1.0), ChainSettings(0.7), ChainSettings(1.3, top_p=0.8),
    ChainSettings(1.0, top_k=3), ChainSettings(0.9, min_p=0.1),
    ChainSettings(1.0, top_p=0.9, top_k=4, min_p=0.05)])
def test_vllm_sampler_matches_the_chain_written_out(settings: ChainSettings) -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2, 50)
    logp = logits - np.log(np.exp(logits).sum())
    valid = [3, 8, 11, 20, 33, 41]
    order = np.argsort(-logp)
    top = TopLogprobs(tuple(order.tolist()), tuple(logp[order].tolist()), complete=True)
    got = next_token(top, valid, 0, settings)
    want = _exact(logp, valid, settings)
    assert got is not None and got.error_bound == 0.0
    assert set(got.probs) == set(want)
    for t, q in want.items():
        assert math.isclose(got.probs[t], q, rel_tol=1e-9)


def test_vllm_sampler_bounds_unseen_valid_tokens() -> None:
    # Two valid tokens listed, one valid token unlisted (below the floor of -6).
    top = TopLogprobs((1, 2, 3), (-0.1, -2.0, -6.0))
    got = next_token(top, {2, 3, 9}, 1, ChainSettings(1.0))
    assert got is not None and 0 < got.error_bound < 0.02
    assert got.probs[2] > got.probs[3]
    assert next_token(TopLogprobs((1,), (-0.1,)), {9}, 1, ChainSettings(1.0)) is None
    greedy = next_token(top, {2, 9}, 1, ChainSettings(0.0))
    assert greedy is not None and greedy.probs == {2: 1.0}


def _walk_exact(prompt_ids: list[int], vocab_pieces: dict[int, str], max_tokens: int,
                s: ChainSettings) -> dict[str, float]:
    """The answer distribution from the emulator's whole synthetic vocabulary."""
    from simpipe.games.answer_format import IntegerAnswers

    lang = IntegerAnswers(0, 100)
    out: dict[str, float] = {}
    stack = [((), "", 1.0)]
    while stack:
        path, text, reach = stack.pop()
        if len(path) >= max_tokens:
            out[text] = out.get(text, 0) + reach
            continue
        valid = [t for t, p in vocab_pieces.items() if lang.is_prefix(text + p)]
        if lang.is_complete(text):
            valid.append(synthetic_tokens.EOS_ID)
        if valid == [synthetic_tokens.EOS_ID] or not valid:
            out[text] = out.get(text, 0) + reach
            continue
        full = synthetic_tokens.top_logprobs([*prompt_ids, *path], synthetic_tokens.VOCAB)
        logp = np.full(synthetic_tokens.VOCAB, -np.inf)
        for t, lp in full:
            logp[t] = lp
        for t, q in _exact(logp, valid, s).items():
            if t == synthetic_tokens.EOS_ID:
                out[text] = out.get(text, 0) + reach * q
            else:
                stack.append(((*path, t), text + vocab_pieces[t], reach * q))
    return out


def test_distribution_over_the_emulators_vllm_routes() -> None:
    from simpipe.answers.distribution import answer_distribution
    from simpipe.games.answer_format import IntegerAnswers

    settings = ChainSettings(1.0)
    prompt = "Guess a number from 0 to 100. Answer:"
    with EmulatorProcess(profile="fast", protocol="openai", model_id=MODEL) as emu:
        backend = OpenAIBackend(OpenAISettings(endpoints=emu.urls, model=MODEL,
                                               answer_distributions="vllm"))
        assert backend.supports_answer_distributions
        lang = IntegerAnswers(0, 100)
        vocab = backend.answer_vocab(lang.alphabet)
        assert vocab.eog_ids == {synthetic_tokens.EOS_ID}
        assert sorted(vocab.pieces.values()) == sorted(" -0123456789")
        runs = []
        for _ in range(2):
            with backend.logprob_session(prompt) as probe:
                runs.append(answer_distribution(probe, lang, vocab, settings, 8,
                                                sampler=backend.answer_sampler))
        a, b = runs
        assert a.texts == b.texts and np.array_equal(a.probs, b.probs)  # reproducible
        assert a.calls > 10 and a.tokens_in > 0
        ids = [synthetic_tokens.SPECIALS["<s>"], *synthetic_tokens.tokenize(prompt)]
        want = _walk_exact(ids, vocab.pieces, 8, settings)
        got = dict(zip(a.texts, a.probs.tolist(), strict=True))
        tv = 0.5 * sum(abs(got.get(t, 0) - want.get(t, 0)) for t in set(got) | set(want))
        assert tv <= a.unseen_mass + 1e-9, (tv, a.unseen_mass)
        # and through the cache agents use
        found = SharedAnswers(backend).lookup(prompt, settings, 8, (0.0, 100.0), 1e-3)
        assert found.distribution is not None and found.calls == a.calls


def test_official_client_reads_the_probe_answer() -> None:
    openai = pytest.importorskip("openai")
    with EmulatorProcess(profile="fast", protocol="openai", model_id=MODEL) as emu:
        client = openai.OpenAI(base_url=emu.urls[0] + "/v1", api_key="none")
        ids = [1, 150, 151]
        out = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, logprobs=5,
                                        extra_body={"return_tokens_as_token_ids": True})
        top = out.choices[0].logprobs.top_logprobs[0]
        want = synthetic_tokens.top_logprobs(ids, 5)
        assert top == {f"token_id:{t}": lp for t, lp in want}
        assert out.usage.prompt_tokens == 3 and out.usage.completion_tokens == 1
        with pytest.raises(openai.BadRequestError, match="max allowed: 20"):
            client.completions.create(model=MODEL, prompt=ids, max_tokens=1, logprobs=21)
