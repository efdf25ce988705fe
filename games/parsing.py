"""Tolerant reading of a number from model text: the fallback when no grammar constrained it.

Where the number is looked for, first hit wins:

0. basic only: a number at the very start (after markup such as ``**``): a completion cue
   is answered right away, and base models then ramble on ("33\n\nRound 4 ...");
1. after the LAST cot marker (case-insensitive), in any mode: the constrained answer sits there;
2. a JSON-ish field: ``{"number": 33}``, ``{"guess": "33"}`` (also ``answer``, ``value``);
3. an answer phrase: "my (final) guess/number/answer/choice is 22", "I pick/choose 33.5",
   "answer: 7", "My number: 45" (base models often echo the cue) -- the first such phrase, or
   the last for cot;
4. any number: the first one, or the LAST one for cot (reasoning usually ends with its
   conclusion; the same rule as GSM8K-style evaluation). A truncated chain of thought may
   thus yield an intermediate number: the grammar's marker is the real fix.

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

Status = Literal["ok", "unparsed", "out_of_range"]


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


def _any_number(text: str, last: bool) -> float | None:
    free, glued = [], []
    for m in _NUM_RE.finditer(text):
        (glued if _glued(text, m) else free).append(m)
    for group in (free, glued):
        for m in reversed(group) if last else group:
            value = _to_float(m.group())
            if value is not None:
                return value
    return None


def _find(text: str, cot: bool, marker: str) -> float | None:
    m = _BARE_RE.fullmatch(text)
    if m:
        return _to_float(m.group(1))
    if not cot:
        # A completion cue is answered right away; what follows is the model rambling on.
        m = _LEADING_RE.match(text)
        if m:
            value = _to_float(m.group(1))
            if value is not None:
                return value
    if marker:
        at = text.lower().rfind(marker.lower())
        if at >= 0:
            tail = text[at + len(marker) :]
            hit = _NUM_RE.search(tail)
            if hit:
                value = _to_float(hit.group())
                if value is not None:
                    return value
    for rx in (_JSON_RE, _PHRASE_RE):
        hits = rx.findall(text)
        for token in reversed(hits) if cot else hits:
            value = _to_float(token)
            if value is not None:
                return value
    return _any_number(text, last=cot)


def parse_answer(
    text: object, low: float, high: float, cot: bool = False, marker: str = ANSWER_MARKER
) -> ParsedAnswer:
    """Read one number from ``text``; never raises (any failure is "unparsed")."""
    try:
        if not isinstance(text, str) or not text:
            return _UNPARSED
        value = _find(text.translate(_TRANSLATE), cot, marker)
        if value is None:
            return _UNPARSED
        if low <= value <= high:
            return ParsedAnswer(value, "ok", value)
        return ParsedAnswer(None, "out_of_range", value)
    except Exception:  # noqa: BLE001 -- a parser of model output must never take a partition down
        return _UNPARSED


def parse_many(
    texts: Iterable[object],
    low: float,
    high: float,
    cot: bool = False,
    marker: str = ANSWER_MARKER,
) -> tuple[np.ndarray, np.ndarray]:
    """Parse many texts: ``(guesses float64 with NaN where invalid, statuses object array)``.

    Identical texts are parsed once: constrained outputs repeat a lot.
    """
    memo: dict[str, ParsedAnswer] = {}
    guesses: list[float] = []
    statuses: list[str] = []
    nan = math.nan
    for text in texts:
        if isinstance(text, str):
            parsed = memo.get(text)
            if parsed is None:
                parsed = memo[text] = parse_answer(text, low, high, cot, marker)
        else:
            parsed = _UNPARSED
        guesses.append(nan if parsed.guess is None else parsed.guess)
        statuses.append(parsed.status)
    return np.asarray(guesses, dtype=np.float64), np.asarray(statuses, dtype=object)
