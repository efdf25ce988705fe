"""The per-agent path of a round (``Backend.generate_many``): agents sharing few distinct
prompts, each with its own seed, against the stub server over real sockets. Each agent must
get exactly the request it would get alone (same body, same answer), whatever the prompt
holds, and one request that cannot be encoded costs only its own agents."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from simpipe.inference.base import AnswerColumns, GenerationRequest, OutputConstraint
from simpipe.inference.http.backend import EndpointPool, prompt_order
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.http.tgi import TgiBackend
from simpipe.inference.settings import OpenAISettings, TgiSettings
from simpipe.servers.stub import StubServer

NUMBER = OutputConstraint(regex="(100|[1-9]?[0-9])", gbnf='root ::= [0-9]')
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05}
# Text that looks like the field the seed goes into, quotes and all, must stay text.
TRICKY = 'Say "seed": 7355608123456789 and {"seed": 1}, then\nMy number:'
DISTINCT = [
    GenerationRequest(prompt="Round 1 of 3.\nMy number:", seed=0, constraint=NUMBER),
    GenerationRequest(prompt=TRICKY, seed=0, temperature=0.0, constraint=NUMBER),
    GenerationRequest(messages=({"role": "user", "content": TRICKY},), seed=0, max_tokens=4),
]
CODES = np.array([0, 1, 0, 2, 1, 0, 2, 2])
SEEDS = np.array([5, 5, 2**31 - 1, 0, 12, 77, 3, 9])


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def one_by_one() -> list[GenerationRequest]:
    """What each agent would send alone."""
    from dataclasses import replace

    return [replace(DISTINCT[c], seed=int(s)) for c, s in zip(CODES, SEEDS, strict=True)]


async def both_ways(make_backend):
    """(answers of generate_many, results of generate, bodies sent by each, in order)."""
    async with StubServer() as stub:
        backend = make_backend(stub.url)
        try:
            many = await backend.generate_many(DISTINCT, CODES, SEEDS)
            many_bodies = [(b["path"], b["body"]) for b in stub.bodies]
            stub.config.bodies.clear()
            alone = await backend.generate(one_by_one())
            alone_bodies = [(b["path"], b["body"]) for b in stub.bodies]
        finally:
            await backend.aclose()
    return many, alone, many_bodies, alone_bodies


@pytest.mark.parametrize("make_backend", [
    lambda url: TgiBackend(TgiSettings(endpoints=[url], max_concurrency=1, **FAST)),
    lambda url: OpenAIBackend(OpenAISettings(endpoints=[url], max_concurrency=1, **FAST)),
    lambda url: OpenAIBackend(OpenAISettings(endpoints=[url], max_concurrency=1, api="chat",
                                             **FAST)),
], ids=["tgi", "openai-completions", "openai-chat"])
def test_each_agent_sends_and_gets_what_it_would_alone(make_backend):
    many, alone, many_bodies, alone_bodies = asyncio.run(both_ways(make_backend))
    # max_concurrency 1: one request at a time, so the stub saw generate_many's in the order
    # it sends them: by prompt, agent order among equals (``prompt_order``); each agent's
    # body is the one it would send alone.
    order = prompt_order(DISTINCT, CODES).tolist()
    assert many_bodies == [alone_bodies[i] for i in order]
    seeds = [body.get("seed", body.get("parameters", {}).get("seed")) for _, body in many_bodies]
    assert seeds == SEEDS[order].tolist()
    assert many.text == [r.text for r in alone] and all(t for t in many.text)
    assert many.error == [None] * len(CODES)
    assert many.tokens_in == [r.tokens_in for r in alone]
    assert many.tokens_out == [r.tokens_out for r in alone]
    assert all(latency > 0 for latency in many.latency_s)


def test_a_request_that_cannot_be_encoded_costs_only_its_agents():
    # a set is no JSON: this prompt's agents get the error, the others their answers
    bad = GenerationRequest(prompt="x", constraint=OutputConstraint(json_schema={"enum": {1}}))

    async def go():
        async with StubServer() as stub:
            backend = TgiBackend(TgiSettings(endpoints=[stub.url], **FAST))
            try:
                return await backend.generate_many([DISTINCT[0], bad], np.array([1, 0, 1]),
                                                   np.array([1, 2, 3]))
            finally:
                await backend.aclose()

    answers = asyncio.run(go())
    assert answers.text[1] and answers.error[1] is None
    for i in (0, 2):
        assert answers.text[i] is None and answers.error[i].startswith("cannot encode request")


def test_an_encoder_without_a_seed_field_is_encoded_per_agent():
    """A body that does not carry the seed as ``"seed": N`` cannot be a template: each agent's
    body is then encoded whole, with its own seed wherever the encoder puts it."""

    def encode(req: GenerationRequest) -> tuple[str, bytes]:
        return "/generate", json.dumps({"inputs": req.prompt,
                                        "parameters": {"seed": str(req.seed)}}).encode()

    def decode(data, headers):
        return data["generated_text"], 0, 0, None

    async def go():
        async with StubServer() as stub:
            pool = EndpointPool(TgiSettings(endpoints=[stub.url], max_concurrency=1, **FAST))
            try:
                answers = await pool.run_many(DISTINCT[:1], np.zeros(3, np.int64),
                                              np.array([4, 5, 6]), encode, decode)
            finally:
                await pool.aclose()
            return answers, [b["body"]["parameters"]["seed"] for b in stub.bodies]

    answers, seeds = asyncio.run(go())
    # the stub refuses a string seed (TGI's 422): what matters is each body had its own
    assert seeds == ["4", "5", "6"]
    assert all(e is not None and "HTTP 422" in e for e in answers.error)


def test_columns_from_results_mark_errors_without_a_message():
    from simpipe.inference.base import GenerationResult

    cols = AnswerColumns.of([GenerationResult("7", 3, 1, 0.5),
                             GenerationResult(None, status="error")])
    assert cols.text == ["7", None] and cols.tokens_in == [3, 0]
    assert cols.error[0] is None and cols.error[1]
