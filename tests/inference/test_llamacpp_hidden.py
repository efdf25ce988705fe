"""Exact answer-token logits from llama.cpp's last hidden state (``llamacpp_hidden``), with
the real Gemma model: equal to llama.cpp's own logits, the same answer distributions as the
server's top-n probes, bit-identical chains, and the server path wherever they do not apply."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from simpipe.bench.invariance import round3_prompts
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference import llamacpp_hidden
from simpipe.inference.answer_distribution import answer_distribution
from simpipe.inference.gguf_vocab import output_matrix
from simpipe.inference.llamacpp import LlamaCppBackend, default_model_path
from simpipe.inference.llamacpp_hidden import (
    GGML_Q8_0,
    AnswerLogits,
    HiddenStateEngine,
    HiddenStateUnavailable,
)
from simpipe.inference.llamacpp_sampler import ChainSettings
from simpipe.inference.settings import LlamaCppSettings

LANG = IntegerAnswers(0, 100)
PLAIN = ChainSettings(1.0)


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=2, threads=2))
    yield b
    asyncio.run(b.aclose())


@pytest.mark.llm
def test_answer_logits_equal_llamacpps_own():
    """After prompts and answer prefixes, the logits computed from the hidden state are
    llama.cpp's (its full-vocabulary decode) to float rounding."""
    path = default_model_path()
    matrix = output_matrix(str(path))
    assert (matrix.name, matrix.ggml_type, matrix.n_embd, matrix.n_vocab) == (
        "token_embd.weight", GGML_Q8_0, 640, 262144)  # tied to the input embeddings
    engine = HiddenStateEngine(path, threads=2, n_ctx=1024)
    try:
        ids = sorted(range(236743, 236790)) + [1, 106, 107]
        logits_of = AnswerLogits(path, ids)
        for text in (*round3_prompts(2), "Guess: 4"):
            tokens = engine.tokenize(text)
            full, hidden = engine.full_logits(tokens)
            gap = np.abs(logits_of(hidden) - full[logits_of.ids]).max()
            assert gap < 1e-4, (text[-20:], gap)
            # the stopped decode (no output projection) leaves the same hidden state
            engine.reset()
            stopped, decoded = engine.hidden_after(tokens)
            assert decoded == len(tokens) and np.array_equal(stopped, hidden)
    finally:
        engine.close()


@pytest.mark.llm
def test_exact_trees_equal_the_servers_and_repeat_bit_for_bit(backend):
    """The same answer trees as the server's top-n probes (within the mass those left
    unseen), with nothing unseen; the same chain gives the same bits again, whatever ran
    on the engine in between; each probe evaluates only what its predecessor did not."""
    vocab = backend.answer_vocab(LANG.alphabet)
    prompts = round3_prompts(4)

    def trees(*exact):
        with backend.logprob_chain(*exact) as probe_for:
            return [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4) for p in prompts]

    server = trees()
    exact = trees(vocab, PLAIN)
    for s, e in zip(server, exact, strict=True):
        got = dict(zip(e.texts, e.probs, strict=True))
        want = dict(zip(s.texts, s.probs, strict=True))
        tv = 0.5 * sum(abs(got.get(t, 0) - want.get(t, 0)) for t in set(got) | set(want))
        assert e.unseen_mass == 0.0 and tv <= s.unseen_mass + 1e-5, tv
        assert e.calls == s.calls > 10
    # the first prompt is decoded whole, the next ones only past their shared prefix
    assert exact[0].tokens_in > 100 and all(e.tokens_in < exact[0].tokens_in
                                            for e in exact[1:])
    trees()  # the server's probes on the same engine in between
    again = trees(vocab, PLAIN)
    assert all(a.texts == e.texts and np.array_equal(a.probs, e.probs)
               for a, e in zip(again, exact, strict=True))


@pytest.mark.llm
def test_truncating_samplers_keep_the_servers_probes(backend):
    """top_p, top_k or min_p make llama.cpp's draw depend on the whole vocabulary: those
    trees come from the server's top-n log-probabilities."""
    vocab = backend.answer_vocab(LANG.alphabet)
    assert backend.exact_answer_logits(vocab, PLAIN) is not None
    for settings in (ChainSettings(1.0, top_p=0.9), ChainSettings(1.0, top_k=40),
                     ChainSettings(1.0, min_p=0.05)):
        assert backend.exact_answer_logits(vocab, settings) is None
        with backend.logprob_chain(vocab, settings) as probe_for:
            top, _, generated = probe_for(round3_prompts(1)[0])((), 64)
        assert not top.complete and len(top.ids) == 64 and generated == 1


@pytest.mark.llm
def test_a_model_whose_logits_are_not_reproduced_keeps_the_servers_probes(
        monkeypatch, caplog):
    """When the check against llama.cpp's own logits fails, the back-end says why once and
    answers every probe through the server."""
    monkeypatch.setattr(AnswerLogits, "__call__",
                        lambda self, hidden: np.zeros(self.ids.size))
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=1, threads=2))
    try:
        vocab = b.answer_vocab(LANG.alphabet)
        with caplog.at_level(logging.WARNING, "simpipe.inference.llamacpp"):
            assert b.exact_answer_logits(vocab, PLAIN) is None
            assert b.exact_answer_logits(vocab, PLAIN) is None
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and "differ from llama.cpp's" in warned[0]
        with b.logprob_chain(vocab, PLAIN) as probe_for:
            top, _, _ = probe_for("My number:")((), 16)
        assert not top.complete and len(top.ids) == 16
    finally:
        asyncio.run(b.aclose())


def test_an_unchecked_xllamacpp_release_is_refused_before_any_struct_is_passed(monkeypatch):
    """Another xllamacpp release may lay llama.cpp's structs out differently; the C API is
    then not touched at all and the message names the release to install."""
    monkeypatch.setattr(llamacpp_hidden, "CHECKED_XLLAMACPP", ("0.0.1",))
    with pytest.raises(HiddenStateUnavailable, match=r"install xllamacpp==0\.0\.1"):
        llamacpp_hidden.llama_api()
