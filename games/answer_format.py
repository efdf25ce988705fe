"""Output constraints that admit only a number in ``[low, high]``: GBNF, regex, JSON schema.

Plain strings and dicts; the inference back-ends decide how to send them.

The number form (documented; the tests pin it):

* an optional leading space (a completion cue such as ``"My number:"`` is naturally followed
  by one), then an integer without leading zeros, optionally negative;
* by default no decimal part (``decimals=0``): a base model ends its answer with a "."
  as a sentence end, and a grammar that admits decimals then forces digits after it
  (measured with Gemma 3 270M: ``" 38."`` cut off at 4 tokens, heading for ``38.x``);
* with ``decimals=k`` an optional decimal part of 1 to k digits. At the upper bound only
  zeros may follow (``100``, ``100.0``, ``100.00``, never ``100.5``); for negative numbers the
  same holds at the lower bound.

For ``low=0, high=100`` the GBNF is exactly::

    root ::= " "? number
    number ::= "100" | [1-9] [0-9] | [0-9]

and with ``decimals=2``::

    root ::= " "? number
    number ::= "100" zeros? | ([1-9] [0-9] | [0-9]) frac?
    frac ::= "." [0-9] [0-9]?
    zeros ::= "." "0" "0"?

Non-integer bounds are rounded outward (``floor(low)``, ``ceil(high)``): the constraint admits a
slight superset and the parser's range check rejects the rest.

For chain of thought only the end is constrained: free reasoning that cannot contain the marker,
then the marker, an optional space and the number. "Cannot contain" is built from the marker's
KMP automaton, so the regex needs no look-ahead (outlines/TGI and xgrammar do not support it).
"""

from __future__ import annotations

import math

ANSWER_MARKER = "Final answer:"
DEFAULT_DECIMALS = 0

# One digit position as an inclusive (lo, hi) digit range.
_Digits = tuple[int, int]
_Pattern = list[_Digits]

_REGEX_SPECIAL = set("\\.^$*+?{}[]|()")
_CLASS_SPECIAL = set("\\]^-[")


def _same_length(x: str, y: str) -> list[_Pattern]:
    """Digit patterns for the integers x..y written with the same number of digits."""
    if not x:
        return [[]]
    x0, y0 = int(x[0]), int(y[0])
    if x0 == y0:
        return [[(x0, x0), *p] for p in _same_length(x[1:], y[1:])]
    n = len(x) - 1
    tail_min, tail_max = x[1:] == "0" * n, y[1:] == "9" * n
    parts: list[_Pattern] = []
    if not tail_min:
        parts += [[(x0, x0), *p] for p in _same_length(x[1:], "9" * n)]
    first, last = (x0 if tail_min else x0 + 1), (y0 if tail_max else y0 - 1)
    if first <= last:
        parts.append([(first, last)] + [(0, 9)] * n)
    if not tail_max:
        parts += [[(y0, y0), *p] for p in _same_length("0" * n, y[1:])]
    return parts


def int_patterns(a: int, b: int) -> list[_Pattern]:
    """Digit patterns for exactly the canonical forms of ``a..b`` (``0 <= a``), highest first."""
    out: list[_Pattern] = []
    for n in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = min(b, 10**n - 1)
        if lo <= hi:
            out += _same_length(str(lo), str(hi))
    out.reverse()
    return out


def _int_bounds(low: float, high: float) -> tuple[int, int]:
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"the range must be finite, got [{low}, {high}]")
    if low > high:
        raise ValueError(f"low ({low}) must not exceed high ({high})")
    return math.floor(low), math.ceil(high)


def _parts(low: float, high: float, decimals: int) -> list[tuple[bool, int, int, str]]:
    """``(negative, a, b, tail)`` pieces: magnitudes a..b, then ``tail`` "frac" | "zeros" | ""."""
    if decimals < 0:
        raise ValueError(f"decimals must be >= 0, got {decimals}")
    lo, hi = _int_bounds(low, high)
    pieces: list[tuple[bool, int, int, str]] = []
    for negative, a, b in ((False, max(lo, 0), hi), (True, max(-hi, 0), -lo)):
        if b < 0 or a > b or (negative and lo >= 0):
            continue
        if decimals == 0:
            pieces.append((negative, a, b, ""))
            continue
        # The extreme magnitude takes only zero decimals: 100.5 > 100, -5.5 < -5.
        pieces.append((negative, b, b, "zeros"))
        if a <= b - 1:
            pieces.append((negative, a, b - 1, "frac"))
    return pieces


