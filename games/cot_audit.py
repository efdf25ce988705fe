"""Audits of chain-of-thought text: what the paper names as the limits of LLM reasoning,
measured on each answer (pure functions; the report tabulates them by persona).

* **Arithmetic**: statements of the form "2/3 of 50 is 33.3", "50 * 2/3 = 33.3",
  "(2/3) × 50 ≈ 33", "two thirds of 45 would be 30" are found and checked. A result is right
  when it is the exact product rounded or cut to the digits written (33, 33.3 and 33.33 are
  right for 2/3 of 50; 34 and 33.4 are not). A factor
  written as a rounded decimal (0.67, 66.7%) is also read as the simple fraction it rounds
  (2/3), so "0.67 * 50 = 33.3" is right.
* **The final answer against the reasoning's own conclusion**: the conclusion is the last
  number the reasoning (the text before the last answer marker) derives or chooses: the last
  number after "=", "≈", "is", "was", "be", "gives", "pick", "choose", "guess", "go with", "about"
  and the like. The final answer agrees when it is that number rounded either way
  (``|final - conclusion| < 1``: the answer is a whole number).
* **Reasoning depth**: how many times the reasoning applies the game's factor one step
  after another: the longest chain of arithmetic statements with that factor where each
  starts from the previous one's result ("2/3 of 50 is 33, and 2/3 of 33 is 22": 2). A
  stated iteration counts whether or not its arithmetic is right.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from simpipe.games.answer_format import ANSWER_MARKER

AUDIT_COLUMNS = ("claims", "wrong_claims", "depth", "conclusion", "final", "final_agrees")
#: Simple fractions a rounded decimal factor is also read as (0.67 -> 2/3).
_SIMPLE = sorted({Fraction(a, b) for b in range(2, 11) for a in range(1, 2 * b)})
_SIMPLE_WITHIN = 0.01
#: Two numbers of a chain are one when they differ by less than this (33.3 -> "2/3 of 33").
_LINK = 1.0

_WORD_FACTORS = {
    "half": 1 / 2, "one half": 1 / 2, "a half": 1 / 2, "one third": 1 / 3, "a third": 1 / 3,
    "two thirds": 2 / 3, "two-thirds": 2 / 3, "one quarter": 1 / 4, "a quarter": 1 / 4,
    "three quarters": 3 / 4, "three-quarters": 3 / 4, "four thirds": 4 / 3,
    "four-thirds": 4 / 3,
}
_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_FACTOR = (r"(?:\(\s*\d+\s*/\s*\d+\s*\)|\d+\s*/\s*\d+|\d+(?:\.\d+)?\s*%|0?\.\d+|"
           + "|".join(sorted((re.escape(w) for w in _WORD_FACTORS), key=len, reverse=True))
           + ")")
_TIMES = r"\s*(?:\*|×|x|·|times)\s*"
_RESULT = (r"\s*(?:is|=|≈|~|equals|gives|would\s+be|will\s+be|comes\s+to|makes|->|→|:)"
           r"\s*(?:about|approximately|around|roughly|~)?\s*")
_OF = r"\s+of\s+(?:the\s+)?(?:(?:average|mean|number)\s+(?:of\s+)?)?"
# (factor, number, result): "2/3 of 50 is 33", "2/3 * 50 = 33"; (number, factor, result):
# "50 * 2/3 = 33". Look-behinds keep a number from starting inside another.
_FACTOR_FIRST = re.compile(
    rf"(?<![\w.])(?P<f>{_FACTOR})(?:{_OF}|{_TIMES})(?P<x>{_NUMBER})(?![\d/]){_RESULT}"
    rf"(?P<y>{_NUMBER})", re.IGNORECASE)
_NUMBER_FIRST = re.compile(
    rf"(?<![\w.])(?P<x>{_NUMBER}){_TIMES}(?P<f>{_FACTOR})(?![\d/]){_RESULT}(?P<y>{_NUMBER})",
    re.IGNORECASE)
# A number the reasoning derives or chooses: after one of these words or signs.
_DERIVED = re.compile(
    r"(?:=|≈|~|\bis\b|\bwas\b|\bbe\b|\bgives?\b|\bgiving\b|\bpick\b|\bchoose\b|\bguess\b|"
    r"\bgo\s+with\b|\bselect\b|\babout\b|\baround\b|\bapproximately\b|\broughly\b|\bto\b)"
    rf"[\s:*\"']*(?P<n>{_NUMBER})(?![\d/])", re.IGNORECASE)
_ANY_NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}")


@dataclass(frozen=True)
class Claim:
    """One arithmetic statement: ``factor * operand = result`` as written."""

    factor: float
    operand: float
    result: float
    right: bool
    text: str


@dataclass(frozen=True)
class CotAudit:
    """One answer's audit (see the module's notes)."""

    claims: tuple[Claim, ...]
    depth: int  # 0 without a ``ratio`` to follow
    conclusion: float | None  # the last number the reasoning derives; None if none
    final: float | None  # the number after the last marker; None if none

    @property
    def wrong_claims(self) -> int:
        return sum(not c.right for c in self.claims)

    @property
    def final_agrees(self) -> bool | None:
        """Whether the final answer is the reasoning's conclusion, rounded; None when either
        is missing."""
        if self.final is None or self.conclusion is None:
            return None
        return abs(self.final - self.conclusion) < 1.0


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _factor(text: str) -> float | None:
    t = " ".join(text.lower().replace("(", "").replace(")", "").split())
    if t in _WORD_FACTORS:
        return _WORD_FACTORS[t]
    if "/" in t:
        num, den = t.split("/", 1)
        den_value = float(den)
        return float(num) / den_value if den_value else None
    if t.endswith("%"):
        return float(t[:-1].strip()) / 100
    return _number(t)


def _readings(factor: float) -> list[float]:
    """The factor as written, and the simple fraction a rounded decimal stands for."""
    near = min(_SIMPLE, key=lambda f: abs(float(f) - factor))
    out = [factor]
    if abs(float(near) - factor) <= _SIMPLE_WITHIN and float(near) != factor:
        out.append(float(near))
    return out


def _unit(written: str) -> float:
    """One unit of the last written digit: 1 for "33", 0.1 for "33.3"."""
    decimals = len(written.split(".", 1)[1]) if "." in written else 0
    return 10.0 ** -decimals


def _within_rounding(exact: float, written: float, unit: float) -> bool:
    """``written`` is ``exact`` rounded, or cut toward zero, to ``unit``."""
    eps = 1e-9 * max(1.0, abs(exact))
    if abs(exact - written) <= unit / 2 + eps:
        return True
    cut = math.copysign(math.floor(abs(exact) / unit + eps) * unit, exact)
    return abs(cut - written) <= eps + 1e-9 * unit


def arithmetic_claims(text: str) -> list[Claim]:
    """Every "factor of X is Y" / "X * factor = Y" statement in ``text``, checked, in order."""
    found: dict[int, Claim] = {}
    for rx in (_FACTOR_FIRST, _NUMBER_FIRST):
        for m in rx.finditer(text):
            if m.start() in found:
                continue
            factor, x, y = _factor(m["f"]), _number(m["x"]), _number(m["y"])
            if factor is None or x is None or y is None:
                continue
            unit = _unit(m["y"].replace(",", ""))
            right = any(_within_rounding(r * x, y, unit) for r in _readings(factor))
            found[m.start()] = Claim(factor, x, y, right, m.group(0))
    return [found[k] for k in sorted(found)]


def reasoning_depth(claims: Iterable[Claim], ratio: float) -> int:
    """The longest chain of steps with factor ``ratio``, each from the previous result."""
    best = 0
    chains: list[tuple[float, int]] = []  # (last result, length) of chains so far
    for claim in claims:
        if not any(abs(r - ratio) <= 1e-6 for r in _readings(claim.factor)):
            continue
        length = 1 + max((n for y, n in chains if abs(claim.operand - y) < _LINK), default=0)
        chains.append((claim.result, length))
        best = max(best, length)
    return best


def split_final(text: str, marker: str = ANSWER_MARKER) -> tuple[str, float | None]:
    """``(reasoning, final answer)``: the text before the LAST marker and the number right
    after it (None without a marker or a number)."""
    at = text.lower().rfind(marker.lower()) if marker else -1
    if at < 0:
        return text, None
    m = _ANY_NUMBER.search(text, at + len(marker))
    return text[:at], (_number(m.group(0)) if m else None)


def conclusion(reasoning: str) -> float | None:
    """The last number the reasoning derives or chooses (see the module's notes)."""
    value = None
    for m in _DERIVED.finditer(reasoning):
        value = _number(m["n"]) if _number(m["n"]) is not None else value
    return value


def audit(text: str, ratio: float | None = None, marker: str = ANSWER_MARKER) -> CotAudit:
    """One chain-of-thought answer audited; ``ratio``: the factor whose iterations are the
    reasoning depth (None: depth 0)."""
    reasoning, final = split_final(text, marker)
    claims = tuple(arithmetic_claims(reasoning))
    depth = reasoning_depth(claims, ratio) if ratio is not None else 0
    return CotAudit(claims, depth, conclusion(reasoning), final)


def audit_many(texts: Iterable[object], ratio: float | None = None,
               marker: str = ANSWER_MARKER) -> pd.DataFrame:
    """One row per text (``AUDIT_COLUMNS``): claims, wrong claims, depth, conclusion, final
    and whether they agree (1.0 / 0.0, NaN when either is missing). A missing text is a row
    of zeros and NaNs. Identical texts are audited once."""
    memo: dict[str, tuple] = {}
    rows = []
    nan = math.nan
    for text in texts:
        if not isinstance(text, str):
            rows.append((0, 0, 0, nan, nan, nan))
            continue
        row = memo.get(text)
        if row is None:
            a = audit(text, ratio, marker)
            agrees = a.final_agrees
            row = memo[text] = (
                len(a.claims), a.wrong_claims, a.depth,
                nan if a.conclusion is None else a.conclusion,
                nan if a.final is None else a.final,
                nan if agrees is None else float(agrees))
        rows.append(row)
    frame = pd.DataFrame.from_records(rows, columns=list(AUDIT_COLUMNS))
    return frame.astype({"claims": np.int64, "wrong_claims": np.int64, "depth": np.int64,
                         "conclusion": np.float64, "final": np.float64,
                         "final_agrees": np.float64})
