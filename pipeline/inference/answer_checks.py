"""Checks on the fields of an inference answer before the pipeline keeps them.

What a server (or the embedded engine) answers is untrusted input: a number where text
belongs would fail the Parquet write of a whole partition, ``1e999`` tokens raise
``OverflowError``, and 99,999,999,999 tokens silently wrap in the int32 column. Every
field a back-end returns goes through one of these; a bad one raises ``MalformedAnswer``
naming the field, which the back-end turns into that one agent's error. The values of the
answer-distribution routes' probe answers (top log-probabilities, token ids, counts) go
through the ``probe_*`` checks below, which raise ``MalformedProbe``: that prompt's agents
are then answered by calls of their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from simpipe.inference.types import ProbeError, TopLogprobs

#: Token counts are stored as int32.
TOKEN_COUNT_LIMIT = 2**31


class MalformedAnswer(ValueError):
    """An answer field of the wrong type or out of range; the message names the field."""


def token_count(value: Any, field: str) -> int:
    """A token count: absent (None) is 0; otherwise a JSON integer in [0, 2**31)."""
    if value is None:
        return 0
    # type() rather than isinstance: JSON true/false are bools, and bool is an int.
    if type(value) is int and 0 <= value < TOKEN_COUNT_LIMIT:
        return value
    raise MalformedAnswer(
        f"{field} = {_show(value)} is not a token count (a whole number 0..2**31-1)"
    )


def header_token_count(value: str | None, field: str) -> int:
    """A token count sent as an HTTP header (decimal digits); absent is 0."""
    if value is None:
        return 0
    # str.isdigit alone admits "²" and other non-ASCII digits that int() then rejects.
    if value.isdigit() and value.isascii() and len(value) <= 10:
        return token_count(int(value), field)
    raise MalformedAnswer(
        f"{field} = {_show(value)} is not a token count (a whole number 0..2**31-1)"
    )


def checked_answer(
    text: Any, tokens_in: Any, tokens_out: Any, finish: Any, fields: tuple[str, str, str, str]
) -> tuple[str, int, int, str | None]:
    """(text, tokens_in, tokens_out, finish_reason) checked as above; ``fields`` names them
    for the error. One call with the common case first: this runs once per request on the
    client's hot path."""
    if (
        type(text) is str
        and type(tokens_in) is int
        and type(tokens_out) is int
        and 0 <= tokens_in < TOKEN_COUNT_LIMIT
        and 0 <= tokens_out < TOKEN_COUNT_LIMIT
        and (finish is None or type(finish) is str)
    ):
        return text, tokens_in, tokens_out, finish
    return (
        answer_text(text, fields[0]),
        token_count(tokens_in, fields[1]),
        token_count(tokens_out, fields[2]),
        finish_reason(finish, fields[3]),
    )


def answer_text(value: Any, field: str) -> str:
    """The generated text: a JSON string, nothing else."""
    if type(value) is str:
        return value
    if value is None:
        raise MalformedAnswer(f"{field} is missing")
    raise MalformedAnswer(f"{field} is {_kind(value)}, not text")


def finish_reason(value: Any, field: str) -> str | None:
    """Why generation stopped: a string, or absent."""
    if value is None or type(value) is str:
        return value
    raise MalformedAnswer(f"{field} is {_kind(value)}, not text")


def json_object(value: Any, field: str) -> dict:
    """A JSON object (a dict after ``json.loads``)."""
    if type(value) is dict:
        return value
    raise not_an_object(value, field)


def not_an_object(value: Any, field: str) -> MalformedAnswer:
    """The error for ``value`` where a JSON object belongs (for callers that test inline)."""
    return MalformedAnswer(f"{field} is {_kind(value)}, not a JSON object")


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- Probe answers: the answer-distribution routes ---------------------------------------
# A server's next-token log-probabilities, token ids and counts decide every shared answer
# of a prompt, so a bad one must cost that prompt its shared distribution (its agents are
# then answered by calls of their own), never the run: a NaN or an infinity made the draw
# pick past the end of its children (IndexError), a token id of 10**25 overflowed numpy's
# int64 and a count of 10**20 the token split, a negative count failed run.json, and
# positive log-probabilities were quietly renormalised into a plausible answer. The
# parsers of llama.cpp's server, vLLM's routes and the embedded engine read every such
# value through these; a bad one raises ``MalformedProbe`` (a ``ProbeError``) naming it.

