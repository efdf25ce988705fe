"""The embedded back-end checks what xllamacpp hands back with the same rules as an HTTP
server's answer: a bad field is that agent's error. ``answer_result`` gets exactly the dict
xllamacpp's ``handle_completions`` returns (llama.cpp's OpenAI-style JSON), so no model
has to be loaded to feed it one."""

from __future__ import annotations

import pytest

from simpipe.inference.llamacpp.completions import answer_result


def completion(text=" 42", usage=None, finish="stop") -> dict:
    answer = {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}
    if usage is not None:
        answer["usage"] = usage
    return answer


def test_a_good_answer_keeps_its_token_counts():
    result = answer_result(completion(usage={"prompt_tokens": 31, "completion_tokens": 2}),
                        False, 0.5)
    assert (result.status, result.text, result.tokens_in, result.tokens_out) == (
        "ok", " 42", 31, 2)
    assert answer_result(completion(usage=None), False, 0.5).tokens_in == 0


@pytest.mark.parametrize("value,shown", [
    (float("inf"), "inf"), (99_999_999_999, "99999999999"), (2**31, "2147483648"),
    (-5, "-5"), (True, "True"), (3.0, "3.0"), ("7", "'7'"),
])
def test_token_counts_outside_int32_or_not_integers_are_that_agents_error(value, shown):
    result = answer_result(completion(usage={"prompt_tokens": 3, "completion_tokens": value}),
                        False, 0.5)
    assert result.status == "error" and result.text is None
    assert f"usage.completion_tokens = {shown} is not a token count" in result.error


def test_text_that_is_not_a_string_is_that_agents_error():
    result = answer_result(completion(text=42), False, 0.5)
    assert result.status == "error" and "text is a number, not text" in result.error
    chat = {"choices": [{"message": {"role": "assistant", "content": ["4", "2"]}}]}
    result = answer_result(chat, True, 0.5)
    assert result.status == "error" and "text is a list, not text" in result.error
