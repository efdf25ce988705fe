"""The servers' regex matcher: the same answers as ``re.fullmatch`` on the patterns simpipe
sends and on random ones, in one pass where ``re`` backtracks for ever, and bounded work
for patterns built to be expensive."""

from __future__ import annotations

import random
import re

import pytest

from simpipe.games.answer_format import ANSWER_MARKER, number_regex
from simpipe.servers.regex_automaton import (
    MAX_STATES,
    Automaton,
    RegexError,
    RegexTooComplex,
    compile_regex,
)

_ATOMS = ["a", "b", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", "(?:a|b)", "(a|)", "x", "[a-c]",
          r"\n", "$", "^", r"\Z", r"\A", r"[\d_]", "(?i:A)", "(?s:.)", "[^\\W]"]
_REPEATS = ["", "*", "+", "?", "{2}", "{1,3}", "*?", "{0,2}", "{2,}"]
_ALPHABET = "abx1_ \nA"


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    out = ""
    for _ in range(rng.randint(1, 4)):
        if depth < 2 and rng.random() < 0.25:
            inner = _random_pattern(rng, depth + 1)
            if rng.random() < 0.5:
                inner += "|" + _random_pattern(rng, depth + 1)
            atom = f"({inner})"
        else:
            atom = rng.choice(_ATOMS)
        out += atom + ("" if atom in ("$", "^", r"\Z", r"\A") else rng.choice(_REPEATS))
    return out


def test_random_patterns_match_as_re_does():
    rng = random.Random(20)
    checked = 0
    for _ in range(300):
        pattern = _random_pattern(rng)
        automaton = Automaton(pattern)
        for _ in range(10):
            text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 5)))
            # (length 5 at most: some of these patterns make re itself backtrack for long)
            assert automaton.fullmatch(text) == bool(re.fullmatch(pattern, text)), (
                pattern, text)
            checked += 1
    assert checked == 3000


@pytest.mark.parametrize("cot", [False, True])
@pytest.mark.parametrize("decimals", [0, 2])
def test_simpipes_own_answer_regexes_match_as_re_does(cot, decimals):
    pattern = number_regex(0, 100, cot, decimals=decimals)
    automaton = compile_regex(pattern)
    reasoning = "Others guess the middle; two thirds of it is lower. " * 4
    texts = [str(n) for n in range(-5, 120)] + [" 42", "42.5", "100.00", "07", ""]
    texts += [f"{reasoning}{ANSWER_MARKER} {n}" for n in (0, 42, 100, 101)]
    texts += [f"{reasoning}{ANSWER_MARKER} {ANSWER_MARKER} 4", reasoning, "Final answer:1"]
    for text in texts:
        assert automaton.fullmatch(text) == bool(re.fullmatch(pattern, text)), text


def test_a_catastrophic_pattern_costs_one_pass():
    """``re`` needs about 2**n steps here; a text of 5,000 characters is answered."""
    automaton = Automaton("([^Z]|[^Z])*Z")
    assert automaton.fullmatch("x" * 5000 + "Z")
    assert not automaton.fullmatch("x" * 5000 + " Final answer: 42")
    assert automaton.work < 100


@pytest.mark.parametrize(("pattern", "words"), [
    (r"(a)\1", "back-references are not supported"),
    ("(?=a)a", "look-around are not supported"),
    ("(?<!b)a", "look-around are not supported"),
    ("(?>a)", "atomic groups are not supported"),
    ("a*+", "possessive repeats are not supported"),
    (r"(a)?(?(1)b|c)", "conditional groups are not supported"),
    (r"\ba", r"word boundaries (\b, \B) are not supported"),
    ("(?m)^a$", "line anchors (re.MULTILINE) are not supported"),
    ("a(", "missing ), unterminated subpattern at position 1"),
])
def test_what_constrained_decoders_refuse_is_refused_with_the_reason(pattern, words):
    with pytest.raises(RegexError, match=re.escape(words)):
        Automaton(pattern)


@pytest.mark.parametrize(("pattern", "words"), [
    ("(a{100}){101}", f"more than {MAX_STATES} automaton states"),
    ("(" * 3000 + ")" * 3000, "groups nested too deeply"),
    ("a" * 20_001, "pattern longer than 20000 characters"),
])
def test_patterns_beyond_the_budget_are_too_complex(pattern, words):
    with pytest.raises(RegexTooComplex, match=re.escape(words)):
        Automaton(pattern)


def test_a_pattern_whose_dfa_explodes_runs_out_of_work_not_of_time():
    """(a|b)*a(a|b){n}: the DFA has 2**n states, each built from the NFA on demand."""
    automaton = Automaton("(a|b)*a(a|b){40}")
    rng = random.Random(1)
    with pytest.raises(RegexTooComplex, match="more than 200000 automaton steps"):
        for _ in range(100):
            automaton.fullmatch("".join(rng.choice("ab") for _ in range(4000)))
