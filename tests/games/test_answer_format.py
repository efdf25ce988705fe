"""Output constraints: the regex admits exactly the numbers in range; the GBNF as documented."""

from __future__ import annotations

import itertools
import math
import re

import pytest

from simpipe.games.answer_format import (
    ANSWER_MARKER,
    IntegerAnswers,
    int_patterns,
    number_grammar,
    number_json_schema,
    number_regex,
)
from simpipe.games.answers import NumberAnswer

DOCUMENTED_0_100 = (
    'root ::= " "? number\n'
    'number ::= "100" zeros? | ([1-9] [0-9] | [0-9]) frac?\n'
    'frac ::= "." [0-9] [0-9]?\n'
    'zeros ::= "." "0" "0"?\n'
)


def test_gbnf_0_100_default_is_the_documented_integer_form() -> None:
    assert number_grammar(0, 100, cot=False) == (
        'root ::= " "? number\nnumber ::= "100" | [1-9] [0-9] | [0-9]\n'
    )


def test_gbnf_0_100_with_decimals_is_the_documented_form() -> None:
    assert number_grammar(0, 100, cot=False, decimals=2) == DOCUMENTED_0_100


@pytest.mark.parametrize("decimals", [0, 2])
def test_regex_0_100_accepts_exactly_the_integers_in_range(decimals: int) -> None:
    rx = re.compile(number_regex(0, 100, cot=False, decimals=decimals))
    for n in range(-5, 106):
        assert bool(rx.fullmatch(str(n))) == (0 <= n <= 100), n
        assert bool(rx.fullmatch(" " + str(n))) == (0 <= n <= 100), n
    assert number_regex(0, 100) == " ?(?:100|[1-9][0-9]|[0-9])"
    assert not rx.fullmatch("33.")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("33.5", True), ("0.25", True), ("99.99", True), ("0.0", True), ("100.0", True),
        ("100.00", True), ("100.5", False), ("100.01", False), ("33.333", False), ("33.", False),
        (".5", False), ("007", False), ("00", False), ("-0.5", False), ("-1", False), ("+5", False),
        ("1e2", False), ("", False), ("  5", False), ("5 ", False), ("1,000", False),
    ],
)
def test_regex_0_100_decimals(text: str, ok: bool) -> None:
    assert bool(re.fullmatch(number_regex(0, 100, decimals=2), text)) == ok
    if "." in text:
        assert not re.fullmatch(number_regex(0, 100), text)


@pytest.mark.parametrize(("low", "high"), [(10, 55), (0, 7), (1, 1000), (-5, 7), (-20, -3), (0, 1)])
def test_regex_generalises_to_integer_ranges(low: int, high: int) -> None:
    rx = re.compile(number_regex(low, high, decimals=2))
    rx_int = re.compile(number_regex(low, high))
    for n in range(-1100, 1101):
        inside = low <= n <= high
        assert bool(rx.fullmatch(str(n))) == inside, (low, high, n)
        assert bool(rx_int.fullmatch(str(n))) == inside, (low, high, n)
        for frac in (".5", ".25", ".0", ".00"):
            text = str(n) + frac
            assert bool(rx.fullmatch(text)) == (low <= float(text) <= high), text
            assert not rx_int.fullmatch(text)


def test_int_patterns_cover_exactly_the_range() -> None:
    for a, b in [(0, 0), (0, 9), (5, 123), (19, 20), (99, 101), (0, 10_000), (123, 4567)]:
        covered = set()
        for pattern in int_patterns(a, b):
            digits = [range(lo, hi + 1) for lo, hi in pattern]
            covered |= {int("".join(map(str, d))) for d in itertools.product(*digits)}
        assert covered == set(range(a, b + 1)), (a, b)


def test_non_integer_bounds_round_outward() -> None:
    rx = re.compile(number_regex(0.5, 99.5, decimals=2))
    assert rx.fullmatch("0.25") and rx.fullmatch("99.75") and rx.fullmatch("100")
    assert not rx.fullmatch("101") and not rx.fullmatch("100.5")


