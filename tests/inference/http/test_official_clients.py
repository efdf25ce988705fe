"""Our servers (the stub and the GPU emulator) and back-ends checked against code nobody here
wrote: the official ``text-generation`` client (TGI) and ``openai`` client drive the servers,
and their pydantic types validate every request body our back-ends send and every answer
our servers give."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import openai
import pytest
import text_generation
from openai.types import Completion
from openai.types import completion_create_params as completion_params
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params
from pydantic import TypeAdapter
from text_generation.types import (
    ChatComplete,
    ChatRequest,
    Grammar,
    GrammarType,
    Parameters,
    Request,
    Response,
    StreamResponse,
)

from simpipe.games.answer_format import number_grammar, number_json_schema, number_regex
from simpipe.inference.base import Backend, GenerationRequest, OutputConstraint
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.http.tgi import TgiBackend
from simpipe.inference.settings import OpenAISettings, TgiSettings
from simpipe.servers.emulator import Emulator, EmulatorOptions
from simpipe.servers.emulator_profiles import get_profile
from simpipe.servers.stub import StubServer

# text-generation 0.7.0 warns on every client that TGI is in maintenance mode.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SERVERS = ["stub", "emulator"]
MODEL = "simpipe/emulated"
NUMBER = OutputConstraint(gbnf=number_grammar(0, 100), regex=number_regex(0, 100),
                          json_schema=number_json_schema(0, 100))
COT = OutputConstraint(gbnf=number_grammar(0, 100, True), regex=number_regex(0, 100, True))
PROMPT = "Pick a number between 0 and 100; the winner is closest to 2/3 of the average. Mine:"

#: The config variants a run can produce: greedy, nucleus sampling, stop sequences, and
#: each kind of output constraint.
VARIANTS = [
    GenerationRequest(prompt=PROMPT, temperature=0.0, seed=1, max_tokens=4),
    GenerationRequest(prompt=PROMPT, temperature=0.7, top_p=0.9, seed=2, max_tokens=4),
    GenerationRequest(prompt=PROMPT, seed=3, max_tokens=4, stop=("\n", ".")),
    GenerationRequest(prompt=PROMPT, seed=4, max_tokens=4, constraint=NUMBER),
    GenerationRequest(prompt=PROMPT, seed=5, max_tokens=8,
                      constraint=OutputConstraint(json_schema=number_json_schema(0, 100))),
    GenerationRequest(prompt=PROMPT, seed=6, max_tokens=64, constraint=COT),
    GenerationRequest(messages=({"role": "user", "content": PROMPT},), seed=7, max_tokens=4,
                      constraint=NUMBER),
]


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


@asynccontextmanager
async def serving(kind: str) -> AsyncIterator[str]:
    """A base URL of the stub or of a one-GPU emulator (fast profile, both protocols)."""
    if kind == "stub":
        async with StubServer() as stub:
            yield stub.url
    else:
        async with Emulator(EmulatorOptions(get_profile("fast"), model_id=MODEL)) as fleet:
            yield fleet.urls[0]


# --- text-generation (TGI) ------------------------------------------------------------------


@pytest.mark.parametrize("kind", SERVERS)
def test_text_generation_client_generate_grammar_stream_and_chat(kind):
    async def go():
        async with serving(kind) as url:
            client = text_generation.AsyncClient(url, timeout=30)
            plain = await client.generate(PROMPT, max_new_tokens=4, seed=1)
            regex = await client.generate(
                PROMPT, max_new_tokens=4, seed=2, do_sample=True, temperature=0.5,
                grammar=Grammar(type=GrammarType.Regex, value=NUMBER.regex))
            top = await client.generate(PROMPT, max_new_tokens=4, seed=3, top_n_tokens=2,
                                        decoder_input_details=True)
            stream = [r async for r in client.generate_stream(PROMPT, max_new_tokens=4,
                                                              seed=1)]
            chat = await client.chat([text_generation.types.Message(role="user",
                                                                    content=PROMPT)],
                                     max_tokens=4, seed=1)
            return plain, regex, top, stream, chat

    plain, regex, top, stream, chat = asyncio.run(go())
    assert isinstance(plain, Response) and 0 <= int(plain.generated_text) <= 100
    assert plain.details.generated_tokens == len(plain.details.tokens) > 0
    assert 0 <= int(regex.generated_text.strip()) <= 100
    assert top.details.top_tokens and top.details.prefill
    assert all(isinstance(r, StreamResponse) for r in stream)
    assert "".join(r.token.text for r in stream) == plain.generated_text  # same seed
    assert stream[-1].generated_text == plain.generated_text and stream[-1].details
    assert all(r.details is None for r in stream[:-1])
    assert isinstance(chat, ChatComplete) and chat.choices[0].message.content


async def record_and_replay(make_backend: Callable[[str], Backend]):
    """Send ``VARIANTS`` through a real back-end to the stub (which records each body), then
    post every recorded body to each server; TGI ``/generate`` bodies also to ``POST /``
    (the official client's route). The results, the bodies, ``{(server, i[, "/"]): (status,
    answer)}``."""
    async with StubServer() as stub:
        backend = make_backend(stub.url)
        results = await backend.generate(VARIANTS)
        await backend.aclose()
        bodies = stub.bodies
    answers = {}
    for kind in SERVERS:
        async with serving(kind) as url, aiohttp.ClientSession() as s:
            for i, rec in enumerate(bodies):
                async with s.post(url + rec["path"], json=rec["body"]) as r:
                    answers[kind, i] = (r.status, await r.json())
                if rec["path"] == "/generate":
                    async with s.post(url + "/", json=rec["body"]) as r:
                        answers[kind, i, "/"] = (r.status, await r.json())
    return results, bodies, answers


def _strict_keys(body: dict, model: type, allowed_extra: set[str] = frozenset()) -> None:
    unknown = set(body) - set(model.model_fields) - allowed_extra
    assert not unknown, f"{model.__name__} has no field(s) {sorted(unknown)}: {body}"


def test_tgi_backend_bodies_and_server_answers_pass_the_official_types():
    """Every body ``TgiBackend`` sends (recorded at the stub) is a valid ``Request`` (or a TGI
    ``ChatRequest``), and both servers' answers to it are valid ``Response``s."""

    results, bodies, answers = asyncio.run(
        record_and_replay(lambda url: TgiBackend(TgiSettings(endpoints=[url]))))
    assert [r.status for r in results] == ["ok"] * len(VARIANTS), [r.error for r in results]
    assert len(bodies) == len(VARIANTS)
    for i, rec in enumerate(bodies):
        body = rec["body"]
        if rec["path"] == "/v1/chat/completions":
            ChatRequest.model_validate(body)
            # TGI's router takes these two; the 0.7.0 client's ChatRequest lacks them
            _strict_keys(body, ChatRequest, {"stop", "response_format"})
        else:
            Request.model_validate(body)
            _strict_keys(body, Request)
            _strict_keys(body["parameters"], Parameters)
        for kind in SERVERS:
            status, answer = answers[kind, i]
            assert status == 200, (kind, body, answer)
            if rec["path"] == "/v1/chat/completions":
                ChatComplete.model_validate(answer)
                continue
            Response.model_validate(answer)
            status, listed = answers[kind, i, "/"]
            assert status == 200 and len(listed) == 1
            Response.model_validate(listed[0])


