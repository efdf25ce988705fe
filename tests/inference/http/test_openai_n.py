"""Several samples per OpenAI request (``agents.openai.n_per_request``): the official
``openai`` client against the emulator's ``n``, the back-end's grouping of agents into
requests, the emulator's cost of ``n`` (one prefill, n decodes), and, with the real model,
answers shared through one llama.cpp server request against one request per agent."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest
from openai.types import Completion
from pydantic import ValidationError
from scipy.stats import chi2_contingency

from simpipe.games.answer_format import number_grammar, number_regex
from simpipe.inference.base import GenerationRequest, OutputConstraint
from simpipe.inference.http.openai_compat import OpenAIBackend, sample_groups
from simpipe.inference.settings import OpenAISettings
from simpipe.servers.emulator import Emulator, EmulatorOptions
from simpipe.servers.emulator_model import GpuScheduler
from simpipe.servers.emulator_profiles import GpuProfile, get_profile
from simpipe.servers.llamacpp_server import LlamaCppProcess

MODEL = "simpipe/emulated"
PROMPT = "Pick a number between 0 and 100; the winner is closest to 2/3 of the average. Mine:"
NUMBER = OutputConstraint(gbnf=number_grammar(0, 100), regex=number_regex(0, 100))


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def _emulator() -> Emulator:
    return Emulator(EmulatorOptions(get_profile("fast"), model_id=MODEL, protocol="openai"))


def test_openai_client_gets_n_choices_with_logprobs_from_the_emulator():
    async def go():
        async with _emulator() as fleet:
            client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="none",
                                        max_retries=0)
            many = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                                   seed=10, n=5, logprobs=1)
            ones = [await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                                    seed=10 + i) for i in range(5)]
            with pytest.raises(openai.BadRequestError, match="n must be"):
                await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=0)
            stats = fleet.stats(0)
            await client.close()
            return many, ones, stats

    many, ones, stats = asyncio.run(go())
    assert isinstance(many, Completion) and [c.index for c in many.choices] == list(range(5))
    texts = [c.text for c in many.choices]
    # choice i is the answer to seed + i, as llama.cpp's server samples it
    assert texts == [o.choices[0].text for o in ones]
    assert len(set(texts)) > 1
    assert all(c.logprobs.tokens == list(c.text) for c in many.choices)
    # the prompt counts once, the samples' tokens add up
    assert many.usage.prompt_tokens == ones[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(len(t) for t in texts)
    assert stats["requests"] == 6  # the refused n = 0 never queued


def test_sample_groups_follow_agent_order_and_the_cap():
    codes = np.array([1, 0, 1, 1, 0, 1, 1, 2])
    assert sample_groups(codes, 2) == [[1, 4], [0, 2], [3, 5], [6], [7]]
    assert sample_groups(codes, 100) == [[1, 4], [0, 2, 3, 5, 6], [7]]
    assert sample_groups(np.array([], dtype=np.int64), 4) == []


def test_n_per_request_out_of_range_names_the_key():
    for bad in (0, 1025, "4", 2.5):
        with pytest.raises(ValidationError, match="n_per_request"):
            OpenAISettings(n_per_request=bad)


def test_backend_sends_one_request_per_group_and_matches_per_agent_seeds():
    """10 agents on 2 prompts (7 and 3) with n_per_request = 4: 3 requests; each agent's
    answer is the per-agent answer to its group's first seed + its place in the group."""
    distinct = [GenerationRequest(prompt=PROMPT, max_tokens=4, constraint=NUMBER),
                GenerationRequest(prompt=PROMPT + " Really:", max_tokens=4, constraint=NUMBER)]
    codes = np.array([0, 0, 1, 0, 0, 0, 1, 0, 1, 0])
    seeds = np.arange(100, 110, dtype=np.int64) * 7

    async def go():
        async with _emulator() as fleet:
            url = fleet.urls[0]
            shared = OpenAIBackend(OpenAISettings(endpoints=[url], model=MODEL,
                                                  n_per_request=4))
            cols = await shared.generate_many(distinct, codes, seeds)
            requests = shared.counters()[url]["requests"]
            await shared.aclose()
            groups = sample_groups(codes, 4)
            want_seeds = np.zeros_like(seeds)
            for g in groups:
                for j, i in enumerate(g):
                    want_seeds[i] = seeds[g[0]] + j
            single = OpenAIBackend(OpenAISettings(endpoints=[url], model=MODEL))
            per_agent = await single.generate_many(distinct, codes, want_seeds)
            await single.aclose()
            return cols, requests, per_agent, groups

    cols, requests, per_agent, groups = asyncio.run(go())
    assert len(groups) == 3 and requests == 3
    assert cols.error == [None] * 10
    assert cols.text == per_agent.text
    # tokens split over each group, so the column sums are what the server reported
    assert sum(cols.tokens_out) == sum(len(t) for t in cols.text)
    assert sum(cols.tokens_in) < sum(per_agent.tokens_in)