@pytest.mark.parametrize("bad", [(float("nan"), 1.0), (0.0, float("inf")), (5.0, 1.0)])
def test_bad_ranges_raise_value_error(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        number_regex(*bad)


def _first_marker_at_end(text: str, marker: str) -> bool:
    return text.endswith(marker) and text.find(marker) == len(text) - len(marker)


def test_cot_regex_requires_the_marker_and_a_number_after_it() -> None:
    rx = re.compile(number_regex(0, 100, cot=True), re.DOTALL)
    assert rx.fullmatch(f"2/3 of 50 is 33.\nSo I go lower. {ANSWER_MARKER} 22")
    assert rx.fullmatch(f"{ANSWER_MARKER}22")
    assert rx.fullmatch(f"Final answers: Final answe {ANSWER_MARKER} 7")
    assert not rx.fullmatch("2/3 of 50 is 33. So 22")
    assert not rx.fullmatch(f"reasoning {ANSWER_MARKER} 101")
    assert not rx.fullmatch(f"reasoning {ANSWER_MARKER} 22 and more")
    # Reasoning may not contain the marker itself.
    assert not rx.fullmatch(f"{ANSWER_MARKER} 5 {ANSWER_MARKER} 7")


@pytest.mark.parametrize("marker", ["ab", "aab", "abab", "aba", "a-]"])
def test_cot_regex_prefix_is_exactly_first_marker_occurrence(marker: str) -> None:
    # Brute force over a small alphabet, including self-overlapping markers.
    rx = re.compile(number_regex(0, 9, cot=True, decimals=0, marker=marker), re.DOTALL)
    alphabet = sorted(set(marker)) + ["x"]
    for n in range(0, 8):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert bool(rx.fullmatch(text + "5")) == _first_marker_at_end(text, marker), text


def test_cot_gbnf_constrains_only_the_end() -> None:
    g = number_grammar(0, 100, cot=True)
    assert g.startswith(f'root ::= r0 "{ANSWER_MARKER}" " "? number\n')
    assert 'number ::= "100" | [1-9] [0-9] | [0-9]' in g
    assert "r0 ::= ([^F] r0 | [F] r1)?" in g
    # One state per marker character; the last never completes the marker.
    assert f"r{len(ANSWER_MARKER) - 1} ::= ([^:F] r0 | [F] r1)?" in g


def test_gbnf_escapes_what_llama_cpp_cannot_read_raw() -> None:
    g = number_grammar(0, 9, cot=True, marker='a-^"\\\n]')
    assert '"a-^\\"\\\\\\x0A\\]"' in g
    assert "[\\x2D]" in g and "[\\x5E]" in g


def test_json_schema() -> None:
    assert number_json_schema(0, 100) == {
        "type": "object",
        "properties": {"number": {"type": "number", "minimum": 0, "maximum": 100}},
        "required": ["number"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(("low", "high"), [(0, 100), (-10, 10), (0, 20), (0.5, 7.2)])
def test_ends_are_exactly_the_answers_no_answer_extends(low: float, high: float) -> None:
    # A server stops a generation at an end (a stop string) instead of drawing the end of
    # generation the grammar forces there: only right where no answer goes on.
    lang = IntegerAnswers(low, high)
    answers = [f" {i}" for i in range(math.floor(low), math.ceil(high) + 1)]
    maximal = [a for a in answers if not any(b != a and b.startswith(a) for b in answers)]
    assert lang.ends() == tuple(maximal)
    assert all(lang.is_complete(a) for a in maximal)


def test_ends_of_0_to_100_and_where_there_are_none() -> None:
    assert IntegerAnswers(0, 100).ends() == (" 0", *(f" {i}" for i in range(11, 101)))
    assert IntegerAnswers(0, 1000).ends() == ()  # a stop string each: over the limit
    assert NumberAnswer(0, 100).ends() == IntegerAnswers(0, 100).ends()
    # a chain of thought's reasoning may hold any number
    assert NumberAnswer(0, 100, cot=True).ends() == ()
