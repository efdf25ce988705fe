"""Next-token log-probabilities from a vLLM server, for answer distributions over HTTP.

The routes and fields, from vLLM's OpenAI-compatible server (``vllm/entrypoints/openai/
protocol.py``, ``serving_completion.py``, ``serving_tokenization.py``):

- ``POST /tokenize`` ``{"model", "prompt", "add_special_tokens"}`` answers
  ``{"count", "max_model_len", "tokens": [ids], "token_strs"}``. The prompt is tokenized
  once, with special tokens as a text completion prompt is; every probe then sends
  ``prompt`` as a list of token ids (the prompt's, then the answer prefix's).
- ``POST /v1/completions`` with ``max_tokens: 1``, ``logprobs: n`` and
  ``return_tokens_as_token_ids: true`` answers ``choices[0].logprobs.top_logprobs[0]``, a
  dict ``{"token_id:<id>": logprob}`` of the top ``n`` tokens (plus the sampled one when it
  is not among them). vLLM refuses ``n`` above ``--max-logprobs`` (default 20): raise it on
  the server and set ``agents.openai.max_logprobs`` to match. The log-probabilities are the
  raw model's (``--logprobs-mode raw_logprobs``, vLLM's default), which is what the sampler
  model (``simpipe.inference.vllm.sampler``) takes.

The answer vocabulary: every text of at most ``MAX_PIECE_CHARS`` characters of the answer
alphabet (digits, then at most a leading space and sign) is sent to ``/tokenize`` without
special tokens; a text that comes back as one token is that token's piece. Tokenizers that
split numbers into chunks of up to 3 digits (Llama 3, GPT-4's) or digit by digit (Llama 2,
Mistral, Gemma) have no longer answer tokens. End-of-generation ids: each of llama.cpp's
known end-marker texts (``</s>``, ``<|eot_id|>``, ``<end_of_turn>``, ...) that tokenizes
to one token whose token string (``return_token_strs``) is that text: a special token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

from simpipe.inference.answer_checks import (
    probe_count,
    probe_optional_list,
    probe_token_id,
    probe_token_ids,
    probe_top_logprobs,
)
from simpipe.inference.types import (
    EOG_TEXTS,
    AnswerVocab,
    Post,
    PostMany,
    Probe,
    ProbeError,
    TopLogprobs,
    candidate_pieces,
)


def answer_vocab(post_many: PostMany, model: str, alphabet: frozenset[str]) -> AnswerVocab:
    """The answer tokens and end-of-generation ids, asked of the server's tokenizer."""
    texts = candidate_pieces(alphabet)
    eog_texts = sorted(EOG_TEXTS)
    answers = post_many("/tokenize", [
        {"model": model, "prompt": t, "add_special_tokens": False, "return_token_strs": True}
        for t in [*texts, *eog_texts]])
    ids = [_tokens(a) for a in answers]
    pieces = {tokens[0]: text for text, tokens in zip(texts, ids, strict=False)
              if len(tokens) == 1}
    # A special token's string is its text; an ordinary token that happens to spell a
    # marker (``<eos>`` in a vocabulary without it) is not one.
    eog = {tokens[0] for text, tokens, a in zip(eog_texts, ids[len(texts):],
                                                answers[len(texts):], strict=True)
           if len(tokens) == 1 and (_token_strs(a) or [None])[0] == text}
    if not eog:
        raise ProbeError("the server's tokenizer knows none of the end-of-generation texts "
                         f"({', '.join(eog_texts[:4])}, ...)")
    pieces = {t: p for t, p in pieces.items() if t not in eog}
    return AnswerVocab(max([*pieces, *eog]) + 1, frozenset(eog), pieces)


def _tokens(answer: Any) -> list[int]:
    """A ``/tokenize`` answer's ``tokens``, each a token id (``probe_token_ids``)."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise ProbeError(f"/tokenize answered without a token list: {str(answer)[:200]}")
    return probe_token_ids(tokens, "/tokenize tokens")


def _token_strs(answer: dict) -> list | None:
    """A ``/tokenize`` answer's ``token_strs`` (``return_token_strs``): a list, or absent."""
    return probe_optional_list(answer.get("token_strs"), "/tokenize token_strs")


