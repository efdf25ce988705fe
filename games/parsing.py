"""Tolerant reading of a number from model text: the fallback when no grammar constrained it.

Where the number is looked for, first hit wins:

0. basic only: a number at the very start (after markup such as ``**``): a completion cue
   is answered right away, and base models then ramble on ("33\n\nRound 4 ...");
1. after the LAST cot marker (case-insensitive), in any mode: the constrained answer sits there
   (for cot, the only place: see below);
2. a JSON-ish field: ``{"number": 33}``, ``{"guess": "33"}`` (also ``answer``, ``value``);
3. an answer phrase: "my (final) guess/number/answer/choice is 22", "I pick/choose 33.5",
   "answer: 7", "My number: 45" (base models often echo the cue) -- the first such phrase, or
   the last for cot;
4. any number: the first one, or the LAST one for cot (reasoning usually ends with its
   conclusion; the same rule as GSM8K-style evaluation).

A chain-of-thought answer (``cot``) counts only in the form the prompt asks for: the marker
followed by a number. Without it the answer is "no_final_answer" (``guess`` None, ``value``
the number rules 2-4 find, the fallback, for inspection only): a reasoning that stopped
anywhere yields an intermediate number, and counting it as the answer made a CoT run look
like a result (98 of 100 answers cut at the token limit, 92 "ok").

An answer the back-end cut at its token limit (``cut``) is "truncated" unless the number
read is followed by more text (then the cut came after it: a base model rambling on after
its basic answer): one cut right after a number may have lost its last digits, and a chain
of thought cut before its marker never gave an answer. ``value`` keeps what was read.

Number forms: ``33``, ``33.5``, ``.5``, ``-5`` and the unicode minus, ``+5``, ``1,000``
(comma only as a thousands separator: ``33,5`` reads 33), ``100/3`` (a fraction is divided
out), ``33%`` (reads 33). A "-" glued to a letter or digit is a hyphen, not a sign
("round-3", "10-20"). Digits glued to letters ("Gemma3", "33rd") are used only when no
free-standing number exists. NaN, infinities, overflow and ``x/0`` are "unparsed".
A number outside ``[low, high]`` is "out_of_range": ``guess`` is None, ``value`` keeps it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

import numpy as np

from simpipe.games.answer_format import ANSWER_MARKER

Status = Literal["ok", "unparsed", "out_of_range", "no_final_answer", "truncated"]


class ParsedAnswer(NamedTuple):
    guess: float | None
    status: Status
    value: float | None = None


_UNPARSED = ParsedAnswer(None, "unparsed", None)

# Unicode minus signs and fraction slashes to ASCII; everything else is left alone
# (``float`` already reads non-ASCII decimal digits).
_TRANSLATE = str.maketrans(
    {"\u2212": "-", "\ufe63": "-", "\uff0d": "-", "\u2044": "/", "\u2215": "/"}
)

_NUM = (
    r"(?:(?<![\w.\-])[-+])?"  # a sign only when not glued to a word, digit or hyphen
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"  # 1,000 | 33 | 33.5 | .5
    r"(?:\s*/\s*\d+(?:\.\d+)?)?"  # 100/3
)
_NUM_RE = re.compile(_NUM)
# Never two ``\s*`` with only optional text between them: quadratic on long blank runs.
_BARE_RE = re.compile(r"\s*(" + _NUM + r")%?\.?\s*")
_LEADING_RE = re.compile(r"[\s*\"'`(\[]*(" + _NUM + ")")
_JSON_RE = re.compile(
    r"(?<!\w)[\"']?(?:number|guess|answer|value)[\"']?\s*:[\s\"']*(" + _NUM + ")",
    re.IGNORECASE,
)
_PHRASE_RE = re.compile(
    r"(?:\bmy\s+(?:final\s+)?(?:number|guess|answer|choice|pick)"
    r"(?:\s+(?:is|would\s+be|will\s+be|=))?"
    r"|\bi(?:\s+(?:will|would|shall)|'ll|'d)?\s+(?:pick|choose|guess|select|say|go\s+with)"
    r"(?:\s+(?:the\s+)?(?:number|value))?"
    r"|\b(?:final\s+)?(?:answer|guess|number|choice)\s+(?:is|=)"
    r"|\b(?:final\s+)?answer)"
    r"[\s:=*\"'`]*(" + _NUM + ")",
    re.IGNORECASE,
)


def _to_float(token: str) -> float | None:
    token = token.replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(token)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _glued(text: str, m: re.Match[str]) -> bool:
    before = text[m.start() - 1] if m.start() else " "
    after = text[m.end()] if m.end() < len(text) else " "
    return before.isalpha() or after.isalpha()


# A hit: the number and where its text ends (a cut right after it may have shortened it).
_Hit = tuple[float, int] | None


def _any_number(text: str, last: bool) -> _Hit:
    free, glued = [], []
    for m in _NUM_RE.finditer(text):
        (glued if _glued(text, m) else free).append(m)
    for group in (free, glued):
        for m in reversed(group) if last else group:
            value = _to_float(m.group())
            if value is not None:
                return value, m.end()
    return None


def _after_marker(text: str, marker: str) -> _Hit:
    """The number after the LAST marker: the asked-for final answer."""
    if not marker:
        return None
    at = text.lower().rfind(marker.lower())
    if at < 0:
        return None
    start = at + len(marker)
    hit = _NUM_RE.search(text, start)
    if hit:
        value = _to_float(hit.group())
        if value is not None:
            return value, hit.end()
    return None


def _tolerant(text: str, cot: bool, marker: str) -> _Hit:
    m = _BARE_RE.fullmatch(text)
    if m:
        value = _to_float(m.group(1))
        return None if value is None else (value, m.end(1))
    if not cot:
        # A completion cue is answered right away; what follows is the model rambling on.
        m = _LEADING_RE.match(text)
        if m:
            value = _to_float(m.group(1))
            if value is not None:
                return value, m.end(1)
    hit = _after_marker(text, marker)
    if hit is not None:
        return hit
    for rx in (_JSON_RE, _PHRASE_RE):
        hits = list(rx.finditer(text))
        for m in reversed(hits) if cot else hits:
            value = _to_float(m.group(1))
            if value is not None:
                return value, m.end(1)
    return _any_number(text, last=cot)


# What may continue a number: an answer cut right after one of these may have lost digits.
_NUMBER_GOES_ON = frozenset("0123456789.,/ ")


def _may_be_cut_short(text: str, end: int, value: float, low: float, high: float) -> bool:
    """Could the cut have taken more of this number? Only if the text ends at it (or at one
    more character of a number) and a longer number would still be in range: another digit
    multiplies it by ten, a fraction moves it towards ``high``. An answer of exactly the
    bound (``100`` in 0..100) that used the whole token budget is whole."""
    rest = text[end:]
    if rest and not (len(rest) == 1 and rest in _NUMBER_GOES_ON):
        return False
    bound = max(abs(low), abs(high))
    return abs(value) * 10 <= bound or low <= value < high


def _read(text: str, low: float, high: float, cot: bool, marker: str, cut: bool) -> ParsedAnswer:
    if cot:
        hit = _after_marker(text, marker)
        if hit is None:
            fallback = _tolerant(text, cot, marker)
            value = None if fallback is None else fallback[0]
            return ParsedAnswer(None, "truncated" if cut else "no_final_answer", value)
    else:
        hit = _tolerant(text, cot, marker)
    if hit is None:
        return ParsedAnswer(None, "truncated", None) if cut else _UNPARSED
    value, end = hit
    if cut and _may_be_cut_short(text, end, value, low, high):
        return ParsedAnswer(None, "truncated", value)
    if low <= value <= high:
        return ParsedAnswer(value, "ok", value)
    return ParsedAnswer(None, "out_of_range", value)


def parse_answer(
    text: object, low: float, high: float, cot: bool = False, marker: str = ANSWER_MARKER,
    cut: bool = False,
) -> ParsedAnswer:
    """Read one number from ``text``; never raises (any failure is "unparsed").

    ``cot``: the prompt asked for ``marker`` and the number (else "no_final_answer");
    ``cut``: the back-end stopped the answer at its token limit (see the module's notes).
    """
    try:
        if not isinstance(text, str) or not text:
            return ParsedAnswer(None, "truncated", None) if cut else _UNPARSED
        return _read(text.translate(_TRANSLATE), low, high, cot, marker, cut)
    except Exception:  # noqa: BLE001 -- a parser of model output must never take a partition down
        return _UNPARSED


def parse_many(
    texts: Iterable[object],
    low: float,
    high: float,
    cot: bool = False,
    marker: str = ANSWER_MARKER,
    cut: Iterable[bool] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Parse many texts: ``(guesses float64 with NaN where invalid, statuses object array)``;
    ``cut``: per text, whether the back-end stopped it at its token limit.

    Identical texts are parsed once: constrained outputs repeat a lot.
    """
    memo: dict[tuple[str, bool], ParsedAnswer] = {}
    guesses: list[float] = []
    statuses: list[str] = []
    nan = math.nan
    texts = list(texts)
    cuts = [False] * len(texts) if cut is None else [bool(c) for c in cut]
    if len(cuts) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(cuts)} cut flags: one per text")
    for text, was_cut in zip(texts, cuts, strict=True):
        if isinstance(text, str):
            key = (text, was_cut)
            parsed = memo.get(key)
            if parsed is None:
                parsed = memo[key] = parse_answer(text, low, high, cot, marker, was_cut)
        else:
            parsed = parse_answer(text, low, high, cot, marker, was_cut)
        guesses.append(nan if parsed.guess is None else parsed.guess)
        statuses.append(parsed.status)
    return np.asarray(guesses, dtype=np.float64), np.asarray(statuses, dtype=object)
