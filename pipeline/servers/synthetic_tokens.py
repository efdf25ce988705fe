"""The emulator's tokenizer and next-token log-probabilities, for its vLLM routes.

There is no model here, so both are synthetic but fixed: the same text gives the same token
ids and the same token ids the same log-probabilities, on every run and in every process.

Tokenizer: a special token's text (``</s>``) is that token; a text of 1 to 3 characters is
one token per character (numbers digit by digit, as the Llama 2 and Mistral tokenizers
split them), id ``CHAR_BASE + ord(c)``; a longer text is one token per 4 characters (as
``contract.prompt_tokens`` counts a prompt), ids hashed from the 4 characters.

Log-probabilities after a sequence of ids: a softmax over ``VOCAB`` ids with logits drawn
from a generator seeded by the ids, where the characters of numbers and the end token get
higher logits than the rest; so an answer walk sees a different, reproducible
distribution for every prompt and prefix, and the top 20 tokens hold nearly all the mass.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

EOS_ID = 2
SPECIALS = {"<s>": 1, "</s>": EOS_ID}
CHAR_BASE = 100
VOCAB = 256  # ids with log-probabilities: the specials and the printable ASCII characters
_HASHED_BASE = 1000
_HASHED_SPAN = 50_000
_FAVOURED = np.array([EOS_ID, *(CHAR_BASE + ord(c) for c in " -0123456789")])


def tokenize(text: str) -> list[int]:
    """The synthetic token ids of ``text`` (see the module docstring)."""
    if text in SPECIALS:
        return [SPECIALS[text]]
    if len(text) <= 3:
        return [CHAR_BASE + ord(c) if ord(c) < VOCAB - CHAR_BASE else _hashed(c) for c in text]
    n = len(text) // 4
    return [_hashed(text[4 * i: 4 * i + 4] if i < n - 1 else text[4 * i:]) for i in range(n)]


def prompt_ids(text: str) -> list[int]:
    """The ids a text prompt is evaluated as: ``<s>`` then its tokens (what ``POST
    /tokenize`` answers with ``add_special_tokens``, and so what a probe's token-id prompt
    starts with: the prefix cache sees a text request and a probe of the same prompt alike)."""
    return [SPECIALS["<s>"], *tokenize(text)]


def _hashed(chunk: str) -> int:
    return _HASHED_BASE + zlib.crc32(chunk.encode()) % _HASHED_SPAN


def token_text(tid: int) -> str:
    """What an id renders as (hashed ids: a placeholder, their text is not kept)."""
    for text, sid in SPECIALS.items():
        if sid == tid:
            return text
    if CHAR_BASE + 32 <= tid < VOCAB:
        return chr(tid - CHAR_BASE)
    return f"<{tid}>"


def top_logprobs(ids: Sequence[int], k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely next ids after ``ids`` with their log-probabilities, most
    likely first (ties by id)."""
    seed = zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes())
    rng = np.random.default_rng(seed)
    logits = rng.normal(-4.0, 1.0, VOCAB)
    logits[_FAVOURED] = rng.normal(3.0, 1.5, _FAVOURED.size)
    logits[:32] = -30.0  # control characters and unused specials, except the end token
    logits[EOS_ID] = rng.normal(2.0, 1.5)
    logp = logits - logits.max()
    logp -= np.log(np.exp(logp).sum())
    order = np.lexsort((np.arange(VOCAB), -logp))[:k]
    return [(int(t), float(logp[t])) for t in order]
