"""The emulated GPU's prefix cache on a virtual clock: hits in whole blocks, never the last
prompt token, a bounded budget with least-recently-used eviction, and what it charges."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from simpipe.inference.cost_model import CostModel
from simpipe.servers import synthetic_tokens
from simpipe.servers.emulator import Emulator, EmulatorOptions
from simpipe.servers.emulator_model import GpuScheduler, PrefixCache, prefix_blocks
from simpipe.servers.emulator_profiles import PROFILES, GpuProfile, get_profile

# Prefill 1 s per token, decode steps of 0.01 s: what a request evaluated shows in busy time.
TOY = GpuProfile("toy", "-", "-", "-", max_batch=8, max_batch_prefill_tokens=10_000,
                 max_concurrent_requests=100, prefill_s_per_token=1.0, step_base_s=0.01,
                 step_per_seq_s=0.0, block_size=4, kv_cache_tokens=1000)


def drain(gpu: GpuScheduler) -> None:
    while (t := gpu.next_event_s()) is not None:
        gpu.advance(t)


def run(gpu: GpuScheduler, ids: list[int], at: float | None = None) -> float:
    """One request for the prompt ``ids`` (one token out) after the GPU is idle: the
    prefill seconds it was charged."""
    before = gpu.work_s
    gpu.submit(gpu.clock if at is None else at, object(), len(ids), 1,
               blocks=prefix_blocks(ids, gpu.profile.block_size))
    drain(gpu)
    return gpu.work_s - before - gpu.profile.cost_model().decode_s_per_token


def test_blocks_are_whole_and_leave_out_the_block_with_the_last_token():
    assert len(prefix_blocks(list(range(9)), 4)) == 2
    assert len(prefix_blocks(list(range(8)), 4)) == 1  # the last token's block is not cached
    assert prefix_blocks(list(range(4)), 4) == () and prefix_blocks(list(range(9)), 0) == ()
    a = prefix_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = prefix_blocks([1, 2, 3, 4, 0, 6, 7, 8, 9], 4)
    assert a[0] == b[0] and a[1] != b[1]  # a block's key covers everything before it
    c = prefix_blocks([0, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert c[0] != a[0] and c[1] != a[1]


def test_a_repeated_prompt_pays_only_what_follows_its_cached_blocks():
    gpu = GpuScheduler(TOY)
    prompt = list(range(11))  # blocks [0..3], [4..7]; 8, 9, 10 after them
    assert run(gpu, prompt) == pytest.approx(11.0)
    assert run(gpu, prompt) == pytest.approx(3.0)
    assert run(gpu, [*prompt[:6], 99, 98, 97]) == pytest.approx(5.0)  # one block in common
    counters = gpu.counters()
    assert counters["tokens_cached"] == 8 + 4 and counters["tokens_in"] == 11 + 11 + 9
    # never the last token: a prompt of whole blocks still evaluates its last block
    assert run(gpu, prompt[:8]) == pytest.approx(4.0)


def test_requests_admitted_in_one_step_share_their_blocks():
    gpu = GpuScheduler(TOY)
    prompt = list(range(11))
    for _ in range(3):
        gpu.submit(0.0, object(), len(prompt), 1, blocks=prefix_blocks(prompt, 4))
    drain(gpu)
    assert gpu.counters()["tokens_cached"] == 2 * 8
    assert gpu.busy_s == pytest.approx(11 + 3 + 3 + 0.01)  # one step: its prefill and decode


def test_the_budget_evicts_least_recently_used_blocks_deepest_first():
    # four blocks, one of them held by the running request's generated token: room for 3
    gpu = GpuScheduler(dataclasses.replace(TOY, kv_cache_tokens=16))
    a = list(range(9))  # two blocks
    c = list(range(100, 109))  # two other blocks
    run(gpu, a)
    run(gpu, c)
    counters = gpu.counters()
    # a's second block went first (its deeper block), then c's two and a's first remain
    assert counters["cache_blocks"] == 3 and counters["cache_evicted"] == 1
    assert run(gpu, a) == pytest.approx(5.0)  # its first block still hit


def test_running_sequences_take_their_generated_tokens_from_the_budget():
    cache = PrefixCache(4, 3)
    cache.store(prefix_blocks(list(range(9)), 4), room=1)
    assert len(cache) == 1 and cache.evicted == 1
    assert cache.hits(prefix_blocks(list(range(9)), 4)) == 1


def test_without_prefix_caching_every_token_is_evaluated():
    gpu = GpuScheduler(dataclasses.replace(TOY, prefix_caching=0))
    prompt = list(range(11))
    assert run(gpu, prompt) == run(gpu, prompt) == pytest.approx(11.0)
    assert gpu.counters()["tokens_cached"] == 0


def test_work_is_the_cost_model_the_planner_uses():
    profile = PROFILES["a100-llama3-8b"]
    model = profile.cost_model()
    assert isinstance(model, CostModel) and model.prefix_block == 16
    assert model.decode_s_per_token == pytest.approx(profile.step_s(256) / 256)
    gpu = GpuScheduler(profile)
    prompt = list(range(100))
    for _ in range(2):
        gpu.submit(gpu.clock, object(), len(prompt), 3, blocks=prefix_blocks(prompt, 16))
        drain(gpu)
    expected = (model.request_cost_s(100, 3) + model.request_cost_s(100, 3, model.cached(100, 100)))
    assert gpu.work_s == pytest.approx(expected)
    assert model.cached(100, 100) == 96 and model.cached(100, 20) == 16


def test_profile_switches_and_block_size_are_checked():
    assert get_profile("a100-llama3-8b", {"prefix_caching": 0}).cost_model().prefix_block == 0
    assert get_profile("a100-llama3-8b", {"block_size": 32}).cost_model().prefix_block == 32
    for bad in ({"prefix_caching": 2}, {"block_size": 0}, {"kv_cache_tokens": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            get_profile("a100-llama3-8b", bad)


def test_a_probe_reuses_the_blocks_its_text_prompt_left_over_http():
    text = "The rules of the game, then a persona, then the history. " * 4
    bodies = ({"model": "m", "prompt": text, "max_tokens": 2},
              {"model": "m", "prompt": [*synthetic_tokens.prompt_ids(text), 105],
               "max_tokens": 1, "logprobs": 5})

    async def go():
        options = EmulatorOptions(get_profile("a100-llama3-8b"), protocol="openai",
                                  model_id="m", time_scale=100.0)
        async with Emulator(options) as fleet, aiohttp.ClientSession() as s:
            for body in bodies:  # one after the other: the probe finds the text's blocks
                async with s.post(fleet.urls[0] + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
            return fleet.stats(0)

    stats = asyncio.run(go())
    n = len(synthetic_tokens.prompt_ids(text))
    assert stats["tokens_cached"] == (n - 1) // 16 * 16 > 0
    # the probe decodes one token whatever its top token's text
    assert stats["tokens_out"] == 2 + 1