# ---------------------------------------------------------------- GBNF


def _gbnf_pattern(p: _Pattern) -> str:
    items: list[str] = []
    literal = ""
    for lo, hi in p:
        if lo == hi:
            literal += str(lo)
            continue
        if literal:
            items.append(f'"{literal}"')
            literal = ""
        items.append(f"[{lo}-{hi}]")
    if literal:
        items.append(f'"{literal}"')
    return " ".join(items)


def _gbnf_number(low: float, high: float, decimals: int) -> list[str]:
    alts: list[str] = []
    tails: set[str] = set()
    for negative, a, b, tail in _parts(low, high, decimals):
        pats = [_gbnf_pattern(p) for p in int_patterns(a, b)]
        body = " | ".join(pats)
        if len(pats) > 1 and (tail or negative):
            body = f"({body})"
        if negative:
            body = f'"-" {body}'
        if tail:
            body += f" {tail}?"
            tails.add(tail)
        alts.append(body)
    rules = ["number ::= " + " | ".join(alts)]
    if "frac" in tails:
        rules.append('frac ::= "." [0-9]' + " [0-9]?" * (decimals - 1))
    if "zeros" in tails:
        rules.append('zeros ::= "." "0"' + ' "0"?' * (decimals - 1))
    return rules


def _gbnf_char(c: str, in_class: bool) -> str:
    # llama.cpp knows only \\ \" \[ \] \n \r \t and \x/\u escapes: "-" and "^" go as hex.
    if c in '\\"[]':
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F or (in_class and c in "^-"):
        return f"\\x{ord(c):02X}"
    return c


def _gbnf_class(chars: str, negate: bool) -> str:
    body = "".join(_gbnf_char(c, in_class=True) for c in sorted(set(chars)))
    return f"[^{body}]" if negate else f"[{body}]"


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_gbnf_char(c, in_class=False) for c in text) + '"'


def _avoid_dfa(marker: str) -> list[dict[str, int]]:
    """KMP transitions: ``dfa[i][c]`` is the state after reading c having matched ``i`` chars.

    Characters absent from the marker (and absent from a state's map) lead to state 0.
    """
    alphabet = sorted(set(marker))
    dfa: list[dict[str, int]] = []
    for i in range(len(marker)):
        row: dict[str, int] = {}
        for c in alphabet:
            seen = marker[:i] + c
            k = min(len(seen), len(marker))
            while k and not seen.endswith(marker[:k]):
                k -= 1
            if k:
                row[c] = k
        dfa.append(row)
    return dfa


def _gbnf_reasoning(marker: str) -> list[str]:
    """Rules ``r0..r{m-1}``: any text that never completes ``marker`` (``r0`` is the start)."""
    dfa = _avoid_dfa(marker)
    rules = []
    for i, row in enumerate(dfa):
        alts = [f"{_gbnf_class(''.join(row), negate=True)} r0"]
        targets: dict[int, str] = {}
        for c, j in row.items():
            if j < len(marker):
                targets[j] = targets.get(j, "") + c
        alts += [f"{_gbnf_class(cs, negate=False)} r{j}" for j, cs in sorted(targets.items())]
        # The ``(x r)?`` shape is the one llama.cpp's own json.gbnf uses for unbounded text.
        rules.append(f"r{i} ::= ({' | '.join(alts)})?")
    return rules


def number_grammar(
    low: float,
    high: float,
    cot: bool = False,
    *,
    decimals: int = DEFAULT_DECIMALS,
    marker: str = ANSWER_MARKER,
) -> str:
    """GBNF (llama.cpp) admitting a number in ``[low, high]``; for cot, reasoning + marker first."""
    if cot:
        if not marker:
            raise ValueError("the cot marker must not be empty")
        root = f'root ::= r0 {_gbnf_literal(marker)} " "? number'
        rules = [root, *_gbnf_number(low, high, decimals), *_gbnf_reasoning(marker)]
    else:
        rules = ['root ::= " "? number', *_gbnf_number(low, high, decimals)]
    return "\n".join(rules) + "\n"


