"""OpenAIBackend: request shapes against the stub, then against real llama.cpp servers
(``python -m simpipe.servers.llamacpp_server``, the default Gemma 270M model)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from simpipe.games.answers import NumberAnswer
from simpipe.inference.answer_checks import MalformedAnswer
from simpipe.inference.base import GenerationRequest, GenerationResult, OutputConstraint
from simpipe.inference.http.openai_compat import OpenAIBackend, decode_llamacpp_answer
from simpipe.inference.settings import OpenAISettings
from simpipe.servers.llamacpp_server import LlamaCppProcess
from simpipe.servers.stub import StubServer

GBNF = 'root ::= "100" | [1-9] [0-9] | [0-9]'
LARK = "%llguidance {}\nstart: /(?:100|[1-9][0-9]|[0-9])/\n"
NUMBER = OutputConstraint(gbnf=GBNF, regex="(100|[1-9]?[0-9])")
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05}
PROMPT = (
    "Every player picks a whole number from 0 to 100. The winner is the player closest to "
    "two thirds of the average. Player {i} picks the number"
)


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


async def stub_bodies(reqs, **settings):
    async with StubServer() as stub:
        backend = OpenAIBackend(OpenAISettings(endpoints=[stub.url], **{**FAST, **settings}))
        try:
            results = await backend.generate(reqs)
        finally:
            await backend.aclose()
        return results, stub.bodies


# --- request shapes (stub) --------------------------------------------------------------------


def test_completions_body_with_auto_constraint():
    req = GenerationRequest(
        prompt="Guess:",
        max_tokens=3,
        temperature=0.5,
        top_p=0.9,
        seed=11,
        stop=("\n",),
        constraint=NUMBER,
    )
    (result,), (rec,) = asyncio.run(stub_bodies([req], model="gemma"))
    assert result.status == "ok" and 0 <= int(result.text) <= 100
    assert result.tokens_in > 0 and result.tokens_out > 0 and result.finish_reason == "stop"
    assert rec["path"] == "/v1/completions"
    assert rec["body"] == {
        "model": "gemma",
        "prompt": "Guess:",
        "max_tokens": 3,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 11,
        "stop": ["\n"],
        "grammar": GBNF,
        "structured_outputs": {"regex": NUMBER.regex},
    }


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("grammar", {"grammar": GBNF}),
        ("lark", {"grammar": LARK}),
        ("guided_regex", {"structured_outputs": {"regex": "(100|[1-9]?[0-9])"}}),
        ("json_schema", {"json_schema": {"type": "integer"}}),
        ("none", {}),
    ],
)
def test_constraint_modes(mode, expected):
    c = OutputConstraint(gbnf=GBNF, regex=NUMBER.regex, json_schema={"type": "integer"},
                         lark=LARK)
    _, (rec,) = asyncio.run(
        stub_bodies([GenerationRequest(prompt="x", constraint=c)], constraint=mode)
    )
    sent = {
        k: v
        for k, v in rec["body"].items()
        if k in ("grammar", "json_schema", "structured_outputs", "guided_regex")
    }
    assert sent == expected


def test_lark_sends_gbnf_for_an_answer_without_an_llguidance_form():
    # chain of thought keeps its GBNF grammar (OutputConstraint.lark is None)
    c = OutputConstraint(gbnf=GBNF, regex=NUMBER.regex)
    _, (rec,) = asyncio.run(
        stub_bodies([GenerationRequest(prompt="x", constraint=c)], constraint="lark"))
    assert rec["body"]["grammar"] == GBNF and "structured_outputs" not in rec["body"]


def test_auto_with_only_a_schema_never_sends_grammar_and_schema_together():
    c = OutputConstraint(json_schema={"type": "integer"})
    _, (rec,) = asyncio.run(stub_bodies([GenerationRequest(prompt="x", constraint=c)]))
    assert rec["body"]["json_schema"] == {"type": "integer"}
    assert rec["body"]["structured_outputs"] == {"json": {"type": "integer"}}
    assert "grammar" not in rec["body"]


def test_chat_api_wraps_prompts_and_messages_always_use_chat():
    reqs = [
        GenerationRequest(prompt="Guess:"),
        GenerationRequest(messages=({"role": "user", "content": "Guess"},)),
    ]
    results, recs = asyncio.run(stub_bodies(reqs, api="chat"))
    assert all(r.status == "ok" for r in results)
    assert [r["path"] for r in recs] == ["/v1/chat/completions"] * 2
    assert recs[0]["body"]["messages"] == [{"role": "user", "content": "Guess:"}]
    _, recs = asyncio.run(stub_bodies(reqs))  # api = "completions"
    assert [r["path"] for r in recs] == ["/v1/completions", "/v1/chat/completions"]


def test_400_is_not_retried_and_keeps_the_message():
    reqs = [GenerationRequest(prompt="x", max_tokens=0), GenerationRequest(prompt="y")]
    (bad, good), recs = asyncio.run(stub_bodies(reqs, retries=3))
    assert bad.status == "error" and "HTTP 400" in bad.error and "max_tokens" in bad.error
    assert good.status == "ok"
    assert len(recs) == 2


def test_llamacpp_answers_are_read_with_the_stop_string_that_ended_them():
    # llama.cpp's own route leaves the stop string out of ``content`` and names it apart;
    # the only stop strings it is sent are the answer's ends, which belong to the answer.
    def answer(**fields):
        return {"content": "", "tokens_evaluated": 175, "tokens_predicted": 3, **fields}

    assert decode_llamacpp_answer(answer(stop_type="word", stopping_word=" 27")) == (
        " 27", 175, 3, "stop")
    assert decode_llamacpp_answer(answer(content=" 5", stop_type="eos", stopping_word="")
                                  ) == (" 5", 175, 3, "stop")
    assert decode_llamacpp_answer(answer(content=" 10", stop_type="limit"))[3] == "length"
    for bad in (answer(stop_type="word", stopping_word=27),
                answer(content=None, stop_type="eos"),
                answer(content=" 5", stop_type="eos", tokens_predicted=-1),
                answer(content=" 5", stop_type=["eos"])):
        with pytest.raises(MalformedAnswer):
            decode_llamacpp_answer(bad)


# --- real llama.cpp servers -------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    with LlamaCppProcess(parallel=4) as server:
        yield server


def _backend(*urls: str, **opts) -> OpenAIBackend:
    return OpenAIBackend(
        OpenAISettings(endpoints=list(urls), **{"max_concurrency": 4, **FAST, **opts})
    )


@pytest.mark.slow
@pytest.mark.llm
def test_grammar_gives_integers_0_to_100_with_usage(llama):
    async def go():
        backend = _backend(llama.url, constraint="grammar")
        try:
            reqs = [
                GenerationRequest(
                    prompt=PROMPT.format(i=i), seed=i, max_tokens=4, constraint=NUMBER
                )
                for i in range(8)
            ]
            return await backend.generate(reqs), backend.counters()
        finally:
            await backend.aclose()

    results, counters = asyncio.run(go())
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert all(r.text.strip().isdigit() and 0 <= int(r.text) <= 100 for r in results)
    assert all(r.tokens_in > 0 and r.tokens_out > 0 for r in results)
    assert counters[llama.url]["requests"] == 8
    assert counters[llama.url]["tokens_out"] == sum(r.tokens_out for r in results)


def _seed_by_seed(url: str, answer: OutputConstraint, max_tokens: int,
                  **opts) -> list[GenerationResult]:
    """One prompt's answers for seeds 0..39, one request at a time (the first, seed 999,
    warms the slot's cache and is left out)."""
    async def go() -> list[GenerationResult]:
        backend = _backend(url, max_concurrency=1, **opts)
        try:
            return await backend.generate([
                GenerationRequest(prompt=PROMPT.format(i=41), seed=s, max_tokens=max_tokens,
                                  constraint=answer) for s in (999, *range(40))])
        finally:
            await backend.aclose()

    results = asyncio.run(go())
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return results[1:]


