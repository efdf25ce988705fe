"""What a request costs a GPU server: the one price list of the emulator and the planner.

A ``CostModel`` prices one request in GPU seconds on a server whose batch is kept full:
its prompt tokens that were not served from the server's prefix cache, times
``prefill_s_per_token``, plus its generated tokens (all samples), times
``decode_s_per_token`` (a decode step's time divided by the sequences it serves), plus a
fixed ``request_s``. The emulated servers charge exactly this for every request they finish
(``simpipe.servers.emulator_model``: their ``work_s``, which ``simpipe.run.estimate`` reports per
round as the fleet's GPU time), and the round plan prices its choices with it
(``simpipe.answers.planner``), so what the plan predicts and what the emulated fleet
charges are one function: ``request_s``.

Prefix caching (vLLM's automatic prefix caching, on by default in its V1 engine): the KV
cache is kept in blocks of ``prefix_block`` tokens, each keyed by the hash of the tokens up
to its end, so a request reuses the longest run of whole blocks another request left in the
cache, and never its last prompt token (the request needs that token's logits);
``prefix_block`` 0: no prefix caching (every prompt token is evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Characters per token where a prompt is not tokenized: the emulator's rule
#: (``simpipe.servers.synthetic_tokens``), and about what English text averages with the
#: Llama and GPT tokenizers.
CHARS_PER_TOKEN = 4


def approx_tokens(chars: int) -> int:
    """Tokens of a text of ``chars`` characters, at least 1 (``CHARS_PER_TOKEN`` each)."""
    return max(1, chars // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class CostModel:
    """GPU seconds per request on a kept-full server (see the module docstring)."""

    prefill_s_per_token: float
    decode_s_per_token: float
    request_s: float = 0.0
    prefix_block: int = 0  # tokens per cache block; 0: no prefix caching
    source: str = ""

    def cached(self, tokens_in: int, known: int) -> int:
        """Of a prompt of ``tokens_in`` tokens whose first ``known`` are in the server's
        cache, the tokens the server reuses: whole blocks, never the last token."""
        if self.prefix_block <= 0 or tokens_in <= 1:
            return 0
        usable = min(known, tokens_in - 1)
        return max(0, usable) // self.prefix_block * self.prefix_block

    def request_cost_s(self, tokens_in: int, tokens_out: float, cached_in: int = 0) -> float:
        """One request: ``tokens_in`` prompt tokens of which ``cached_in`` come from the
        prefix cache (at least one is evaluated), ``tokens_out`` generated tokens over all
        its samples."""
        evaluated = max(1, tokens_in - cached_in) if tokens_in > 0 else 0
        return (evaluated * self.prefill_s_per_token + tokens_out * self.decode_s_per_token
                + self.request_s)


#: What a request costs llama.cpp's own server where nothing else is known: Gemma 3 270M on
#: two CPU cores, measured here (docs/shared-answers.md, "Which prompts are shared"): a fresh
#: prompt evaluation ~200 ms for ~110 tokens, a one-token probe on a cached prefix ~27 ms
#: through the server's top-n; a slot reuses its last prompt's longest common prefix, token
#: by token.
LLAMACPP_GEMMA3_270M = CostModel(
    prefill_s_per_token=1.8e-3, decode_s_per_token=0.027, request_s=0.0, prefix_block=1,
    source="default: llama.cpp's server, Gemma 3 270M on 2 CPU cores (measured here)")

#: What a request costs a vLLM server where nothing else is known: Llama 3 8B on one A100
#: (the paper's GPUs), the figures of the emulator's ``a100-llama3-8b`` profile (fitted to
#: the vLLM post of 2024-09-05: docs/emulator.md, "Profiles"), with vLLM V1's automatic
#: prefix caching in blocks of 16 tokens. ``agents.cost`` overrides it key by key.
VLLM_A100_LLAMA3_8B = CostModel(
    prefill_s_per_token=6.844e-5, decode_s_per_token=2.168e-4, request_s=0.0, prefix_block=16,
    source="default: vLLM, Llama 3 8B on one A100 (the a100-llama3-8b profile's figures)")
