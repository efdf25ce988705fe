"""The emulator over real sockets: overload, modelled time, ports, protocols, stats."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import urllib.request

import aiohttp
import pytest

from simpipe.servers.emulator import Emulator, EmulatorOptions, EmulatorProcess
from simpipe.servers.emulator_profiles import H100_PREFILL_HEAVY, get_profile

# 0.5 s (modelled) per decode step, 1 ms per prompt token: hand-checkable times.
SLOW_STEPS = {"step_base_s": 0.5, "step_per_seq_s": 0.0, "prefill_s_per_token": 0.001}
GENERATE = {"inputs": "x" * 400, "parameters": {"max_new_tokens": 8, "seed": 1}}


def options(profile: str = "fast", overrides: dict | None = None, **kw) -> EmulatorOptions:
    return EmulatorOptions(get_profile(profile, overrides), **kw)


async def until(check, what: str) -> None:
    """Let the server run until ``check()`` holds (bounded: the test fails, never hangs)."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_beyond_max_concurrent_requests_tgi_answers_429_overloaded():
    async def go():
        opts = options(overrides={"max_concurrent_requests": 2, "step_base_s": 3600.0})
        async with Emulator(opts) as fleet, aiohttp.ClientSession() as s:
            url = fleet.urls[0] + "/generate"
            held = [asyncio.ensure_future(s.post(url, json=GENERATE)) for _ in range(2)]
            await until(lambda: fleet.stats(0)["requests"] == 2, "two requests queued")
            async with s.post(url, json=GENERATE) as r:
                third = (r.status, await r.json())
            stats = fleet.stats(0)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return third, stats

    third, stats = asyncio.run(go())
    assert third == (429, {"error": "Model is overloaded", "error_type": "overloaded"})
    assert (stats["requests"], stats["rejected"], stats["completed"]) == (2, 1, 0)


def test_every_reported_duration_is_modelled_gpu_time():
    async def go():
        opts = options("a100-llama3-8b", SLOW_STEPS, time_scale=100.0)
        async with Emulator(opts) as fleet, aiohttp.ClientSession() as s:
            async with s.post(fleet.urls[0] + "/generate", json=GENERATE) as r:
                body, headers = await r.json(), r.headers
            return body, headers, fleet.stats(0)

    body, headers, stats = asyncio.run(go())
    tokens_out = len(body["generated_text"])
    # 100 prompt tokens: first step 0.5 + 0.1, then 0.5 per further token; 100x faster in
    # real time, reported unscaled.
    modelled_ms = 600 + 500 * (tokens_out - 1)
    assert headers["x-inference-time"] == str(modelled_ms)
    assert headers["x-queue-time"] == "0"
    assert headers["x-prompt-tokens"] == "100"
    assert stats["busy_s"] == pytest.approx(modelled_ms / 1000)
    assert stats["now_s"] >= stats["busy_s"] and 0 < stats["busy_fraction"] <= 1
    assert (stats["tokens_in"], stats["tokens_out"]) == (100, tokens_out)
    assert stats["time_scale"] == 100.0 and stats["profile"]["name"] == "a100-llama3-8b"
    assert stats["profile"]["step_base_s"] == 0.5  # the override, reported


def _consecutive_port_options(gpus: int) -> EmulatorOptions:
    return options(gpus=gpus, port=random.Random().randrange(20000, 60000))


def test_each_gpu_listens_on_its_own_consecutive_port_with_its_own_queue():
    async def go():
        for _ in range(10):  # a port in the range may be taken: try another range
            fleet = Emulator(_consecutive_port_options(3))
            try:
                await fleet.start()
                break
            except OSError:
                continue
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(3):
                    async with s.post(fleet.urls[1] + "/generate",
                                      json={**GENERATE, "inputs": f"agent {i}"}) as r:
                        assert r.status == 200
            return fleet.urls, [fleet.stats(i)["completed"] for i in range(3)]
        finally:
            await fleet.stop()

    urls, completed = asyncio.run(go())
    ports = [int(u.rsplit(":", 1)[1]) for u in urls]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    assert completed == [0, 3, 0]