@pytest.mark.llm
def test_lark_samples_what_gbnf_samples_seed_for_seed(llama):
    # The llguidance form masks the same tokens as the GBNF grammar, so with the same seed
    # the server draws the same answer; only the cost of the mask differs. One request at a
    # time on one prompt: each re-evaluates only the prompt's last token, the same arithmetic
    # for both forms.
    c = OutputConstraint(gbnf=GBNF, lark=LARK)
    gbnf = [r.text for r in _seed_by_seed(llama.url, c, 4, constraint="grammar")]
    lark = [r.text for r in _seed_by_seed(llama.url, c, 4, constraint="lark")]
    assert gbnf == lark
    assert len(set(gbnf)) > 5, gbnf  # a spread of answers, not one forced by the grammar


@pytest.mark.llm
def test_answers_that_no_answer_extends_end_a_decode_sooner_with_the_same_draws(llama):
    # To a known llama.cpp server the game's answer goes with its ends (" 0", " 11" to
    # " 100") as stop strings on llama.cpp's own route: a maximal answer ends there instead
    # of a decode later, with the end of generation the grammar forces. One request at a
    # time on one prompt, as above, so a seed draws the same tokens either way: the same
    # answers, each maximal one a token shorter.
    number = NumberAnswer(0, 100)
    plain = OutputConstraint(gbnf=number.grammar(), lark=number.lark())
    ending = dataclasses.replace(plain, ends=number.ends())
    opts = {"constraint": "lark", "answer_distributions": "llamacpp"}
    full = _seed_by_seed(llama.url, plain, 6, **opts)
    ended = _seed_by_seed(llama.url, ending, 6, **opts)
    assert [r.text for r in ended] == [r.text for r in full]
    assert len({r.text for r in full}) > 5  # a spread of answers
    maximal = [r.text in number.ends() for r in full]
    assert sum(maximal) >= 10
    for was, now, stops in zip(full, ended, maximal, strict=True):
        assert now.tokens_out == was.tokens_out - stops
        assert now.finish_reason == was.finish_reason == "stop"
        assert now.tokens_in == was.tokens_in > 0


