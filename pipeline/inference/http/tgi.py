"""text-generation-inference servers over their native protocol.

Prompt requests: ``POST {endpoint}/generate`` with ``{"inputs", "parameters"}``; one prompt
per request (TGI batches across requests itself). Message requests go to TGI's Messages
API (``POST {endpoint}/v1/chat/completions``), because only the server knows the model's
chat template: joining messages into plain text here would feed an instruction-tuned model
a format it was not trained on.

TGI's validation (router/src/validation.rs) shapes the parameters:
- ``top_p`` must be in (0, 1) *exclusive*: 1.0 is a 422, so it is omitted at 1.0;
- ``temperature`` must be > 0 and any ``temperature`` turns sampling on, so greedy
  decoding (temperature 0) sends ``do_sample: false`` and no temperature;
- ``grammar`` is ``{"type": "regex" | "json", "value": ...}``; a JSON schema without
  ``properties`` is a 422 ("Grammar must have a 'properties' field"), so a bare
  ``{"type": "integer"}`` schema is only sent when no regex is given.
Token counts: ``details.generated_tokens``; the prompt length is not in ``details`` unless
``decoder_input_details`` is asked for (which returns every prompt token with its logprob),
so it comes from TGI's ``x-prompt-tokens`` response header instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simpipe.inference.answer_checks import (
    MalformedAnswer,
    checked_answer,
    header_token_count,
    not_an_object,
)
from simpipe.inference.base import GenerationRequest
from simpipe.inference.http.backend import HttpBackend
from simpipe.inference.http.openai_compat import decode_openai_answer
from simpipe.inference.settings import TgiSettings

# json.dumps with its cached default encoder measured fastest (ASCII escapes are valid JSON).
_dumps = json.dumps


class TgiBackend(HttpBackend):
    """TGI's ``/generate`` (prompts) and Messages API (chat messages)."""

    prompt_style = "completion"

    def __init__(self, settings: TgiSettings) -> None:
        super().__init__(settings)
        self.settings = settings

    def _encode(self, req: GenerationRequest) -> tuple[str, bytes]:
        if req.messages is not None:
            return "/v1/chat/completions", _dumps(_chat_body(req)).encode()
        params: dict[str, Any] = {"max_new_tokens": req.max_tokens, "seed": req.seed}
        if req.temperature > 0:
            params["do_sample"] = True
            params["temperature"] = req.temperature
        else:
            params["do_sample"] = False
        if 0 < req.top_p < 1:
            params["top_p"] = req.top_p
        if req.top_k > 0:
            params["top_k"] = req.top_k
        if req.stop:
            params["stop"] = list(req.stop)
        grammar = _grammar(req)
        if grammar is not None:
            params["grammar"] = grammar
        params["details"] = True
        return "/generate", _dumps({"inputs": req.prompt, "parameters": params}).encode()

    def _decode(self, data: Any, headers: Mapping[str, str]) -> tuple[str, int, int, str | None]:
        if type(data) is list:  # TGI's ``POST /`` shape, should a proxy route there
            if not data:
                raise MalformedAnswer("the answer is an empty list")
            data = data[0]
        if type(data) is not dict:
            raise not_an_object(data, "the answer")
        if "choices" in data:  # the Messages API
            return decode_openai_answer(data)
        details = data.get("details")
        if details is None:
            details = {}
        elif type(details) is not dict:
            raise not_an_object(details, "details")
        prefill = details.get("prefill")
        if prefill:
            if type(prefill) is not list:
                raise MalformedAnswer("details.prefill is not a list")
            tokens_in = len(prefill)
        else:
            tokens_in = header_token_count(headers.get("x-prompt-tokens"), "x-prompt-tokens")
        return checked_answer(
            data.get("generated_text"),
            tokens_in,
            details.get("generated_tokens", 0),
            details.get("finish_reason"),
            _FIELDS,
        )


_FIELDS = ("generated_text", "x-prompt-tokens", "details.generated_tokens",
           "details.finish_reason")


def _grammar(req: GenerationRequest) -> dict | None:
    c = req.constraint
    if c is None:
        return None
    if c.regex:
        return {"type": "regex", "value": c.regex}
    if c.json_schema:
        return {"type": "json", "value": c.json_schema}
    return None


def _chat_body(req: GenerationRequest) -> dict:
    body: dict[str, Any] = {
        "model": "tgi",  # TGI serves one model and ignores the name
        "messages": list(req.messages or ()),
        "max_tokens": req.max_tokens,
        "seed": req.seed,
    }
    if req.temperature > 0:
        body["temperature"] = req.temperature
    else:
        body["temperature"] = 0  # TGI's chat route maps 0 to greedy decoding
    if 0 < req.top_p < 1:
        body["top_p"] = req.top_p
    if req.stop:
        body["stop"] = list(req.stop)
    grammar = _grammar(req)
    if grammar is not None:
        body["response_format"] = grammar  # TGI's chat grammar: same {"type", "value"}
    return body
