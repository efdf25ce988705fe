"""One bad answer costs one agent, never the run: the tgi and openai back-ends against a
real server on a real socket that answers the way a broken or hostile server could.

Each batch mixes a hostile answer (seed 0) with a good one (seed 1), so every test also
shows that the good agent beside the bad one is unaffected.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from simpipe.config.model import ConfigError
from simpipe.inference.base import GenerationRequest, GenerationResult
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.http.tgi import TgiBackend
from simpipe.inference.settings import OpenAISettings, TgiSettings

from hostile_server import (
    HostileServer,
    Request,
    endless_chunked_body,
    endless_header_value,
    endless_headers,
    http,
    ok_json,
    openai_answer,
    tgi_answer,
)
from support import small_config

FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 20}
#: What an "endless" answer sends at most here: far past every bound, yet what a client
#: without bounds would buffer stays affordable on a shared machine.
FLOOD = 256 * 2**20
TOKEN = "sk-redteam-S3cr3tT0k3nTh4tMustN3v3rB3St0r3d-0123456789"


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def seed_of(req: Request) -> int:
    body = req.json()
    return body["parameters"]["seed"] if "parameters" in body else body["seed"]


def generate(backend: str, url: str, requests: list[GenerationRequest],
             **settings) -> tuple[list[GenerationResult], dict]:
    async def go():
        if backend == "tgi":
            b = TgiBackend(TgiSettings(endpoints=[url], **{**FAST, **settings}))
        else:
            b = OpenAIBackend(OpenAISettings(endpoints=[url], **{**FAST, **settings}))
        try:
            return await b.generate(requests), b.counters()
        finally:
            await b.aclose()

    return asyncio.run(go())


def bad_then_good(backend: str, reply: bytes, chat: bool = False, **settings):
    """Seed 0 gets ``reply``, seed 1 a good answer; returns both results."""
    good = tgi_answer("42") if backend == "tgi" else openai_answer("42")

    def answer(req: Request) -> bytes:
        return reply if seed_of(req) == 0 else good

    if chat:
        reqs = [GenerationRequest(messages=({"role": "user", "content": "Guess"},), seed=s)
                for s in (0, 1)]
    else:
        reqs = [GenerationRequest(prompt="Guess:", seed=s) for s in (0, 1)]
    with HostileServer(answer) as url:
        results, _ = generate(backend, url, reqs, retries=0, **settings)
    return results


def raw_json(body: bytes, status: int = 200) -> bytes:
    return http(status, body, {"Content-Type": "application/json"})


DEEP = b"[" * 100_000 + b"]" * 100_000
MALFORMED = [
    # (back-end, case, answer, what the error must say)
    ("tgi", "text is a number", tgi_answer(30), "generated_text is a number, not text"),
    ("tgi", "text is a list", tgi_answer(["4", "2"]), "generated_text is a list, not text"),
    ("tgi", "text missing", ok_json({"details": {}}), "generated_text is missing"),
    ("tgi", "a JSON list of numbers", ok_json([1, 2]), "is a number, not a JSON object"),
    ("tgi", "an empty JSON list", ok_json([]), "the answer is an empty list"),
    ("tgi", "a JSON string", ok_json("42"), "the answer is a string, not a JSON object"),
    ("tgi", "100,000-deep nesting", raw_json(DEEP), "JSON nested too deeply"),
    ("tgi", "tokens 1e999", raw_json(
        b'{"generated_text": "42", "details": {"generated_tokens": 1e999}}'),
     "details.generated_tokens = inf is not a token count"),
    ("tgi", "tokens 99999999999", tgi_answer("42", 99999999999),
     "details.generated_tokens = 99999999999 is not a token count"),
    ("tgi", "tokens 2**31", tgi_answer("42", 2**31), "= 2147483648 is not a token count"),
    ("tgi", "tokens -5", tgi_answer("42", -5), "details.generated_tokens = -5 is not"),
    ("tgi", "tokens true", tgi_answer("42", True), "details.generated_tokens = True is not"),
    ("tgi", "tokens 2.5", tgi_answer("42", 2.5), "details.generated_tokens = 2.5 is not"),
    ("tgi", "tokens NaN", raw_json(
        b'{"generated_text": "42", "details": {"generated_tokens": NaN}}'),
     "details.generated_tokens = nan is not"),
    ("tgi", "prompt-token header not ASCII digits", tgi_answer("42", 2, "\xb2"),
     "x-prompt-tokens = '\xb2' is not a token count"),
    ("tgi", "prompt-token header too large", tgi_answer("42", 2, "99999999999"),
     "x-prompt-tokens = '99999999999' is not"),
    ("tgi", "details is a string", ok_json({"generated_text": "42", "details": "x"}),
     "details is a string, not a JSON object"),
    ("tgi", "finish_reason is a number", ok_json(
        {"generated_text": "42", "details": {"finish_reason": 1}}),
     "details.finish_reason is a number, not text"),
    ("tgi", "body not UTF-8", raw_json(b'{"generated_text": "\xff\xfe"}'), "UnicodeDecodeError"),
    ("tgi", "body not JSON", raw_json(b"<html>oops</html>"), "JSONDecodeError"),
    ("openai", "text is a number", openai_answer(30), "choices[0].text is a number, not text"),
    ("openai", "a JSON list", ok_json([{"choices": []}]), "the answer is a list, not a JSON"),
    ("openai", "no choices", ok_json({"choices": []}), "choices is not a non-empty list"),
    ("openai", "choices is an object", ok_json({"choices": {"text": "1"}}),
     "choices is not a non-empty list"),
    ("openai", "100,000-deep nesting", raw_json(DEEP), "JSON nested too deeply"),
    ("openai", "usage 1e999", raw_json(
        b'{"choices": [{"text": "42"}], "usage": {"prompt_tokens": 1e999}}'),
     "usage.prompt_tokens = inf is not a token count"),
    ("openai", "usage 99999999999",
     openai_answer("42", {"prompt_tokens": 7, "completion_tokens": 99999999999}),
     "usage.completion_tokens = 99999999999 is not"),
    ("openai", "usage -5", openai_answer("42", {"prompt_tokens": -5}),
     "usage.prompt_tokens = -5 is not"),
    ("openai", "usage is a list", openai_answer("42", [1]), "usage is a list, not a JSON"),
    ("openai", "body not UTF-8", raw_json(b'{"choices": [{"text": "\xff"}]}'),
     "UnicodeDecodeError"),
]


@pytest.mark.parametrize("backend,case,reply,reason", MALFORMED,
                         ids=[f"{m[0]}: {m[1]}" for m in MALFORMED])
def test_a_malformed_answer_is_that_agents_error(backend, case, reply, reason):
    bad, good = bad_then_good(backend, reply)
    assert bad.status == "error" and bad.text is None
    assert reason in bad.error and bad.error.startswith("malformed answer from http://")
    assert "\n" not in bad.error
    assert (good.status, good.text, good.tokens_in, good.tokens_out) == ("ok", "42", 7, 2)


def test_a_chat_answer_whose_content_is_not_text_is_an_error():
    reply = ok_json({"choices": [{"message": {"role": "assistant", "content": 30}}]})
    for backend in ("tgi", "openai"):  # TGI's Messages API has the OpenAI shape
        bad, _ = bad_then_good(backend, reply, chat=True)
        assert bad.status == "error"
        assert "choices[0].message.content is a number, not text" in bad.error


@pytest.mark.parametrize("count", [0, 1, 2**31 - 1])
def test_token_counts_within_the_int32_range_are_kept(count):
    tgi, _ = bad_then_good("tgi", tgi_answer("42", count, str(count)))
    usage = {"prompt_tokens": count, "completion_tokens": count}
    openai, _ = bad_then_good("openai", openai_answer("42", usage))
    for r in (tgi, openai):
        assert (r.status, r.tokens_in, r.tokens_out) == ("ok", count, count)


def test_absent_token_counts_are_zero():
    tgi, _ = bad_then_good("tgi", ok_json({"generated_text": "42"}))
    openai, _ = bad_then_good("openai", ok_json({"choices": [{"text": "42"}]}))
    for r in (tgi, openai):
        assert (r.status, r.text, r.tokens_in, r.tokens_out) == ("ok", "42", 0, 0)


# --- the wire: lies, garbage and protocol switches -------------------------------------------


@pytest.mark.parametrize("case,reply,reason", [
    ("content-length longer than the body, then close",
     b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}",
     "the server closed the connection"),
    ("content-length of a terabyte",
     b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{}",
     "answer larger than 1 MiB from http://"),
    ("content-length not a number", b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n{}",
     "not an HTTP answer"),
    ("status line not HTTP", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP answer"),
    ("a 101 protocol switch",
     b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
     "101"),
    ("status 000", b"HTTP/1.1 000 X\r\nContent-Length: 2\r\n\r\n{}",
     "not an HTTP answer (status 000)"),
    ("a 500 whose body nests 100,000 deep", raw_json(DEEP, 500), "HTTP 500 from"),
    ("a 400 whose error message nests 990 deep",
     http(400, b'{"error": {"message": ' + b"[" * 990 + b"]" * 990 + b"}}"), "HTTP 400 from"),
])
def test_a_broken_http_answer_is_that_agents_error(case, reply, reason, caplog):
    caplog.set_level(logging.ERROR)
    bad, good = bad_then_good("tgi", reply)
    assert bad.status == "error" and reason in bad.error
    assert good.status == "ok" and good.text == "42"
    # Handled, not a protocol crash that asyncio reports as "Fatal error" with a traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_retry_after_header_that_is_not_ascii_digits_is_ignored():
    """'²' passes str.isdigit; float() then raised and failed the whole partition."""
    answers = iter([http(503, b'{"error": "busy"}', {"Retry-After": "\xb2"}), tgi_answer("42")])
    with HostileServer(lambda req: next(answers)) as url:
        (result,), counters = generate("tgi", url, [GenerationRequest(prompt="x")], retries=2)
    assert (result.status, result.text) == ("ok", "42")
    assert next(iter(counters.values()))["retries"] == 1


def test_a_huge_error_message_is_cut_to_one_short_line():
    message = "line one\nline two " + "x" * 1_000_000
    bad, good = bad_then_good("tgi", http(400, json.dumps({"error": message}).encode()))
    assert bad.error.startswith("HTTP 400 from http://") and "line one line two xxx" in bad.error
    assert "\n" not in bad.error and len(bad.error) < 400
    assert good.status == "ok"


def test_bytes_sent_out_of_turn_drop_the_connection():
    """After a good answer the server keeps talking on the idle connection; the client
    must hang up rather than buffer whatever comes, and the next request is answered."""

    async def good_then_endless():
        yield tgi_answer("42")
        async for chunk in endless_chunked_body(FLOOD):
            yield chunk

    def answer(req: Request):
        return good_then_endless() if seed_of(req) == 0 else tgi_answer("7")

    async def go(server: HostileServer, url: str):
        b = TgiBackend(TgiSettings(endpoints=[url], retries=0, **FAST))
        try:
            first = await b.generate([GenerationRequest(prompt="x", seed=0)])
            dropped = await asyncio.to_thread(server.hung_up.wait, 30)
            second = await b.generate([GenerationRequest(prompt="x", seed=1)])
            return first + second, dropped
        finally:
            await b.aclose()

    server = HostileServer(answer)
    with server as url:
        (first, second), dropped = asyncio.run(go(server, url))
    assert (first.status, first.text) == ("ok", "42")
    assert dropped and server.hangups == 1
    assert (second.status, second.text) == ("ok", "7")


# --- size bounds -----------------------------------------------------------------------------


@pytest.mark.parametrize("case,stream,reason", [
    ("endless chunked body", endless_chunked_body, "answer larger than 1 MiB from http://"),
    ("endless headers", endless_headers, "answer headers larger than 64 KiB from http://"),
    ("one endless header value", endless_header_value,
     "answer headers larger than 64 KiB from http://"),
])
def test_an_endless_answer_is_cut_off_and_not_retried(case, stream, reason):

    def answer(req: Request):
        return stream(FLOOD) if seed_of(req) == 0 else tgi_answer("42")

    reqs = [GenerationRequest(prompt="x", seed=s) for s in (0, 1)]
    server = HostileServer(answer)
    with server as url:
        (bad, good), counters = generate("tgi", url, reqs, retries=3, timeout_s=10)
        dropped = server.hung_up.wait(30)
    assert bad.status == "error" and reason in bad.error
    assert good.status == "ok" and good.text == "42"
    assert dropped and server.hangups == 1  # the connection was dropped, not drained
    (c,) = counters.values()
    assert (c["requests"], c["errors"], c["retries"]) == (2, 1, 0)


TEN_MB_TEXT = "4" + " " * 10_000_000


def test_a_ten_megabyte_answer_is_refused_unless_the_bound_is_raised():
    reply = tgi_answer(TEN_MB_TEXT)
    bad, good = bad_then_good("tgi", reply)
    assert bad.status == "error" and "answer larger than 1 MiB from" in bad.error
    assert good.status == "ok"
    big, _ = bad_then_good("tgi", reply, max_response_bytes=16 * 2**20)
    assert big.status == "ok" and big.text == TEN_MB_TEXT


@pytest.mark.parametrize("framing", ["chunked", "until close"])
def test_the_body_bound_holds_without_a_content_length(framing):
    body = json.dumps({"generated_text": "4" + " " * 2_000_000}).encode()
    if framing == "chunked":
        reply = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    else:
        reply = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    bad, good = bad_then_good("tgi", reply)
    assert bad.status == "error" and "answer larger than 1 MiB" in bad.error
    assert good.status == "ok"


@pytest.mark.parametrize("key,bad,good,message", [
    ("agents.tgi.max_response_bytes", 100, 16 * 2**20, "greater than or equal to 4096"),
    ("agents.openai.max_response_bytes", 2**31, 4096, "less than or equal to 1073741824"),
    ("agents.max_raw_chars", -1, 0, "greater than or equal to 0"),
])
def test_the_bounds_are_config_keys_with_a_range(tmp_path, key, bad, good, message):
    *sections, name = key.split(".")[1:]

    def agents(value):
        return {sections[0]: {name: value}} if sections else {name: value}

    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')} = {bad}: .*{message}"):
        small_config(tmp_path, agents=agents(bad))
    config = small_config(tmp_path, agents=agents(good))
    section = getattr(config.agents, sections[0]) if sections else config.agents
    assert getattr(section, name) == good


# --- the API token ---------------------------------------------------------------------------


def pieces_of(secret: str, n: int = 8) -> set[str]:
    return {secret[i:i + n] for i in range(len(secret) - n + 1)}


@pytest.mark.parametrize("env", ["SIMPIPE_API_KEY", "HF_TOKEN"])
def test_an_echoed_token_never_survives_in_an_error_at_any_cut(monkeypatch, env):
    """The server echoes the Authorization header into a long error body, shifted by one
    character per request across the 300-character cut, as plain text and as a JSON
    message; it also echoes only a prefix, or a middle piece, of the token."""
    monkeypatch.setenv(env, TOKEN)
    shifts = 340

    def answer(req: Request) -> bytes:
        seed = seed_of(req)
        echo = req.headers["authorization"]
        if seed >= 3 * shifts:  # a server that cuts the token itself
            k = seed - 3 * shifts
            echo = TOKEN[:8 + k] if k < len(TOKEN) else TOKEN[5:5 + (k - len(TOKEN)) + 8]
            seed = 290
        text = "e" * (seed % shifts) + f"you sent {echo} here" + "f" * 400
        if seed // shifts == 1:
            return http(401, json.dumps({"error": {"message": text}}).encode())
        if seed // shifts == 2:
            return http(401, json.dumps({"error": text, "error_type": "auth"}).encode())
        return http(401, text.encode(), {"Content-Type": "text/plain"})

    reqs = [GenerationRequest(prompt="x", seed=s) for s in range(3 * shifts + 2 * len(TOKEN))]
    with HostileServer(answer) as url:
        results, _ = generate("tgi", url, reqs, retries=0, max_concurrency=16)
    pieces = pieces_of(TOKEN)
    for r in results:
        assert r.status == "error" and r.error.startswith("HTTP 401 from http://")
        assert not [p for p in pieces if p in r.error], r.error
    assert sum("you sent Bearer ***" in r.error for r in results) > shifts
