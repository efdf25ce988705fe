"""The request contract our servers share: answers that satisfy the constraint, and bad
requests refused the way the real servers refuse them."""

from __future__ import annotations

import re

import pytest

from simpipe.games.answer_format import number_regex
from simpipe.games.parsing import parse_answer
from simpipe.servers.contract import REASONING_SHARE, Invalid, parse

COT = number_regex(0, 100, cot=True)


def test_a_chain_of_thought_constraint_gets_reasoning_then_the_answer():
    body = {"inputs": "Think, then answer.", "parameters": {"max_new_tokens": 256, "seed": 4,
                                                            "grammar": {"type": "regex",
                                                                        "value": COT}}}
    gen = parse("generate", body)
    assert re.fullmatch(COT, gen.text)
    assert gen.tokens_out == int(256 * REASONING_SHARE)  # a model's share of the budget
    assert parse_answer(gen.text, 0, 100, cot=True).status == "ok"


def test_a_basic_constraint_gets_just_the_number():
    body = {"inputs": "Your number:", "parameters": {
        "max_new_tokens": 8, "seed": 4, "grammar": {"type": "regex",
                                                    "value": number_regex(0, 100)}}}
    assert parse("generate", body).text.strip().isdigit()


def test_ignore_eos_runs_to_max_tokens_as_vllm_does():
    gen = parse("completion", {"prompt": "p", "max_tokens": 16, "ignore_eos": True})
    assert (gen.tokens_out, gen.finish) == (16, "length")


@pytest.mark.parametrize(("body", "message"), [
    ({"inputs": "x", "parameters": {"max_new_tokens": 2, "grammar": {
        "type": "json", "value": {"properties": 5}}}},
     "Grammar must have a 'properties' field"),
    ({"inputs": "x", "parameters": {"max_new_tokens": 2, "top_p": "high"}},
     "`top_p` must be > 0.0 and < 1.0"),
    ({"inputs": "x", "parameters": {"max_new_tokens": 2, "best_of": 2, "seed": 1,
                                    "do_sample": True}},
     "`seed` must not be set when `best_of` > 1"),
])
def test_malformed_tgi_requests_are_validation_errors_not_crashes(body, message):
    with pytest.raises(Invalid, match=re.escape(message)):
        parse("generate", body)