@pytest.mark.slow
@pytest.mark.llm
def test_auto_constraint_is_accepted_by_llamacpp(llama):
    # "auto" sends vLLM's structured_outputs beside the GBNF: llama.cpp must ignore it
    async def go():
        backend = _backend(llama.url)
        try:
            return await backend.generate(
                [
                    GenerationRequest(
                        prompt=PROMPT.format(i=1), seed=5, max_tokens=4, constraint=NUMBER
                    )
                ]
            )
        finally:
            await backend.aclose()

    (result,) = asyncio.run(go())
    assert result.status == "ok" and 0 <= int(result.text) <= 100


@pytest.mark.slow
@pytest.mark.llm
def test_chat_completions(llama):
    async def go():
        backend = _backend(llama.url)
        try:
            reqs = [
                GenerationRequest(
                    messages=({"role": "user", "content": "Pick a number from 0 to 100."},),
                    seed=1,
                    max_tokens=4,
                    constraint=NUMBER,
                ),
                GenerationRequest(prompt="Pick a number from 0 to 100.", seed=2, max_tokens=4),
            ]
            return await backend.generate(reqs)
        finally:
            await backend.aclose()

    constrained, free = asyncio.run(go())
    assert constrained.status == "ok" and 0 <= int(constrained.text) <= 100
    assert constrained.tokens_in > 0 and constrained.finish_reason in ("stop", "length")
    assert free.status == "ok" and free.tokens_out > 0


@pytest.mark.slow
@pytest.mark.llm
def test_a_server_killed_mid_batch_is_failed_over(llama):
    doomed = LlamaCppProcess(parallel=4).start()

    async def go():
        backend = _backend(doomed.url, llama.url, retries=4)
        try:
            reqs = [
                GenerationRequest(
                    prompt=PROMPT.format(i=i), seed=i, max_tokens=4, constraint=NUMBER
                )
                for i in range(16)
            ]
            task = asyncio.ensure_future(backend.generate(reqs))
            # Kill once the doomed server holds requests: in flight, not yet answered.
            counters = backend.endpoint_counters()
            while counters[doomed.url].requests == 0:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            doomed.kill()
            return await task, backend.counters()
        finally:
            await backend.aclose()

    try:
        results, counters = asyncio.run(go())
    finally:
        doomed.stop()
    print("counters after the kill:", counters)  # shown with -rP: who served whom
    assert len(results) == 16
    for r in results:
        assert r.status == "ok" or (r.status == "error" and r.error), r
    ok = [r for r in results if r.status == "ok"]
    assert all(0 <= int(r.text) <= 100 for r in ok)
    assert counters[doomed.url]["errors"] >= 1  # the kill is visible in its counters
    served_by_live = sum(r.endpoint == llama.url for r in ok)
    assert served_by_live >= 1 and counters[llama.url]["requests"] >= served_by_live
    errors = sum(r.status == "error" for r in results)
    # every agent is accounted for: answered by one endpoint or marked error
    assert len(ok) + errors == 16