#: A raw log-probability is the log of a softmax, so at most 0; a server computing in
#: float32 may round a near-certain token's to just above 0. Up to this much above 0 is
#: taken as given.
LOGPROB_TOLERANCE = 1e-6
#: The listed tokens' probabilities sum to at most 1 (the rest of the vocabulary holds the
#: remainder); float32 rounding over the top 4,096 tokens may take the sum a little above.
#: Up to 1 + this is taken as given.
PROBABILITY_SUM_TOLERANCE = 1e-3
#: Token ids are int32 in llama.cpp and vLLM. Over HTTP the vocabulary's size is not asked
#: (llama.cpp's ``GET /props`` does not name it, vLLM's ``/tokenize`` neither), so this is
#: the bound there; a caller that knows the vocabulary passes ``n_vocab``.
TOKEN_ID_LIMIT = 2**31


class MalformedProbe(ProbeError):
    """A value in a server's probe answer of the wrong type or out of range; the message
    names the field."""


def probe_count(value: Any, field: str) -> int:
    """A token count of a probe answer (``timings.prompt_n``, ``usage.prompt_tokens``, ...):
    absent is 0, else a JSON integer in [0, 2**31), as ``token_count``."""
    try:
        return token_count(value, field)
    except MalformedAnswer as exc:
        raise MalformedProbe(str(exc)) from None


def probe_token_id(value: Any, field: str, n_vocab: int | None = None) -> int:
    """A token id: a JSON integer in [0, n_vocab), and within int32."""
    limit = TOKEN_ID_LIMIT if n_vocab is None else min(n_vocab, TOKEN_ID_LIMIT)
    if type(value) is int and 0 <= value < limit:
        return value
    raise MalformedProbe(f"{field}: {_show(value)} is not a token id "
                         f"(a whole number 0..{limit - 1})")


def probe_token_ids(values: Any, field: str, n_vocab: int | None = None) -> list[int]:
    """A list of token ids (a ``/tokenize`` answer's ``tokens``)."""
    if type(values) is not list:
        raise MalformedProbe(f"{field} is {_kind(values)}, not a list of token ids")
    return [probe_token_id(v, field, n_vocab) for v in values]


def probe_optional_list(value: Any, field: str) -> list | None:
    """A list in a probe answer that may be absent (vLLM's ``token_strs``)."""
    if value is None or type(value) is list:
        return value
    raise MalformedProbe(f"{field} is {_kind(value)}, not a list")


def probe_piece(value: Any, field: str) -> str | list:
    """A token's piece in a ``/tokenize`` answer: its text, or (not valid UTF-8 on its own)
    the list of its bytes."""
    if type(value) is str or type(value) is list:
        return value
    raise MalformedProbe(f"{field} is {_kind(value)}, not text or bytes")


def probe_top_logprobs(pairs: Iterable[tuple[Any, Any]], field: str,
                       n_vocab: int | None = None) -> TopLogprobs:
    """The top log-probabilities of one probe from ``(token id, log-probability)`` pairs as
    the server listed them: at least one, each id a token id listed once, each
    log-probability a finite number <= 0 (``LOGPROB_TOLERANCE``), their probabilities
    summing to at most 1 (``PROBABILITY_SUM_TOLERANCE``). Returned most likely first (a
    stable sort: a server's own order where it is already so), which the bound on unlisted
    tokens (``TopLogprobs.floor``, the last one) relies on."""
    ids: list[int] = []
    logprobs: list[float] = []
    seen: set[int] = set()
    total = 0.0
    for tid, lp in pairs:
        tid = probe_token_id(tid, field, n_vocab)
        if tid in seen:
            raise MalformedProbe(f"{field}: token {tid} is listed twice")
        seen.add(tid)
        # JSON numbers only (a bool is an int to Python); an integer beyond a float is no
        # log-probability either.
        value = (lp if type(lp) is float
                 else float(lp) if type(lp) is int and -2**53 <= lp <= 0 else math.nan)
        if not -math.inf < value <= LOGPROB_TOLERANCE:
            raise MalformedProbe(f"{field}: the log-probability of token {tid} is "
                                 f"{_show(lp)}, not a finite number <= 0")
        ids.append(tid)
        logprobs.append(value)
        total += math.exp(value)
    if not ids:
        raise MalformedProbe(f"{field} lists no token")
    if total > 1.0 + PROBABILITY_SUM_TOLERANCE:
        raise MalformedProbe(f"{field}: the listed probabilities sum to {total:.4g}, "
                             "more than 1")
    order = sorted(range(len(ids)), key=lambda i: -logprobs[i])
    return TopLogprobs(tuple(ids[i] for i in order), tuple(logprobs[i] for i in order))
