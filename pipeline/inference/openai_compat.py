"""Any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, TGI's Messages API.

Prompt requests go to ``/v1/completions`` (or, with ``api = "chat"``, to
``/v1/chat/completions`` as one user message); message requests always go to
``/v1/chat/completions``. ``top_p`` is omitted at 1.0 (everyone's default) to keep the
body small; ``temperature`` is always sent (0 is valid OpenAI-wide: greedy).

Output constraints (``settings.constraint``), from the servers' sources:
- ``"grammar"``: llama.cpp's top-level ``grammar`` (GBNF).
- ``"json_schema"``: llama.cpp's top-level ``json_schema`` (converted to a grammar there;
  builds without llguidance ignore a ``number``'s ``minimum``/``maximum``,
  docs/measurements.md).
- ``"guided_regex"``: vLLM's regex, as ``structured_outputs: {"regex": ...}`` (vLLM >=
  0.10.2; the old top-level ``guided_regex`` was removed in 0.12 and is *silently ignored*
  there, so it is not what this sends).
- ``"auto"``: GBNF as ``grammar`` *and* the regex as ``structured_outputs.regex`` in one
  body. This is safe because neither server rejects the other's field: vLLM's request
  models are ``extra="allow"`` (an unknown field is logged as "present in the request but
  ignored" and dropped) and llama.cpp's server reads only the keys it knows. With a
  schema and no GBNF, ``json_schema`` (llama.cpp) and ``structured_outputs.json`` (vLLM)
  are sent instead; some llama.cpp versions refuse ``grammar`` and ``json_schema`` together
  (the xllamacpp build here takes either), so the two are never both sent. llama.cpp's
  ``/v1/completions`` ignores OpenAI's ``response_format`` (measured: unconstrained text),
  which is why the schema goes as top-level ``json_schema``.
- ``"none"``: no constraint; the tolerant parser does the work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simpipe.inference.answer_checks import (
    MalformedAnswer,
    checked_answer,
    json_object,
    not_an_object,
)
from simpipe.inference.base import GenerationRequest, OutputConstraint
from simpipe.inference.http import HttpBackend
from simpipe.inference.settings import OpenAISettings

# json.dumps with its cached default encoder measured fastest (ASCII escapes are valid JSON).
_dumps = json.dumps


class OpenAIBackend(HttpBackend):
    """``/v1/completions`` and ``/v1/chat/completions`` of an OpenAI-compatible server."""

    def __init__(self, settings: OpenAISettings) -> None:
        super().__init__(settings)
        self.settings = settings
        self.prompt_style = "chat" if settings.api == "chat" else "completion"
        self._model = settings.model
        self._chat = settings.api == "chat"
        self._constraint = settings.constraint

    def _encode(self, req: GenerationRequest) -> tuple[str, bytes]:
        body: dict[str, Any] = {"model": self._model}
        if req.messages is not None:
            path = "/v1/chat/completions"
            body["messages"] = list(req.messages)
        elif self._chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            path = "/v1/completions"
            body["prompt"] = req.prompt
        body["max_tokens"] = req.max_tokens
        body["temperature"] = req.temperature
        if req.top_p != 1.0:
            body["top_p"] = req.top_p
        # Not OpenAI's own parameters, but vLLM, SGLang and llama.cpp's server take them.
        if req.top_k > 0:
            body["top_k"] = req.top_k
        if req.min_p > 0:
            body["min_p"] = req.min_p
        body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.constraint is not None and self._constraint != "none":
            _add_constraint(body, req.constraint, self._constraint)
        return path, _dumps(body).encode()

    def _decode(self, data: Any, headers: Mapping[str, str]) -> tuple[str, int, int, str | None]:
        return decode_openai_answer(data)


def decode_openai_answer(data: Any) -> tuple[str, int, int, str | None]:
    """(text, tokens_in, tokens_out, finish_reason) of a completions or chat answer; raises
    ``MalformedAnswer`` naming the field that is missing or of the wrong type."""
    if type(data) is not dict:
        raise not_an_object(data, "the answer")
    choices = data.get("choices")
    if type(choices) is not list or not choices:
        raise MalformedAnswer("choices is not a non-empty list")
    choice = choices[0]
    if type(choice) is not dict:
        raise not_an_object(choice, "choices[0]")
    text = choice.get("text")
    if text is None:  # chat: the message content (null when the model said nothing)
        text = json_object(choice.get("message"), "choices[0].message").get("content")
        fields = _CHAT_FIELDS
        if text is None:
            text = ""
    else:
        fields = _COMPLETION_FIELDS
    usage = data.get("usage")
    if usage is None:
        tokens_in = tokens_out = 0
    elif type(usage) is dict:
        tokens_in = usage.get("prompt_tokens", 0)
        tokens_out = usage.get("completion_tokens", 0)
    else:
        raise not_an_object(usage, "usage")
    return checked_answer(text, tokens_in, tokens_out, choice.get("finish_reason"), fields)


_USAGE = ("usage.prompt_tokens", "usage.completion_tokens", "choices[0].finish_reason")
_COMPLETION_FIELDS = ("choices[0].text", *_USAGE)
_CHAT_FIELDS = ("choices[0].message.content", *_USAGE)


def _add_constraint(body: dict, c: OutputConstraint, mode: str) -> None:
    if mode == "grammar":
        if c.gbnf:
            body["grammar"] = c.gbnf
    elif mode == "json_schema":
        if c.json_schema:
            body["json_schema"] = c.json_schema
    elif mode == "guided_regex":
        if c.regex:
            body["structured_outputs"] = {"regex": c.regex}
    else:  # auto
        if c.gbnf:
            body["grammar"] = c.gbnf
        elif c.json_schema:
            body["json_schema"] = c.json_schema
        if c.regex:
            body["structured_outputs"] = {"regex": c.regex}
        elif c.json_schema:
            body["structured_outputs"] = {"json": c.json_schema}
