"""Checks on the fields of an inference answer before the pipeline keeps them.

What a server (or the embedded engine) answers is untrusted input: a number where text
belongs would fail the Parquet write of a whole partition, ``1e999`` tokens raise
``OverflowError``, and 99,999,999,999 tokens silently wrap in the int32 column. Every
field a back-end returns goes through one of these; a bad one raises ``MalformedAnswer``
naming the field, which the back-end turns into that one agent's error.
"""

from __future__ import annotations

from typing import Any

#: Token counts are stored as int32.
TOKEN_COUNT_LIMIT = 2**31


class MalformedAnswer(ValueError):
    """An answer field of the wrong type or out of range; the message names the field."""


def token_count(value: Any, field: str) -> int:
    """A token count: absent (None) is 0; otherwise a JSON integer in [0, 2**31)."""
    if value is None:
        return 0
    # type() rather than isinstance: JSON true/false are bools, and bool is an int.
    if type(value) is int and 0 <= value < TOKEN_COUNT_LIMIT:
        return value
    raise MalformedAnswer(
        f"{field} = {_show(value)} is not a token count (a whole number 0..2**31-1)"
    )


def header_token_count(value: str | None, field: str) -> int:
    """A token count sent as an HTTP header (decimal digits); absent is 0."""
    if value is None:
        return 0
    # str.isdigit alone admits "²" and other non-ASCII digits that int() then rejects.
    if value.isdigit() and value.isascii() and len(value) <= 10:
        return token_count(int(value), field)
    raise MalformedAnswer(
        f"{field} = {_show(value)} is not a token count (a whole number 0..2**31-1)"
    )


def checked_answer(
    text: Any, tokens_in: Any, tokens_out: Any, finish: Any, fields: tuple[str, str, str, str]
) -> tuple[str, int, int, str | None]:
    """(text, tokens_in, tokens_out, finish_reason) checked as above; ``fields`` names them
    for the error. One call with the common case first: this runs once per request on the
    client's hot path."""
    if (
        type(text) is str
        and type(tokens_in) is int
        and type(tokens_out) is int
        and 0 <= tokens_in < TOKEN_COUNT_LIMIT
        and 0 <= tokens_out < TOKEN_COUNT_LIMIT
        and (finish is None or type(finish) is str)
    ):
        return text, tokens_in, tokens_out, finish
    return (
        answer_text(text, fields[0]),
        token_count(tokens_in, fields[1]),
        token_count(tokens_out, fields[2]),
        finish_reason(finish, fields[3]),
    )


def answer_text(value: Any, field: str) -> str:
    """The generated text: a JSON string, nothing else."""
    if type(value) is str:
        return value
    if value is None:
        raise MalformedAnswer(f"{field} is missing")
    raise MalformedAnswer(f"{field} is {_kind(value)}, not text")


def finish_reason(value: Any, field: str) -> str | None:
    """Why generation stopped: a string, or absent."""
    if value is None or type(value) is str:
        return value
    raise MalformedAnswer(f"{field} is {_kind(value)}, not text")


def json_object(value: Any, field: str) -> dict:
    """A JSON object (a dict after ``json.loads``)."""
    if type(value) is dict:
        return value
    raise not_an_object(value, field)


def not_an_object(value: Any, field: str) -> MalformedAnswer:
    """The error for ``value`` where a JSON object belongs (for callers that test inline)."""
    return MalformedAnswer(f"{field} is {_kind(value)}, not a JSON object")


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
