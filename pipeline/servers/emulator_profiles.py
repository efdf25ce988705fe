"""Named timing profiles of emulated GPU inference servers, each derived from published numbers.

A profile models one server (one GPU) with continuous batching:

- at most ``max_batch`` sequences run together (vLLM ``--max-num-seqs``, default 256);
- each step admits waiting requests while their prompt tokens fit in
  ``max_batch_prefill_tokens`` (at least one per step; TGI ``--max-batch-prefill-tokens``,
  vLLM ``max_num_batched_tokens``);
- a step takes ``step_base_s + step_per_seq_s * b`` for ``b`` running sequences, plus
  ``prefill_s_per_token`` for every prompt token admitted in it; every running sequence gains
  one token per step, a newly admitted one its first;
- with ``prefix_caching`` (vLLM V1's default) a prompt's tokens in whole ``block_size``
  blocks that an earlier request left in the KV cache are not evaluated again; the cache
  holds ``kv_cache_tokens`` and evicts the least recently used blocks beyond it
  (``emulator_model.PrefixCache``);
- beyond ``max_concurrent_requests`` running + waiting requests, a request is refused with
  TGI's 429 "Model is overloaded" (TGI ``--max-concurrent-requests``, default 128; the
  calibrated profiles allow 1,024, above the 500 requests of the benchmarks they reproduce,
  and ``--emulate`` sets TGI's default or the configured flag for TGI servers).

So a GPU kept full serves ``1 / (n_out * step(B) / B + n_in * prefill)`` requests per second
for ``n_in`` prompt and ``n_out`` generated tokens (``B = max_batch``). The two calibrated
profiles solve that equation for the two unknowns ``c = step(B) / B`` and ``prefill`` from
two published throughputs, and take ``step_base_s`` from the published time per output
token at light load (a step with few sequences). The arithmetic is in docs/emulator.md
("Profiles").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from simpipe.inference.cost_model import CostModel

VLLM_POST = "https://blog.vllm.ai/2024/09/05/perf-update.html"

#: name -> what it means, for ``--help``, config errors and the docs.
PARAMETERS: dict[str, str] = {
    "max_batch": "sequences decoded together (running requests)",
    "max_batch_prefill_tokens": "prompt tokens admitted into one step (at least one request)",
    "max_concurrent_requests": "running + waiting requests; beyond: HTTP 429 overloaded",
    "prefill_s_per_token": "seconds of GPU time per prompt token",
    "step_base_s": "seconds per decode step, fixed part",
    "step_per_seq_s": "seconds per decode step per running sequence",
    "prefix_caching": "1: reuse cached prompt blocks (vLLM's automatic prefix caching); 0: off",
    "block_size": "tokens per KV cache block: what the prefix cache reuses at least",
    "kv_cache_tokens": "tokens the KV cache holds; cached prompt blocks beyond it are "
                       "evicted, least recently used first",
}
#: The largest value of each integer parameter: beyond them a setting is a typo or an attack
#: (a queue of a million requests holds gigabytes), not a GPU server. ``fast`` is at them.
INTEGER_LIMITS = {"max_batch": 65_536, "max_batch_prefill_tokens": 2**30,
                  "max_concurrent_requests": 100_000, "block_size": 1024,
                  "kv_cache_tokens": 2**31}
#: Switches: 0 or 1.
SWITCHES = ("prefix_caching",)
#: Seconds parameters are 0 or within this range: a step of 1e-320 s overflows the model's
#: arithmetic, and one of more than a day never ends a run.
SECONDS_RANGE = (1e-9, 86_400.0)
#: ``time_scale``: modelled seconds per real second.
TIME_SCALE_RANGE = (1e-3, 1e6)
#: The served model's context in tokens (Llama 3 8B's): prompt + token budget.
CONTEXT_TOKENS = 8192
#: Emulated GPUs in one process: each holds a listening socket and its own connections.
MAX_GPUS_PER_PROCESS = 1024
#: vLLM's KV cache block (``--block-size``, 16 on CUDA): the prefix cache's granularity.
BLOCK_SIZE = 16
#: Tokens in the KV cache of Llama 3 8B (bf16) on one 80 GB GPU under vLLM's default
#: ``--gpu-memory-utilization`` 0.9: (79.2 GiB visible x 0.9 - 15.0 GiB of weights - ~2.5
#: GiB of activations) / 128 KiB per token (2 x 32 layers x 8 KV heads x 128 x 2 bytes),
#: about 440,000 tokens (27,500 blocks of 16). Arithmetic, not a measurement.
KV_CACHE_TOKENS_80GB = 440_000


@dataclass(frozen=True)
class GpuProfile:
    """One emulated server's timing (modelled seconds) and limits, with its provenance."""

    name: str
    gpu: str
    model: str
    source: str  # where the numbers come from, and how they were read
    max_batch: int
    max_batch_prefill_tokens: int
    max_concurrent_requests: int
    prefill_s_per_token: float
    step_base_s: float
    step_per_seq_s: float
    context_tokens: int = CONTEXT_TOKENS
    prefix_caching: int = 1  # 1: automatic prefix caching (vLLM V1's default); 0: off
    block_size: int = BLOCK_SIZE
    kv_cache_tokens: int = KV_CACHE_TOKENS_80GB

    def step_s(self, batch: int) -> float:
        """One decode step with ``batch`` running sequences (no prefill)."""
        return self.step_base_s + self.step_per_seq_s * batch

    def cost_model(self) -> CostModel:
        """What a request costs on this server when its batch is full: the price list the
        emulator charges (``work_s``) and the round plan predicts with."""
        return CostModel(self.prefill_s_per_token, self.step_s(self.max_batch) / self.max_batch,
                         0.0, self.block_size if self.prefix_caching else 0,
                         f"emulator profile {self.name}")

    def full_batch_request_s(self, tokens_in: int, tokens_out: int, cached_in: int = 0) -> float:
        """GPU time one request costs when the batch is full: its prompt's prefill (less
        the ``cached_in`` tokens its prefix cache served) and its share of the
        ``tokens_out`` steps it runs in (``CostModel.request_cost_s``)."""
        return self.cost_model().request_cost_s(tokens_in, tokens_out, cached_in)

    def saturated_requests_per_s(self, tokens_in: int, tokens_out: int) -> float:
        return 1.0 / self.full_batch_request_s(tokens_in, tokens_out)

    def parameters(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in PARAMETERS}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_overrides(self, overrides: dict[str, Any]) -> GpuProfile:
        """A copy with some parameters replaced; ValueError naming a bad one."""
        if not overrides:
            return self
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in PARAMETERS:
                raise ValueError(f"unknown emulator parameter {name!r}; known: "
                                 f"{', '.join(PARAMETERS)}")
            changes[name] = _checked(name, value)
        changed = dataclasses.replace(self, **changes)
        if changed.step_s(1) < SECONDS_RANGE[0]:
            raise ValueError(f"emulator parameters step_base_s + step_per_seq_s must be >= "
                             f"{SECONDS_RANGE[0]:g} (a decode step takes some time)")
        return changed


