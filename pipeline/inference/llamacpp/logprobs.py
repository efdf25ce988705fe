"""Next-token log-probabilities from llama.cpp's own HTTP server, for answer distributions
over HTTP: the embedded engine's probe (``LlamaCppBackend.logprob_chain``), sent as a request.

The routes and fields, as the server answered them (xllamacpp 2026.10.11549's server, which is
llama.cpp's ``tools/server``):

- ``POST /completion`` ``{"prompt": [text, *token ids], "max_tokens": 1, "n_probs": n,
  "temperature": 1, "top_k": 1, "seed": 0, "cache_prompt": bool, "id_slot": 0}``: the text
  is tokenized as a text prompt is (with BOS), the ids follow it unchanged. The answer holds
  ``completion_probabilities[0].top_logprobs``, a list of ``{"id", "token", "bytes",
  "logprob"}``, most likely first: the raw model's log-probabilities (softmax of the logits,
  before any sampler: ``post_sampling_probs`` is off), so ``top_k: 1`` only makes the one
  sampled token cheap. ``timings.prompt_n`` is the prompt tokens evaluated (not found in the
  slot's cache) and ``tokens_predicted`` the tokens generated. ``n_probs`` has no cap but the
  vocabulary (5,000 asked, 5,000 given). Servers from before late 2024 answered
  ``completion_probabilities[0].probs`` (``tok_str``, post-sampling ``prob``, no ids): refused.
- ``id_slot`` keeps one session's probes in one slot, so each reuses the prefix the one
  before it left there (``cache_prompt``); the first probe of a lone session decodes the
  prompt afresh, as the embedded chain's first call does (``session``).
- ``POST /tokenize`` ``{"content", "add_special": false, "parse_special", "with_pieces":
  true}`` answers ``{"tokens": [{"id", "piece"}]}``.

The answer vocabulary: every text of at most ``MAX_PIECE_CHARS`` characters of the answer
alphabet (``simpipe.inference.types.candidate_pieces``) is tokenized; a text that comes back as one
token whose piece is that text is that token's piece. Byte-fallback tokens (``<0x35>``,
SentencePiece vocabularies) never come back for text the vocabulary spells, yet the grammar
accepts them and the embedded engine counts them (from the GGUF file); leaving them out
changes which prefixes are asked again for more tokens, and so the numbers (measured: 1.2%
total variation on one prompt). They are found as the vocabulary lays them out: a character
no vocabulary spells (``FALLBACK_PROBE``) comes back as byte tokens whose ids are one base
plus the byte; each alphabet character's id at that base is kept if ``/detokenize`` of it
alone gives that character. End of generation: each of llama.cpp's known end-marker
texts (``</s>``, ``<eos>``, ``<end_of_turn>``, ``<|eot_id|>``, ...) that comes back as one
token with ``parse_special: true`` and as something else with ``parse_special: false`` (a
special token: plain text cannot produce it). ``GET /props`` names only ``eos_token`` (and
this client posts only; ``POST /props`` needs the server's ``--props``); the known markers
are the texts llama.cpp itself treats as end of generation, which include the usual eos
texts. A model whose end tokens are none of them is refused (``ProbeError``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from simpipe.inference.answer_checks import (
    TOKEN_ID_LIMIT,
    probe_count,
    probe_piece,
    probe_token_id,
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

#: the slot a session's probes go to (``id_slot``), as the embedded engine's lone slot
LONE_SLOT = 0
#: a private-use character: tokenizers with byte fallback write it as its 4 UTF-8 bytes
FALLBACK_PROBE = "\U000f0000"


def answer_vocab(post_many: PostMany, alphabet: frozenset[str]) -> AnswerVocab:
    """The answer tokens and end-of-generation ids, asked of the server's tokenizer."""
    texts = candidate_pieces(alphabet)
    markers = sorted(EOG_TEXTS)
    bodies = [_tokenize(t, special=False) for t in texts]
    bodies += [_tokenize(t, special=True) for t in markers]
    bodies += [_tokenize(t, special=False) for t in markers]
    bodies.append(_tokenize(FALLBACK_PROBE, special=False))
    answers = [_pieces(a) for a in post_many("/tokenize", bodies)]
    pieces = {got[0][0]: text for text, got in zip(texts, answers, strict=False)
              if len(got) == 1 and got[0][1] == text}
    as_special = answers[len(texts):len(texts) + len(markers)]
    as_text = answers[len(texts) + len(markers):-1]
    eog = {special[0][0] for text, special, plain in zip(markers, as_special, as_text,
                                                         strict=True)
           if len(special) == 1 and special[0][1] == text and plain != special}
    if not eog:
        raise ProbeError("the server's tokenizer knows none of the end-of-generation texts "
                         f"({', '.join(markers[:4])}, ...) as special tokens")
    pieces = {t: p for t, p in pieces.items() if t not in eog}
    pieces.update(_byte_tokens(post_many, alphabet, answers[-1], pieces))
    return AnswerVocab(max([*pieces, *eog]) + 1, frozenset(eog), pieces)