# ---------------------------------------------------------------- regex


def _rx_escape(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def _rx_class(chars: str, negate: bool) -> str:
    chars = "".join(sorted(set(chars)))
    if not negate and len(chars) == 1:
        return _rx_escape(chars)
    body = "".join("\\" + c if c in _CLASS_SPECIAL else c for c in chars)
    return f"[^{body}]" if negate else f"[{body}]"


def _rx_pattern(p: _Pattern) -> str:
    atoms = [str(lo) if lo == hi else f"[{lo}-{hi}]" for lo, hi in p]
    # Runs of [0-9] become [0-9]{n}, for readability.
    text, i = "", 0
    while i < len(atoms):
        j = i
        while j < len(atoms) and atoms[j] == "[0-9]":
            j += 1
        if j - i > 1:
            text += f"[0-9]{{{j - i}}}"
        else:
            text += atoms[i]
            j = i + 1
        i = j
    return text


def _rx_number(low: float, high: float, decimals: int) -> str:
    tails = {
        "": "",
        "frac": r"(?:\.[0-9]" + ("" if decimals == 1 else f"{{1,{decimals}}}") + ")?",
        "zeros": r"(?:\.0" + ("" if decimals == 1 else f"{{1,{decimals}}}") + ")?",
    }
    alts = []
    for negative, a, b, tail in _parts(low, high, decimals):
        pats = [_rx_pattern(p) for p in int_patterns(a, b)]
        # Always grouped: the number is concatenated after " ?" or the cot prefix.
        body = f"(?:{'|'.join(pats)})" if len(pats) > 1 else pats[0]
        alts.append(("-" if negative else "") + body + tails[tail])
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _rx_alt(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "(?:" + "|".join(items) + ")"


def _rx_up_to_marker(marker: str) -> str:
    """Regex for any text whose first occurrence of ``marker`` is at its very end.

    State elimination on the marker's KMP automaton (states 0..m-1, final state m).
    """
    m = len(marker)
    dfa = _avoid_dfa(marker)
    edges: dict[tuple[int, int], list[str]] = {}
    for i, row in enumerate(dfa):
        edges.setdefault((i, 0), []).append(_rx_class("".join(row), negate=True))
        targets: dict[int, str] = {}
        for c, j in row.items():
            targets[j] = targets.get(j, "") + c
        for j, cs in targets.items():
            edges.setdefault((i, j), []).append(_rx_class(cs, negate=False))
    for k in range(m - 1, 0, -1):
        loop = edges.pop((k, k), None)
        star = f"(?:{'|'.join(loop)})*" if loop else ""
        preds = [(p, r) for (p, q), r in edges.items() if q == k]
        succs = [(q, r) for (p, q), r in edges.items() if p == k]
        for p, r_in in preds:
            for q, r_out in succs:
                edges.setdefault((p, q), []).append(_rx_alt(r_in) + star + _rx_alt(r_out))
        edges = {key: r for key, r in edges.items() if k not in key}
    loop = edges.get((0, 0), [])
    star = f"(?:{'|'.join(loop)})*" if loop else ""
    return star + _rx_alt(edges[(0, m)])


def number_regex(
    low: float,
    high: float,
    cot: bool = False,
    *,
    decimals: int = DEFAULT_DECIMALS,
    marker: str = ANSWER_MARKER,
) -> str:
    """Unanchored regex (use ``re.fullmatch``) admitting a number in ``[low, high]``.

    Look-ahead free, so outlines (TGI), vLLM and xgrammar accept it.
    """
    number = " ?" + _rx_number(low, high, decimals)
    if not cot:
        return number
    if not marker:
        raise ValueError("the cot marker must not be empty")
    return _rx_up_to_marker(marker) + number


def number_lark(low: float, high: float, *, decimals: int = DEFAULT_DECIMALS) -> str:
    """The basic answer (``number_regex``, same language) as an llguidance grammar, which
    llama.cpp builds with llguidance take in place of GBNF.

    Why: llama.cpp checks a sampled token against a GBNF grammar cheaply, but when the
    token is rejected it applies the grammar to the whole vocabulary (262,144 tokens for
    Gemma 3) before it samples again, and a small base model's first token is often not a
    digit. llguidance computes the allowed-token mask from a token trie instead (measured:
    docs/measurements.md, "The answer grammar's cost").
    """
    pattern = number_regex(low, high, decimals=decimals).replace("/", "\\/")
    return f"%llguidance {{}}\nstart: /{pattern}/\n"


def number_json_schema(low: float, high: float, *, integer: bool = False) -> dict:
    """JSON schema ``{"number": <low..high>}`` (``integer``: a whole number).

    Some converters ignore ``minimum``/``maximum``, so the parser still range-checks.
    """
    _int_bounds(low, high)
    kind = "integer" if integer else "number"
    return {
        "type": "object",
        "properties": {"number": {"type": kind, "minimum": low, "maximum": high}},
        "required": ["number"],
        "additionalProperties": False,
    }


# ---------------------------------------------------------------- the language, as prefixes


class IntegerAnswers:
    """The strings ``number_grammar(low, high)`` admits (integers, no CoT), as a prefix test.

    Built from the same digit patterns as the grammar, so the two cannot disagree. Used to
    walk the tree of answer prefixes token by token: which next pieces keep a prefix inside
    the language, and when a prefix is already a whole answer.
    """

    def __init__(self, low: float, high: float) -> None:
        # (sign, patterns): "" or "-" followed by one of the digit patterns.
        self._pieces = [("-" if negative else "", int_patterns(a, b))
                        for negative, a, b, _ in _parts(low, high, 0)]
        self._bounds = _int_bounds(low, high)
        self.alphabet = frozenset(" -0123456789")

    def _split(self, text: str) -> list[tuple[str, list[_Pattern]]]:
        body = text[1:] if text.startswith(" ") else text
        out = []
        for sign, patterns in self._pieces:
            if sign and not body.startswith(sign) and sign.startswith(body):
                out.append((body, []))  # "" or "-" alone: a prefix of the sign itself
            elif body.startswith(sign):
                out.append((body[len(sign):], patterns))
        return out

    @staticmethod
    def _matches(digits: str, pattern: _Pattern) -> bool:
        # A prefix of the pattern: zip stops at the end of ``digits``.
        return len(digits) <= len(pattern) and all(
            c.isdigit() and lo <= int(c) <= hi
            for c, (lo, hi) in zip(digits, pattern, strict=False))

    def is_prefix(self, text: str) -> bool:
        """Whether some admitted answer starts with ``text`` (the empty string is one)."""
        if not set(text) <= self.alphabet or " " in text[1:]:
            return False
        for digits, patterns in self._split(text):
            if not patterns or any(self._matches(digits, p) for p in patterns):
                return True
        return False

    def ends(self, limit: int = 256) -> tuple[str, ...]:
        """The admitted answers, each after the leading space, that no admitted answer
        extends (" 0", " 11" to " 99" and " 100" for 0..100): a generation that reaches one
        can only end there, so a server may stop it at once instead of decoding one more
        token to draw the end of generation the grammar forces. Empty for a range of more
        than ``limit`` integers (a stop string each)."""
        lo, hi = self._bounds  # rounded outward, as the grammar rounds them
        if hi - lo + 1 > limit:
            return ()
        extend = sorted(self.alphabet - {" "})
        return tuple(text for text in (f" {i}" for i in range(lo, hi + 1))
                     if self.is_complete(text)
                     and not any(self.is_prefix(text + c) for c in extend))

    def longest(self) -> str:
        """The admitted answer of the most characters, with its leading space (" 100" for
        0..100, " -100" for -100..5): no tokenizer spells it in more tokens than that, and
        a token limit below it can cut an answer to a shorter number."""
        lo, hi = self._bounds
        return max((f" {hi}", f" {lo}"), key=len)

    def is_complete(self, text: str) -> bool:
        """Whether ``text`` is an admitted answer (generation may end after it)."""
        if not set(text) <= self.alphabet or " " in text[1:]:
            return False
        return any(digits and any(len(digits) == len(p) and self._matches(digits, p)
                                  for p in patterns)
                   for digits, patterns in self._split(text))