def _checked(name: str, value: Any) -> int | float:
    """``value`` for parameter ``name`` if it is one a GPU server could have; ValueError
    naming the parameter and its range otherwise (NaN and infinities included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"emulator parameter {name} = {value!r}: expected a number")
    if name in SWITCHES:
        if value not in (0, 1):
            raise ValueError(f"emulator parameter {name} = {value!r}: expected 0 or 1")
        return int(value)
    if name in INTEGER_LIMITS:
        top = INTEGER_LIMITS[name]
        if not math.isfinite(value) or value != int(value) or not 1 <= value <= top:
            raise ValueError(f"emulator parameter {name} = {value!r}: expected an integer "
                             f"from 1 to {top:,}")
        return int(value)
    low, high = SECONDS_RANGE
    if not math.isfinite(value) or not (value == 0 or low <= value <= high):
        raise ValueError(f"emulator parameter {name} = {value!r}: expected 0 or seconds "
                         f"from {low:g} to {high:g}")
    return float(value)


@dataclass(frozen=True)
class Workload:
    """A published benchmark workload: average prompt and output tokens, requests per second."""

    name: str
    tokens_in: int
    tokens_out: int
    requests_per_s: float


def fit(name: str, gpu: str, model: str, source: str, calibration: tuple[Workload, Workload],
        light_load_tpot_s: float, max_batch: int = 256, max_batch_prefill_tokens: int = 8192,
        max_concurrent_requests: int = 1024) -> GpuProfile:
    """The profile that serves both calibration workloads at their published rates when
    full: solve ``n_out * c + n_in * prefill = 1 / rate`` for ``c`` and ``prefill``, then
    split ``c = step_base / max_batch + step_per_seq`` with ``step_base`` = the time per
    output token at light load."""
    w1, w2 = calibration
    det = w1.tokens_out * w2.tokens_in - w2.tokens_out * w1.tokens_in
    if det == 0:
        raise ValueError("calibration workloads must differ in their token mix")
    c = (w2.tokens_in / w1.requests_per_s - w1.tokens_in / w2.requests_per_s) / det
    prefill = (w1.tokens_out / w2.requests_per_s - w2.tokens_out / w1.requests_per_s) / det
    per_seq = c - light_load_tpot_s / max_batch
    if prefill <= 0 or per_seq <= 0:
        raise ValueError(f"profile {name}: the calibration gives non-positive costs")
    return GpuProfile(name, gpu, model, source, max_batch, max_batch_prefill_tokens,
                      max_concurrent_requests, prefill, light_load_tpot_s, per_seq)


# Read off the throughput bar charts and TPOT curves of the vLLM post's appendix figures
# (vLLM v0.6.0, --num-scheduler-steps 10, all 500 requests sent at once). The post's text
# gives the workloads: ShareGPT ~202 in / 179 out tokens on average, "prefill-heavy" ~462 in
# / 16 out, "decode-heavy" ~462 in / 256 out.
H100_SHAREGPT = Workload("ShareGPT", 202, 179, 37.0)
H100_PREFILL_HEAVY = Workload("prefill-heavy", 462, 16, 59.0)
H100_DECODE_HEAVY = Workload("decode-heavy", 462, 256, 31.0)
A100_SHAREGPT = Workload("ShareGPT", 202, 179, 19.0)
A100_PREFILL_HEAVY = Workload("prefill-heavy", 462, 16, 28.5)
A100_DECODE_HEAVY = Workload("decode-heavy", 462, 256, 14.8)

_SOURCE = (f"{VLLM_POST}, appendix figures for Llama 3 8B (vLLM v0.6.0): throughput and "
           "time per output token read off the charts")

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        fit("h100-llama3-8b", "1x H100 80GB", "Llama-3-8B", _SOURCE,
            (H100_SHAREGPT, H100_PREFILL_HEAVY), light_load_tpot_s=0.008),
        fit("a100-llama3-8b", "1x A100 80GB", "Llama-3-8B", _SOURCE,
            (A100_SHAREGPT, A100_PREFILL_HEAVY), light_load_tpot_s=0.013),
        # Timings too small to matter: the pipeline, not the fleet, is the limit.
        GpuProfile("fast", "none (pipeline test)", "any",
                   "no source: 0.1 ms per decode step, nothing per token", max_batch=4096,
                   max_batch_prefill_tokens=1 << 30, max_concurrent_requests=100_000,
                   prefill_s_per_token=0.0, step_base_s=1e-4, step_per_seq_s=0.0),
    )
}
#: What each calibrated profile was fitted to, and the published workload it was not.
CALIBRATION: dict[str, tuple[Workload, ...]] = {
    "h100-llama3-8b": (H100_SHAREGPT, H100_PREFILL_HEAVY),
    "a100-llama3-8b": (A100_SHAREGPT, A100_PREFILL_HEAVY),
}
HELD_OUT: dict[str, tuple[Workload, ...]] = {
    "h100-llama3-8b": (H100_DECODE_HEAVY,),
    "a100-llama3-8b": (A100_DECODE_HEAVY,),
}
DEFAULT_PROFILE = "a100-llama3-8b"  # the paper's GPUs


def get_profile(name: str, overrides: dict[str, Any] | None = None) -> GpuProfile:
    """A named profile with per-parameter overrides; ValueError naming what is wrong."""
    base = PROFILES.get(name)
    if base is None:
        raise ValueError(f"unknown emulator profile {name!r}; known: {', '.join(PROFILES)}")
    return base.with_overrides(overrides or {})