# --- openai ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SERVERS)
def test_openai_client_completions_chat_models_and_streams(kind):
    async def go():
        async with serving(kind) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            model = MODEL if kind == "emulator" else "simpipe/stub"
            completion = await client.completions.create(model=model, prompt=PROMPT,
                                                         max_tokens=4, seed=1, logprobs=2)
            chat = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                seed=1, logprobs=True, top_logprobs=2)
            models = [m.id async for m in client.models.list()]
            chunks = [c async for c in await client.completions.create(
                model=model, prompt=PROMPT, max_tokens=4, seed=1, stream=True)]
            chat_chunks = [c async for c in await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                seed=1, stream=True, stream_options={"include_usage": True})]
            await client.close()
            return completion, chat, models, chunks, chat_chunks

    completion, chat, models, chunks, chat_chunks = asyncio.run(go())
    text = completion.choices[0].text
    assert 0 <= int(text) <= 100 and completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].logprobs.tokens == list(text)
    assert completion.usage.completion_tokens == len(text)
    assert 0 <= int(chat.choices[0].message.content) <= 100
    assert [e.token for e in chat.choices[0].logprobs.content] == list(
        chat.choices[0].message.content)
    assert len(models) == 1
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(isinstance(c, ChatCompletionChunk) for c in chat_chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chat_chunks[-1].usage.completion_tokens == len(streamed)


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("constraint", ["auto", "grammar", "json_schema", "guided_regex"])
def test_openai_backend_bodies_and_server_answers_pass_the_official_types(api, constraint):
    """Every body ``OpenAIBackend`` sends is valid ``CompletionCreateParams`` (chat or not);
    its extra fields are only the documented server extensions; both servers' answers are
    valid ``Completion`` / ``ChatCompletion`` objects."""

    results, bodies, answers = asyncio.run(record_and_replay(
        lambda url: OpenAIBackend(OpenAISettings(endpoints=[url], model=MODEL, api=api,
                                                 constraint=constraint))))
    assert [r.status for r in results] == ["ok"] * len(VARIANTS), [r.error for r in results]
    extensions = {"grammar", "json_schema", "structured_outputs"}  # llama.cpp's and vLLM's
    for i, rec in enumerate(bodies):
        body = rec["body"]
        chat = rec["path"] == "/v1/chat/completions"
        params = (chat_params.CompletionCreateParamsNonStreaming if chat
                  else completion_params.CompletionCreateParamsNonStreaming)
        TypeAdapter(params).validate_python(body)
        unknown = set(body) - set(params.__annotations__) - set(
            chat_params.CompletionCreateParamsBase.__annotations__ if chat
            else completion_params.CompletionCreateParamsBase.__annotations__)
        assert unknown <= extensions, unknown
        for kind in SERVERS:
            status, answer = answers[kind, i]
            assert status == 200, (kind, body, answer)
            (ChatCompletion if chat else Completion).model_validate(answer)


def test_servers_answer_validation_errors_the_clients_can_read():
    async def go():
        out = {}
        for kind in SERVERS:
            async with serving(kind) as url:
                tgi = text_generation.AsyncClient(url, timeout=30)
                try:
                    await tgi.generate("", max_new_tokens=4)
                except Exception as exc:  # noqa: BLE001 - the client's own error type
                    out[kind, "tgi"] = type(exc).__name__
                client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none",
                                            max_retries=0)
                try:
                    await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
                except openai.BadRequestError as exc:
                    out[kind, "openai"] = (exc.status_code, json.dumps(exc.body))
                await client.close()
        return out

    out = asyncio.run(go())
    for kind in SERVERS:
        # the client refuses an empty prompt itself; our servers' 400 is readable
        assert out[kind, "tgi"] == "ValidationError"
        status, body = out[kind, "openai"]
        assert status == 400 and "max_tokens must be at least 1" in body