def test_openai_protocol_serves_vllm_routes_and_checks_the_model_name():
    async def go():
        async with Emulator(options(protocol="openai", model_id="llama")) as fleet, \
                aiohttp.ClientSession() as s:
            base = fleet.urls[0]
            out = {}
            async with s.post(base + "/generate", json=GENERATE) as r:
                out["tgi_route"] = r.status
            async with s.get(base + "/info") as r:
                out["info"] = r.status
            body = {"model": "other", "prompt": "Guess:", "max_tokens": 4}
            async with s.post(base + "/v1/completions", json=body) as r:
                out["wrong_model"] = (r.status, (await r.json())["error"]["message"])
            async with s.post(base + "/v1/completions", json={**body, "model": "llama"}) as r:
                out["right_model"] = r.status
            async with s.get(base + "/v1/models") as r:
                out["models"] = [m["id"] for m in (await r.json())["data"]]
            return out

    assert asyncio.run(go()) == {
        "tgi_route": 404, "info": 404,
        "wrong_model": (404, "The model `other` does not exist."),
        "right_model": 200, "models": ["llama"],
    }


def test_stats_series_and_prometheus_counter():
    async def go():
        async with Emulator(options(sample_s=0.01)) as fleet, aiohttp.ClientSession() as s:
            base = fleet.urls[0]
            for i in range(5):
                async with s.post(base + "/generate", json={**GENERATE, "inputs": f"a{i}"}):
                    pass
            await until(lambda: len(fleet.stats(0)["series"]) >= 3, "three samples")
            async with s.get(base + "/emulator/stats") as r:
                stats = await r.json()
            async with s.get(base + "/metrics") as r:
                metrics = await r.text()
            return stats, metrics

    stats, metrics = asyncio.run(go())
    assert stats["series_columns"] == ["t_s", "running", "queued", "busy_s", "work_s",
                                       "completed"]
    times = [row[0] for row in stats["series"]]
    assert times == sorted(times) and all(len(row) == 6 for row in stats["series"])
    assert stats["series"][-1][5] == stats["completed"] == 5
    assert "tgi_request_success 5" in metrics


def test_a_profile_reproduces_its_published_throughput_over_http():
    """vLLM's prefill-heavy benchmark (500 requests at once, ~462 prompt tokens, 16 output
    tokens forced with ignore_eos, as its benchmark script does) against the H100 profile, 4x
    faster than real time; requests per busy modelled second within 10 % of the post's 59."""
    w = H100_PREFILL_HEAVY

    async def go():
        opts = options("h100-llama3-8b", time_scale=4.0, protocol="openai", model_id="m")
        async with Emulator(opts) as fleet:
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(i: int) -> int:
                    body = {"model": "m", "prompt": f"{i:04d}" * w.tokens_in,
                            "max_tokens": w.tokens_out, "ignore_eos": True}
                    async with s.post(fleet.urls[0] + "/v1/completions", json=body) as r:
                        return (await r.json())["usage"]["completion_tokens"]

                outs = await asyncio.gather(*(one(i) for i in range(500)))
            return outs, fleet.stats(0)

    outs, stats = asyncio.run(go())
    assert set(outs) == {w.tokens_out}
    assert stats["tokens_in"] == 500 * w.tokens_in
    assert stats["completed"] / stats["busy_s"] == pytest.approx(w.requests_per_s, rel=0.10)


def test_cli_lists_profiles_and_refuses_bad_options_in_one_line():
    run = [sys.executable, "-m", "simpipe.servers.emulator"]
    listed = subprocess.run([*run, "--list-profiles"], capture_output=True, text=True,
                            check=True).stdout
    assert "a100-llama3-8b: 1x A100 80GB" in listed and "blog.vllm.ai" in listed
    bad = subprocess.run([*run, "--profile", "h200"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "simpipe-emulator: unknown emulator profile 'h200'; known: h100-llama3-8b, "
        "a100-llama3-8b, fast"]


def test_emulator_process_serves_several_gpus():
    with EmulatorProcess(gpus=2, profile="fast") as emu:
        stats = [json.load(urllib.request.urlopen(u + "/emulator/stats", timeout=10))
                 for u in emu.urls]
    assert [s["gpu"] for s in stats] == [0, 1]
    assert stats[0]["gpus_in_process"] == 2 and stats[0]["ports"] == stats[1]["ports"]
