"""An answer tree's probes over HTTP all go to one server (the prompt's hash picks it), so
each finds the prompt in that server's prefix cache; a server that sits out is passed over."""

from __future__ import annotations

import time

from simpipe.answers.distribution import answer_distribution
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.settings import OpenAISettings
from simpipe.inference.types import ChainSettings
from simpipe.servers.emulator import EmulatorProcess

MODEL = "m"


def test_a_sessions_probes_go_to_one_server():
    with EmulatorProcess(gpus=3, profile="fast", protocol="openai", model_id=MODEL) as emu:
        backend = OpenAIBackend(OpenAISettings(endpoints=emu.urls, model=MODEL,
                                               answer_distributions="vllm"))
        lang = IntegerAnswers(0, 100)
        vocab = backend.answer_vocab(lang.alphabet)
        before = {url: c["requests"] for url, c in backend.counters().items()}
        for prompt in ("Guess a number from 0 to 100. Answer:", "Pick a number. Answer:"):
            with backend.logprob_session(prompt) as probe:
                dist = answer_distribution(probe, lang, vocab, ChainSettings(1.0), 6,
                                           sampler=backend.answer_sampler)
            counts = {url: c["requests"] - before[url]
                      for url, c in backend.counters().items()}
            busy = [url for url, n in counts.items() if n]
            assert len(busy) == 1 and counts[busy[0]] == dist.calls + 1  # + its /tokenize
            before = {url: c["requests"] for url, c in backend.counters().items()}


def test_a_preferred_server_that_sits_out_is_passed_over():
    with EmulatorProcess(gpus=2, profile="fast", protocol="openai", model_id=MODEL) as emu:
        backend = OpenAIBackend(OpenAISettings(endpoints=emu.urls, model=MODEL,
                                               answer_distributions="vllm"))
        pool = backend._pool
        pool._endpoints[0].down_until = time.monotonic() + 60
        assert pool._preferred(0) is pool._endpoints[1]
        assert pool._preferred(1) is pool._endpoints[1]