def _byte_tokens(post_many: PostMany, alphabet: frozenset[str],
                 fallback: list[tuple[int, Any]], known: dict[int, str]) -> dict[int, str]:
    """The byte-fallback tokens spelling single alphabet characters (none for tokenizers
    without byte fallback: ``fallback`` is then not the probe's bytes at one base)."""
    raw = FALLBACK_PROBE.encode()
    if len(fallback) != len(raw) or not all(isinstance(p, list) for _, p in fallback):
        return {}
    bases = {tid - b for (tid, _), b in zip(fallback, raw, strict=True)}
    if len(bases) != 1:
        return {}
    base = bases.pop()
    if not 0 <= base < TOKEN_ID_LIMIT - 256:
        return {}
    chars = sorted(c for c in alphabet if len(c.encode()) == 1)
    ids = [base + ord(c) for c in chars]
    texts = post_many("/detokenize", [{"tokens": [t]} for t in ids])
    return {t: c for t, c, got in zip(ids, chars, texts, strict=True)
            if t not in known and isinstance(got, dict) and got.get("content") == c}


def _tokenize(text: str, special: bool) -> dict:
    return {"content": text, "add_special": False, "parse_special": special,
            "with_pieces": True}


def _pieces(answer: Any) -> list[tuple[int, Any]]:
    """``[(id, piece)]`` of a ``/tokenize`` answer with ``with_pieces``: each id a token id
    (``answer_checks.probe_token_id``), each piece text or (not UTF-8) a list of bytes."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if type(tokens) is not list or not all(
            type(t) is dict and "id" in t and "piece" in t for t in tokens):
        raise ProbeError("/tokenize answered without a list of {id, piece}: "
                         f"{str(answer)[:200]}")
    return [(probe_token_id(t["id"], f"/tokenize tokens[{i}].id"),
             probe_piece(t["piece"], f"/tokenize tokens[{i}].piece"))
            for i, t in enumerate(tokens)]


def session(post: Post, prompt: str, lone: bool = True) -> Iterator[Probe]:
    """``probe(path, top_n)`` for one prompt (see ``simpipe.inference.types.Probe``): one
    ``/completion`` per call.

    ``lone``: every call on ``LONE_SLOT``, the first with the prompt decoded afresh, so that
    a fixed sequence of calls gives the same bits on every run (while nothing else runs on
    the server: its batches are not batch-invariant). Otherwise the server picks the slot,
    which is the idle one whose cached prompt shares the most with the call's (for a
    session's later calls, the slot its previous call left), and every call builds on what
    that slot holds: sessions run side by side on as many slots and share the server's
    decodes, and the first call evaluates only what the prompt does not share with a
    cached one (the rules, the persona)."""
    fresh = lone
    pinned = {"id_slot": LONE_SLOT} if lone else {}

    def probe(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
        nonlocal fresh
        answer = post("/completion", {
            "prompt": [prompt, *path], "max_tokens": 1, "n_probs": top_n,
            "temperature": 1.0, "top_k": 1, "seed": 0, "cache_prompt": not fresh,
            **pinned})
        fresh = False  # the slot now holds this prompt: later probes build on it
        return top_logprobs(answer)

    yield probe


def top_logprobs(answer: Any) -> tuple[TopLogprobs, int, int]:
    """(top log-probabilities, prompt tokens evaluated, tokens generated) of one
    ``/completion`` answer; ``ProbeError`` naming what is missing, and every value checked
    (``answer_checks.probe_top_logprobs``, ``probe_count``): ``MalformedProbe`` naming it."""
    try:
        step = answer["completion_probabilities"][0]
        if "top_logprobs" not in step and "probs" in step:
            raise ProbeError("the llama.cpp server answers n_probs in its old form (probs "
                             "without token ids); use a llama.cpp server from 2025 or later")
        pairs = [(e["id"], e["logprob"]) for e in step["top_logprobs"]]
        timings = answer.get("timings") or {}
        prompt_n, predicted = timings.get("prompt_n"), answer.get("tokens_predicted")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        message = answer.get("error") if isinstance(answer, dict) else None
        raise ProbeError("no top log-probabilities in the /completion answer "
                         f"({message or repr(exc)}: {str(answer)[:200]})") from None
    top = probe_top_logprobs(pairs, "completion_probabilities[0].top_logprobs")
    return (top, probe_count(prompt_n, "timings.prompt_n"),
            probe_count(predicted, "tokens_predicted"))
