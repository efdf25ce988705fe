"""Audits of chain-of-thought text: arithmetic, the final answer against the reasoning's
conclusion, and reasoning depth."""

from __future__ import annotations

import math

import pytest

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.cot_audit import (
    AUDIT_COLUMNS,
    arithmetic_claims,
    audit,
    audit_many,
    conclusion,
    split_final,
)

TWO_THIRDS = 2 / 3


@pytest.mark.parametrize(("text", "operand", "result", "right"), [
    ("2/3 of 50 is 33.3", 50, 33.3, True),
    ("2/3 of 50 is 33.33", 50, 33.33, True),
    ("2/3 of 50 is 33", 50, 33, True),  # cut to whole numbers
    ("2/3 of 100 is 67", 100, 67, True),  # rounded
    ("2/3 of 50 is 34", 50, 34, False),
    ("2/3 of 50 is 33.4", 50, 33.4, False),
    ("2/3 of 50 is 25", 50, 25, False),
    ("two thirds of the average of 45 would be 30", 45, 30, True),
    ("(2/3) × 50 ≈ 33.3", 50, 33.3, True),
    ("2/3 * 50 = 33.3", 50, 33.3, True),
    ("50 * 2/3 = 33.3", 50, 33.3, True),
    ("50 times 2/3 is 40", 50, 40, False),
    ("0.67 * 50 = 33.3", 50, 33.3, True),  # a rounded factor read as the fraction it rounds
    ("0.67 * 50 = 33.5", 50, 33.5, True),  # ... or as written
    ("66.7% of 50 is 33.35", 50, 33.35, True),
    ("half of 1,000 is 500", 1000, 500, True),
])
def test_an_arithmetic_statement_is_found_and_checked(text: str, operand: float, result: float,
                                                      right: bool) -> None:
    (claim,) = arithmetic_claims(f"I think {text}, so that is that.")
    assert (claim.operand, claim.result, claim.right) == (operand, result, right)


def test_text_without_arithmetic_has_no_claims() -> None:
    assert arithmetic_claims("The others will choose about 50. Round 2/3 is next.") == []


def test_depth_counts_the_chained_iterations_of_the_factor() -> None:
    text = ("If all pick 50, 2/3 of 50 is 33.3. But they think so too: 2/3 of 33.3 is 22.2, "
            "and 2/3 of 22 is 14.7. So I pick 15.")
    assert audit(text, TWO_THIRDS).depth == 3
    # Steps that do not start from the previous result are not one chain.
    assert audit("2/3 of 50 is 33 and 2/3 of 100 is 67.", TWO_THIRDS).depth == 1
    # Another factor is not the game's step; without a ratio there is no depth.
    assert audit("half of 50 is 25, half of 25 is 12.5", TWO_THIRDS).depth == 0
    assert audit("2/3 of 50 is 33", None).depth == 0
    # A wrong step is still a step taken.
    assert audit("2/3 of 50 is 30, 2/3 of 30 is 20", TWO_THIRDS).depth == 2


def test_the_final_answer_is_checked_against_the_reasonings_conclusion() -> None:
    agrees = audit(f"2/3 of 33 is 22, so I choose 22.\n{ANSWER_MARKER} 22", TWO_THIRDS)
    assert (agrees.conclusion, agrees.final, agrees.final_agrees) == (22, 22, True)
    rounded = audit(f"The target is about 14.8. {ANSWER_MARKER} 15", TWO_THIRDS)
    assert rounded.final_agrees is True
    contradicts = audit(f"2/3 of 50 is 33.3, so I go with 33. {ANSWER_MARKER} 50", TWO_THIRDS)
    assert (contradicts.conclusion, contradicts.final, contradicts.final_agrees) == (
        33, 50, False)
    # Without the marker there is no final answer to compare.
    cut = audit("2/3 of 50 is 33.3, so the others will", TWO_THIRDS)
    assert cut.final is None and cut.final_agrees is None and cut.conclusion == 33.3


def test_the_reasoning_ends_at_the_last_marker() -> None:
    text = f"2/3 of 60 is 40. {ANSWER_MARKER} 10. Hmm, no. {ANSWER_MARKER} 40"
    reasoning, final = split_final(text)
    assert final == 40 and reasoning.endswith("Hmm, no. ")
    assert conclusion("Round 3 of 5: the average was 30.") == 30
    assert conclusion("No numbers here.") is None


def test_audit_many_has_one_row_per_text() -> None:
    texts = [f"2/3 of 50 is 34. {ANSWER_MARKER} 34", None, "thinking", "2/3 of 50 is 33.3"]
    frame = audit_many(texts, TWO_THIRDS)
    assert list(frame.columns) == list(AUDIT_COLUMNS) and len(frame) == 4
    assert frame["claims"].tolist() == [1, 0, 0, 1]
    assert frame["wrong_claims"].tolist() == [1, 0, 0, 0]
    assert frame["depth"].tolist() == [1, 0, 0, 1]
    assert frame["final_agrees"].iloc[0] == 1.0 and math.isnan(frame["final_agrees"].iloc[3])
