"""The tolerant parser: a table of odd model outputs, and properties over arbitrary text."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.parsing import ParsedAnswer, parse_answer, parse_many

OK, UNPARSED, OUT = "ok", "unparsed", "out_of_range"
NO_FINAL, CUT = "no_final_answer", "truncated"
_UNPARSED = ParsedAnswer(None, UNPARSED, None)

# (text, cot, expected status, expected value)
TABLE = [
    ("33", False, OK, 33.0),
    ("  42\n", False, OK, 42.0),
    ("33.5", False, OK, 33.5),
    ("0", False, OK, 0.0),
    ("100", False, OK, 100.0),
    ('{"number": 33}', False, OK, 33.0),
    ('{"guess": "33"}', False, OK, 33.0),
    ("{'answer': 12.5}", False, OK, 12.5),
    ("I pick 33.5", False, OK, 33.5),
    ("my guess is 22", False, OK, 22.0),
    ("My final answer is 19.", False, OK, 19.0),
    ("I choose the number 40 because 2/3 of 60 is 40", False, OK, 40.0),
    ("**Final Answer:** 17", False, OK, 17.0),
    ("100/3", False, OK, 100 / 3),
    ("33%", False, OK, 33.0),
    ("1,000", False, OUT, 1000.0),
    ("-5", False, OUT, -5.0),
    ("\u22125", False, OUT, -5.0),
    ("101", False, OUT, 101.0),
    ("abc33def", False, OK, 33.0),
    ("Gemma3 says 20", False, OK, 20.0),
    ("round-3", False, OK, 3.0),
    ("33\n\nRound 4 of 3.\nMy number: 50", False, OK, 33.0),
    ("", False, UNPARSED, None),
    ("   ", False, UNPARSED, None),
    (None, False, UNPARSED, None),
    ("no idea", False, UNPARSED, None),
    ("nan", False, UNPARSED, None),
    ("inf", False, UNPARSED, None),
    ("NaN or Infinity", False, UNPARSED, None),
    ("9" * 400, False, UNPARSED, None),
    ("1/0", False, UNPARSED, None),
    # cot: the number after the LAST marker; without one the answer is no_final_answer and
    # value keeps the fallback (an answer phrase, else the last number), never a guess.
    (f"2/3 of 50 is 33. {ANSWER_MARKER} 22", True, OK, 22.0),
    (f"{ANSWER_MARKER} 10. Hmm, no. {ANSWER_MARKER} 15", True, OK, 15.0),
    ("2/3 of 50 is 33, and 2/3 of 33 is 22. final answer: 22", True, OK, 22.0),
    ("If all pick 50, the target is 33. My guess is 25. Others may go to 20.", True, NO_FINAL,
     25.0),
    ("If all pick 50, the target is 33. Going one step further gives 22.", True, NO_FINAL, 22.0),
    (f"Thinking... {ANSWER_MARKER} 150", True, OUT, 150.0),
    (f"Thinking about 30... {ANSWER_MARKER}", True, NO_FINAL, 30.0),
    ("Let's think step by step.", True, NO_FINAL, None),
    # The marker is honoured in basic mode too.
    (f"Hmm. {ANSWER_MARKER} 7", False, OK, 7.0),
]


@pytest.mark.parametrize(("text", "cot", "status", "value"), TABLE)
def test_odd_outputs(text: object, cot: bool, status: str, value: float | None) -> None:
    parsed = parse_answer(text, 0, 100, cot=cot)
    assert parsed.status == status
    if value is None:
        assert parsed.value is None
    else:
        assert parsed.value == pytest.approx(value)
    assert parsed.guess == (parsed.value if status == OK else None)


def test_non_string_inputs_never_raise() -> None:
    for text in (None, 33, 3.5, b"33", float("nan"), object(), ["33"]):
        assert parse_answer(text, 0, 100) == ParsedAnswer(None, UNPARSED, None)


def test_parse_many() -> None:
    texts = ["33", "x", "150", None, "33", f"{ANSWER_MARKER} 5"]
    guesses, statuses = parse_many(texts, 0, 100)
    assert guesses.dtype == np.float64
    np.testing.assert_array_equal(guesses, [33.0, np.nan, np.nan, np.nan, 33.0, 5.0])
    assert list(statuses) == [OK, UNPARSED, OUT, UNPARSED, OK, OK]
    guesses, statuses = parse_many(texts, 0, 100, cot=True)
    np.testing.assert_array_equal(guesses, [np.nan] * 5 + [5.0])
    assert list(statuses) == [NO_FINAL, NO_FINAL, NO_FINAL, UNPARSED, NO_FINAL, OK]
    # The same text, cut or not, is two answers.
    _, statuses = parse_many(["33", "33"], 0, 100, cut=[True, False])
    assert list(statuses) == [CUT, OK]
    with pytest.raises(ValueError, match="one per text"):
        parse_many(["33"], 0, 100, cut=[True, False])


CUT_TABLE = [
    # (text, cot, status, value): the back-end stopped each of these at its token limit.
    # A chain of thought cut before its marker never gave an answer; the number read from
    # it is kept as value only.
    ("2/3 of 50 is 33.3, so others will pick 33 and I should go lower, to", True, CUT, 33.0),
    ("Let's think step by step about what", True, CUT, None),
    # Cut right after the marked number: its last digits may be missing.
    (f"Others pick 30. {ANSWER_MARKER} 2", True, CUT, 2.0),
    (f"Others pick 30. {ANSWER_MARKER} 20.", True, CUT, 20.0),
    # Cut after the marked number and more text: the number was whole.
    (f"{ANSWER_MARKER} 20. Because the others", True, OK, 20.0),
    # Basic: a number followed by rambling was whole; a number at the very end may not be.
    ("33\n\nRound 4 of 3.\nMy num", False, OK, 33.0),
    (" 10", False, CUT, 10.0),
    # ... unless no longer number fits the range: " 100" (4 tokens for Gemma, digit by
    # digit) at max_tokens = 4 is a whole answer in 0..100, and so is the marked 100.
    (" 100", False, OK, 100.0),
    (f"Others pick 30. {ANSWER_MARKER} 100", True, OK, 100.0),
    # 0 may still become 0.5: cut.
    (" 0", False, CUT, 0.0),
    ("", False, CUT, None),
    ("I think", False, CUT, None),
]


@pytest.mark.parametrize(("text", "cot", "status", "value"), CUT_TABLE)
def test_answers_cut_at_the_token_limit(text: str, cot: bool, status: str,
                                        value: float | None) -> None:
    parsed = parse_answer(text, 0, 100, cot=cot, cut=True)
    assert (parsed.status, parsed.value) == (status, value)
    assert parsed.guess == (parsed.value if status == OK else None)


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text: str) -> None:
    for cot in (False, True):
        parsed = parse_answer(text, 0, 100, cot=cot)
        assert parsed.status in (OK, UNPARSED, OUT, NO_FINAL)
        if parsed.status == OK:
            assert math.isfinite(parsed.guess) and 0 <= parsed.guess <= 100


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60), st.sampled_from([False, True]))
def test_never_raises_with_marker_and_digits(noise: str, cot: bool) -> None:
    parsed = parse_answer(f"{noise} {ANSWER_MARKER} {noise}9/{noise}", 0, 100, cot=cot)
    assert parsed.status in (OK, UNPARSED, OUT, NO_FINAL)
    assert parsed.guess == (parsed.value if parsed.status == OK else None)


PHRASES = [
    "{}",
    " {} ",
    "I pick {}",
    "I choose {}.",
    "My guess is {}",
    "My number: {}",
    "my final answer is {}",
    '{{"number": {}}}',
    '{{"guess": "{}"}}',
    "After some thought, I'll go with {}.",
    "Reasoning about the others... " + ANSWER_MARKER + " {}",
]

numbers = st.one_of(
    st.integers(-1000, 1000).map(float),
    st.decimals(-1000, 1000, places=2, allow_nan=False, allow_infinity=False).map(float),
)


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


@settings(max_examples=300, deadline=None)
@given(numbers, st.sampled_from(PHRASES), st.sampled_from([False, True]))
def test_number_in_a_phrase_parses_back(x: float, phrase: str, cot: bool) -> None:
    text = phrase.format(_fmt(x))
    parsed = parse_answer(text, 0, 100, cot=cot)
    assert parsed.value == pytest.approx(x), text
    if cot and ANSWER_MARKER not in text:
        # Not the asked-for form: the number is read, never taken as the answer.
        assert parsed.status == NO_FINAL and parsed.guess is None
        return
    # In range iff ok.
    assert (parsed.status == OK) == (0 <= x <= 100), text
    assert parsed.status in (OK, OUT)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" " * 20_000 + "x", _UNPARSED),
        ("number:" + " " * 20_000 + "x", _UNPARSED),
        ("5" + " " * 20_000 + "/ x", ParsedAnswer(5.0, OK, 5.0)),
        ("**" * 10_000 + "x", _UNPARSED),
        ("my number" + " " * 20_000, _UNPARSED),
        ("my number" + " " * 20_000 + "7", ParsedAnswer(7.0, OK, 7.0)),
        ("1," * 10_000, ParsedAnswer(1.0, OK, 1.0)),
        (ANSWER_MARKER * 2_000, _UNPARSED),
    ],
)
def test_long_blank_runs_parse_like_short_ones(text: str, expected: ParsedAnswer) -> None:
    # Inputs that made nested \s* patterns backtrack quadratically: the answer must still be
    # the one a short text gets (Python's re has no step counter to bound the work itself).
    assert parse_answer(text, 0, 100) == expected, text[:20]
    # None of them is in the marked form: the same number read, never taken as the answer.
    assert parse_answer(text, 0, 100, cot=True) == ParsedAnswer(None, NO_FINAL, expected.value)