def test_n_samples_cost_one_prefill_in_the_gpu_model():
    profile = GpuProfile("toy", "-", "-", "-", max_batch=8, max_batch_prefill_tokens=1000,
                         max_concurrent_requests=100, prefill_s_per_token=0.01,
                         step_base_s=1.0, step_per_seq_s=0.5)

    def busy(widths: list[int]) -> tuple[float, float]:
        gpu = GpuScheduler(profile)
        for i, w in enumerate(widths):
            assert gpu.submit(0.0, i, 100, 3, width=w)
        while (t := gpu.next_event_s()) is not None:
            gpu.advance(t)
        assert gpu.running == 0 and gpu.completed == len(widths)
        return gpu.busy_s, gpu.work_s

    one_request, one_work = busy([8])
    eight_requests, eight_work = busy([1] * 8)
    # same batch of 8 sequences for 3 steps; the prompt prefilled once instead of 8 times
    assert eight_requests - one_request == pytest.approx(7 * 100 * 0.01)
    assert eight_work - one_work == pytest.approx(7 * 100 * 0.01)
    # wider than the batch: it runs alone on the idle GPU rather than waiting forever
    wide, _ = busy([20, 1])
    assert wide > 0


# --- the real model through llama.cpp's server --------------------------------------------


@pytest.fixture(scope="module")
def llama():
    with LlamaCppProcess(parallel=4) as server:
        yield server


def _answers(url: str, n_per_request: int, agents: int, temperature: float = 1.0) -> list[str]:
    # Unconstrained, two tokens: GBNF costs llama.cpp more than half its speed, and the
    # test compares distributions of whatever text comes back.
    distinct = [GenerationRequest(prompt=PROMPT, max_tokens=2, temperature=temperature)]
    codes = np.zeros(agents, dtype=np.int64)
    # spread seeds, so per-agent calls are not the consecutive seeds of one n-request
    seeds = (np.arange(agents, dtype=np.int64) * 7919 + 13) % (2**31 - 1)

    async def go():
        backend = OpenAIBackend(OpenAISettings(endpoints=[url], max_concurrency=4,
                                               n_per_request=n_per_request))
        cols = await backend.generate_many(distinct, codes, seeds)
        await backend.aclose()
        return cols

    cols = asyncio.run(go())
    assert cols.error == [None] * agents, cols.error[:3]
    return [t.strip() for t in cols.text]


def _p_same(a: list[str], b: list[str]) -> float:
    """Chi-square test of homogeneity over answers pooled so each cell expects >= 5."""
    values, counts = np.unique(a + b, return_counts=True)
    keep = {v for v, c in zip(values, counts, strict=True) if c >= 10}
    bins = sorted(keep) + ["other"]
    table = [[sum(1 for x in s if (x if x in keep else "other") == v) for v in bins]
             for s in (a, b)]
    table = [row for row in np.array(table).T if row.sum() > 0]
    return float(chi2_contingency(np.array(table).T)[1])


@pytest.mark.slow
@pytest.mark.llm
def test_answers_shared_by_n_match_per_agent_calls_through_the_real_server(llama):
    """200 agents with one prompt: 200 requests, against 50 requests with n = 4 (llama.cpp's
    server refuses an n above its slots, --parallel 4 here). The two
    answer distributions agree (chi-square, fixed seeds); the same test tells temperature 1
    from 0.3 (its power), and the same seeds give the same answers again."""
    agents = 200
    per_agent = _answers(llama.url, 1, agents)
    shared = _answers(llama.url, 4, agents)
    colder = _answers(llama.url, 4, agents, temperature=0.3)
    assert _p_same(per_agent, shared) > 0.001
    assert _p_same(per_agent, colder) < 0.001
    assert len(set(shared)) > 5  # not one answer