def session(post: Post, model: str, prompt: str, max_logprobs: int) -> Iterator[Probe]:
    """``probe(path, top_n)`` for one prompt (see ``simpipe.inference.types.Probe``); top_n is
    capped at ``max_logprobs`` (the server's ``--max-logprobs``)."""
    prompt_ids = _tokens(post("/tokenize", {"model": model, "prompt": prompt,
                                            "add_special_tokens": True}))
    memo: dict[tuple[tuple[int, ...], int], tuple[TopLogprobs, int, int]] = {}

    def probe(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
        n = min(top_n, max_logprobs)
        key = (path, n)
        if key in memo:  # a wider ask the server caps to the same n: nothing new to learn
            top, _, _ = memo[key]
            return top, 0, 0
        answer = post("/v1/completions", {
            "model": model, "prompt": [*prompt_ids, *path], "max_tokens": 1, "logprobs": n,
            "temperature": 1.0, "seed": 0, "return_tokens_as_token_ids": True})
        memo[key] = found = _top(answer, n)
        return found

    yield probe


def _top(answer: Any, n: int) -> tuple[TopLogprobs, int, int]:
    """(top log-probabilities, prompt tokens, generated tokens) of one probe answer; every
    value checked (``answer_checks.probe_top_logprobs``, ``probe_count``)."""
    field = "choices[0].logprobs.top_logprobs[0]"
    try:
        entries = answer["choices"][0]["logprobs"]["top_logprobs"][0]
        items = list(entries.items())
        usage = answer.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ProbeError("no top log-probabilities in the answer "
                         f"({exc!r}: {json.dumps(answer)[:200]})") from None
    top = probe_top_logprobs([(_token_key(k, field), lp) for k, lp in items], field)
    evaluated = probe_count(prompt_tokens, "usage.prompt_tokens")
    generated = probe_count(completion_tokens, "usage.completion_tokens")
    pairs = sorted(zip(top.logprobs, top.ids, strict=True), key=lambda p: (-p[0], p[1]))
    # The sampled token is added when it is not in the top n: beyond the n-th it would
    # lower the floor below what unlisted tokens may have.
    pairs = pairs[:n]
    return (TopLogprobs(tuple(t for _, t in pairs), tuple(lp for lp, _ in pairs)),
            evaluated, generated)


def _token_key(key: str, field: str) -> int:
    """The token id of a ``"token_id:<id>"`` key (``return_tokens_as_token_ids``): ASCII
    digits only (``int`` also reads ``" 5"``, ``"+5"``, ``"5_0"`` and other scripts' digits)."""
    digits = key.removeprefix("token_id:")
    if digits != key and digits.isascii() and digits.isdigit() and len(digits) <= 30:
        return probe_token_id(int(digits), field)
    return probe_token_id(key, field)


async def gather_posts(post_json: Callable[[str, bytes], Any], path: str,
                       bodies: list[dict], width: int = 32) -> list[Any]:
    """``post_json`` of every body, ``width`` at a time, answers in order. The first
    failure is raised, and the bodies not yet sent are not sent (the requests in flight
    end on their own): a vocabulary is ~1,100 requests, and a server that refuses them
    (``/tokenize`` answering 404, or nothing) would otherwise be asked them all, in the
    background, every time the vocabulary is asked again."""
    out: list[Any] = [None] * len(bodies)
    todo = iter(range(len(bodies)))
    failed = False

    async def worker() -> None:
        nonlocal failed
        for i in todo:
            if failed:
                return
            try:
                out[i] = await post_json(path, json.dumps(bodies[i]).encode())
            except BaseException:
                failed = True
                raise

    await asyncio.gather(*[worker() for _ in range(min(width, len(bodies)))])
    return out
