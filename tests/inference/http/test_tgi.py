"""TgiBackend and the shared HTTP client against the stub server (real sockets, 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest

from simpipe.inference.base import GenerationRequest, OutputConstraint
from simpipe.inference.http.tgi import TgiBackend
from simpipe.inference.settings import TgiSettings
from simpipe.servers.contract import answer_number
from simpipe.servers.stub import StubServer

NUMBER = OutputConstraint(regex="(100|[1-9]?[0-9])")
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05}


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("SIMPIPE_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens here any more


async def with_stub(fn, backend_opts: dict | None = None, **stub_opts):
    """Run ``fn(stub, backend)`` with a fresh stub and a TgiBackend pointed at it."""
    async with StubServer(**stub_opts) as stub:
        opts = {**FAST, **(backend_opts or {})}
        endpoints = opts.pop("endpoints", [stub.url])
        backend = TgiBackend(TgiSettings(endpoints=endpoints, **opts))
        try:
            return await fn(stub, backend)
        finally:
            await backend.aclose()


def test_request_body_has_the_tgi_fields():
    async def go(stub, backend):
        reqs = [
            GenerationRequest(
                prompt="Guess:",
                max_tokens=5,
                temperature=0.7,
                top_p=0.9,
                seed=42,
                stop=("\n",),
                constraint=NUMBER,
            ),
            GenerationRequest(prompt="Guess again:", temperature=0.0, top_p=1.0, seed=7),
        ]
        results = await backend.generate(reqs)
        return results, stub.bodies

    results, bodies = asyncio.run(with_stub(go))
    assert [r.status for r in results] == ["ok", "ok"]
    first, second = (b["body"] for b in bodies)
    assert bodies[0]["path"] == "/generate"
    assert first["inputs"] == "Guess:"
    assert first["parameters"] == {
        "max_new_tokens": 5,
        "seed": 42,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["\n"],
        "grammar": {"type": "regex", "value": NUMBER.regex},
        "details": True,
    }
    # TGI rejects temperature <= 0 and top_p >= 1.0: greedy means do_sample false, no extras
    assert second["parameters"] == {
        "max_new_tokens": 8,
        "seed": 7,
        "do_sample": False,
        "details": True,
    }


def test_answers_come_back_in_request_order_with_details():
    async def go(stub, backend):
        reqs = [
            GenerationRequest(prompt=f"agent {i}", seed=i, constraint=NUMBER) for i in range(300)
        ]
        return reqs, await backend.generate(reqs), backend.counters()

    reqs, results, counters = asyncio.run(with_stub(go, {"max_concurrency": 16}))
    expected = [answer_number(q.seed, q.prompt, NUMBER.regex) for q in reqs]
    assert [r.text for r in results] == expected
    assert all(0 <= int(r.text) <= 100 for r in results)
    assert all(r.finish_reason == "eos_token" and r.tokens_out == len(r.text) for r in results)
    assert all(r.tokens_in > 0 for r in results)  # from TGI's x-prompt-tokens header
    (c,) = counters.values()
    assert c["requests"] == 300 and c["errors"] == 0
    assert c["tokens_out"] == sum(r.tokens_out for r in results)


def test_concurrent_generate_calls_on_one_loop():
    async def go(stub, backend):
        batches = [
            [GenerationRequest(prompt=f"b{b} a{i}", seed=i) for i in range(50)] for b in range(4)
        ]
        outs = await asyncio.gather(*(backend.generate(batch) for batch in batches))
        return batches, outs

    batches, outs = asyncio.run(with_stub(go, {"max_concurrency": 8}))
    for batch, out in zip(batches, outs, strict=True):
        assert [r.text for r in out] == [answer_number(q.seed, q.prompt, None) for q in batch]


def test_429_then_success_is_retried_and_counted():
    async def go(stub, backend):
        return await backend.generate([GenerationRequest(prompt="x")]), backend.counters()

    (result,), counters = asyncio.run(with_stub(go, {"retries": 4}, fail_first=2, fail_status=429))
    assert result.status == "ok"
    (c,) = counters.values()
    assert (c["requests"], c["errors"], c["retries"]) == (3, 2, 2)


def test_500_is_retried():
    async def go(stub, backend):
        return await backend.generate([GenerationRequest(prompt="x")]), backend.counters()

    (result,), counters = asyncio.run(with_stub(go, fail_first=1, fail_status=500))
    assert result.status == "ok"
    assert next(iter(counters.values()))["retries"] == 1


def test_overload_beyond_max_concurrent_is_retried_until_served():
    async def go(stub, backend):
        reqs = [GenerationRequest(prompt=f"p{i}", seed=i) for i in range(12)]
        return await backend.generate(reqs), backend.counters()

    results, counters = asyncio.run(
        with_stub(
            go,
            {"max_concurrency": 6, "retries": 60, "backoff_s": 0.005, "backoff_max_s": 0.02},
            max_concurrent=2,
            delay_s=0.02,
        )
    )
    assert all(r.status == "ok" for r in results)
    assert next(iter(counters.values()))["retries"] > 0


def test_422_is_not_retried_and_keeps_the_server_message():
    async def go(stub, backend):
        reqs = [
            GenerationRequest(prompt=""),
            GenerationRequest(prompt="x", constraint=OutputConstraint(regex="(unclosed")),
            GenerationRequest(prompt="fine"),
        ]
        return await backend.generate(reqs), backend.counters()

    (empty, bad_regex, fine), counters = asyncio.run(with_stub(go, {"retries": 4}))
    assert empty.status == "error" and "`inputs` cannot be empty" in empty.error
    assert "HTTP 422" in empty.error
    assert bad_regex.status == "error" and "grammar is not valid" in bad_regex.error
    assert fine.status == "ok"
    (c,) = counters.values()
    assert (c["requests"], c["errors"], c["retries"]) == (3, 2, 0)


def test_a_delay_beyond_the_timeout_is_retried_then_an_error():
    async def go(stub, backend):
        return await backend.generate([GenerationRequest(prompt="slow")]), backend.counters()

    (result,), counters = asyncio.run(with_stub(go, {"timeout_s": 0.2, "retries": 2}, delay_s=2.0))
    assert result.status == "error" and result.text is None
    assert "timeout" in result.error
    (c,) = counters.values()
    assert (c["requests"], c["errors"], c["retries"]) == (3, 3, 2)


def test_a_dead_endpoint_is_failed_over_and_marked_down_once():
    """A server that refuses DOWN_AFTER times in a row leaves the rotation; run.json and the
    web page show that as marked_down (once, however many requests failed together)."""
    dead = closed_port_url()

    async def go(stub, backend):
        reqs = [GenerationRequest(prompt=f"p{i}", seed=i) for i in range(60)]
        return stub.url, await backend.generate(reqs), backend.counters()

    live, results, counters = asyncio.run(_dead_and_live(dead, go))
    assert all(r.status == "ok" for r in results)
    assert {r.endpoint for r in results} == {live}
    assert counters[dead]["requests"] >= 1
    assert counters[dead]["errors"] == counters[dead]["requests"]
    assert counters[dead]["tokens_out"] == 0
    assert counters[live]["requests"] == 60 and counters[live]["errors"] == 0
    assert counters[dead]["errors"] >= 3 and counters[dead]["marked_down"] == 1
    assert counters[live]["marked_down"] == 0


async def _dead_and_live(dead: str, fn):
    async with StubServer() as stub:
        backend = TgiBackend(TgiSettings(endpoints=[dead, stub.url], max_concurrency=4, **FAST))
        try:
            return await fn(stub, backend)
        finally:
            await backend.aclose()


def test_all_endpoints_dead_gives_per_agent_errors():
    dead = closed_port_url()

    async def go():
        backend = TgiBackend(TgiSettings(endpoints=[dead], retries=2, **FAST))
        try:
            return await backend.generate([GenerationRequest(prompt="x")] * 3), backend.counters()
        finally:
            await backend.aclose()

    results, counters = asyncio.run(go())
    assert all(r.status == "error" and "cannot connect" in r.error for r in results)
    assert counters[dead]["errors"] == 9 and counters[dead]["retries"] == 6


def test_token_is_sent_as_bearer_and_never_shown(monkeypatch):
    secret = "sk-simpipe-very-secret-123"
    monkeypatch.setenv("SIMPIPE_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", "hf-should-not-win")
    dead = closed_port_url()

    async def go(stub, backend):
        ok = await backend.generate([GenerationRequest(prompt="x")])
        bad = await backend.generate([GenerationRequest(prompt="")])  # 422
        return stub.bodies, ok + bad, backend.counters()

    async def dead_only():
        backend = TgiBackend(TgiSettings(endpoints=[dead], retries=1, **FAST))
        try:
            return await backend.generate([GenerationRequest(prompt="x")]), backend.counters()
        finally:
            await backend.aclose()

    bodies, results, counters = asyncio.run(with_stub(go))
    dead_results, dead_counters = asyncio.run(dead_only())
    assert {b["authorization"] for b in bodies} == {f"Bearer {secret}"}
    assert results[0].status == "ok" and results[1].status == "error"
    for r in results + dead_results:
        assert secret not in repr(r)
    assert secret not in json.dumps([counters, dead_counters])


def test_hf_token_is_the_fallback(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf-fallback-token")

    async def go(stub, backend):
        await backend.generate([GenerationRequest(prompt="x")])
        return stub.bodies

    (body,) = asyncio.run(with_stub(go))
    assert body["authorization"] == "Bearer hf-fallback-token"


def test_messages_go_to_the_messages_api():
    async def go(stub, backend):
        msgs = (
            {"role": "system", "content": "You play a game."},
            {"role": "user", "content": "Guess"},
        )
        req = GenerationRequest(messages=msgs, temperature=0.0, seed=3, constraint=NUMBER)
        return await backend.generate([req]), stub.bodies

    (result,), (body,) = asyncio.run(with_stub(go))
    assert result.status == "ok" and 0 <= int(result.text) <= 100
    assert result.tokens_in > 0 and result.tokens_out > 0
    assert body["path"] == "/v1/chat/completions"
    assert body["body"]["messages"][1] == {"role": "user", "content": "Guess"}
    assert body["body"]["response_format"] == {"type": "regex", "value": NUMBER.regex}


def test_runs_on_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def go(stub, backend):
        return await backend.generate(
            [GenerationRequest(prompt=f"u{i}", seed=i) for i in range(40)]
        )

    results = uvloop.run(with_stub(go))
    assert all(r.status == "ok" for r in results)


def test_stub_follows_the_tgi_contract():
    async def go():
        async with StubServer() as stub, aiohttp.ClientSession() as s:
            async with s.get(stub.url + "/health") as r:
                health = r.status
            async with s.get(stub.url + "/info") as r:
                info = await r.json()
            async with s.post(stub.url + "/generate", json={"inputs": "x", "parameters": {}}) as r:
                missing = (r.status, await r.json())
            async with s.post(
                stub.url + "/generate",
                json={"inputs": "x", "parameters": {"max_new_tokens": 2, "top_p": 1.0}},
            ) as r:
                top_p = (r.status, await r.json())
            return health, info, missing, top_p

    health, info, missing, top_p = asyncio.run(go())
    assert health == 200
    assert info["max_concurrent_requests"] == 128 and "model_id" in info
    assert missing[0] == 422 and missing[1]["error_type"] == "validation"
    assert top_p == (422, {"error": "`top_p` must be > 0.0 and < 1.0", "error_type": "validation"})


class _BuggyInfoStub(StubServer):
    def _info(self):
        raise RuntimeError("a bug in a handler")


def test_stub_answers_unknown_routes_and_its_own_bugs_without_hanging():
    async def go():
        async with _BuggyInfoStub() as stub, aiohttp.ClientSession() as s:
            async with s.get(stub.url + "/nowhere") as r:
                missing = r.status
            async with s.get(stub.url + "/generate") as r:
                wrong_method = r.status
            bad = {"inputs": "x", "parameters": {"max_new_tokens": 2, "top_p": "high"}}
            async with s.post(stub.url + "/generate", json=bad) as r:
                mistyped = (r.status, (await r.json())["error_type"])
            async with s.get(stub.url + "/info") as r:
                crashed = (r.status, (await r.json())["error_type"])
            good = {"inputs": "x", "parameters": {"max_new_tokens": 2}}
            async with s.post(stub.url + "/generate", json=good) as r:
                after = r.status
            return missing, wrong_method, mistyped, crashed, after

    assert asyncio.run(go()) == (404, 405, (422, "validation"), (500, "server"), 200)


def test_a_worker_prefers_the_server_on_its_own_node_and_falls_back():
    """Requests go to this node's server while it has room; another node's server only
    takes the overflow (here: the local one has max_concurrency 1 and 8 requests come)."""
    from simpipe.inference.http.backend import EndpointPool

    pool = EndpointPool(TgiSettings(endpoints=["http://127.0.0.1:1", "http://10.255.255.1:1"],
                                    max_concurrency=1))
    local, remote = pool._endpoints
    assert local.local and not remote.local
    assert pool._pick(None) is local
    local.load = 1  # saturated: the remote server takes the next request
    assert pool._pick(None) is remote
    local.load = 0
    local.down_until = time.monotonic() + 60  # down: the remote server again
    assert pool._pick(None) is remote
