"""The OpenAI-style requests xllamacpp's engine takes, and its answers read back.

In-process calls (``handle_completions`` / ``handle_chat_completions``) take the same
bodies as llama.cpp's HTTP server and return the same dicts; what they return is checked
like a server's answer (``simpipe.inference.answer_checks``): a bad field costs one agent.
"""

from __future__ import annotations

from typing import Any

from simpipe.inference.answer_checks import (
    MalformedAnswer,
    answer_text,
    finish_reason,
    json_object,
    probe_count,
    probe_top_logprobs,
    token_count,
)
from simpipe.inference.base import GenerationRequest, GenerationResult
from simpipe.inference.types import ProbeError, TopLogprobs

#: The endpoint name the embedded engine's answers and counters carry.
ENDPOINT = "llamacpp"


def request_body(req: GenerationRequest, cache_prompt: bool,
                 llguidance: bool = False) -> tuple[bool, dict]:
    """(is_chat, the OpenAI-style body llama.cpp takes) for one request; ``llguidance``:
    the engine takes llguidance grammars, so the constraint's ``lark`` form goes first."""
    body: dict[str, Any] = {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        # Always sent: llama.cpp's own defaults are top_k 40 and min_p 0.05.
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "cache_prompt": cache_prompt,
    }
    if req.stop:
        body["stop"] = list(req.stop)
    if req.constraint is not None:
        # llama.cpp's own JSON-schema converter ignores a number's minimum/maximum
        # (docs/measurements.md), so a hand-written grammar wins whenever there is one.
        if llguidance and req.constraint.lark:
            body["grammar"] = req.constraint.lark
        elif req.constraint.gbnf:
            body["grammar"] = req.constraint.gbnf
        elif req.constraint.json_schema is not None:
            body["json_schema"] = req.constraint.json_schema
    if req.messages is not None:
        body["messages"] = [dict(m) for m in req.messages]
        return True, body
    body["prompt"] = req.prompt
    return False, body


def answer_result(response: Any, is_chat: bool, latency_s: float) -> GenerationResult:
    """One call's answer from xllamacpp's OpenAI-style ``response``, every field checked
    as a server's are; anything malformed is this agent's error."""
    if not isinstance(response, dict):
        return error_result(f"unexpected response from xllamacpp: {response!r:.200}", latency_s)
    if "error" in response:
        err = response["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        return error_result(f"llama.cpp: {message}", latency_s)
    try:
        choice = response["choices"][0]
        text = choice["message"]["content"] if is_chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        return error_result(f"malformed response from xllamacpp: {response!r:.200}", latency_s)
    try:
        # The same checks as an HTTP server's answer: a bad field costs this agent only.
        usage = response.get("usage")
        usage = {} if usage is None else json_object(usage, "usage")
        return GenerationResult(
            text="" if text is None else answer_text(text, "text"),
            tokens_in=token_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
            tokens_out=token_count(usage.get("completion_tokens"), "usage.completion_tokens"),
            latency_s=latency_s,
            finish_reason=finish_reason(choice.get("finish_reason"), "finish_reason"),
            endpoint=ENDPOINT,
        )
    except MalformedAnswer as exc:
        return error_result(f"malformed response from xllamacpp: {exc}", latency_s)


def error_result(message: str, latency_s: float) -> GenerationResult:
    """One agent's failed call, ``message`` saying why."""
    return GenerationResult(
        text=None, latency_s=latency_s, status="error", error=message, endpoint=ENDPOINT
    )


def top_logprobs_of(response: Any) -> tuple[TopLogprobs, int, int]:
    """(top log-probabilities, prompt tokens evaluated, tokens generated) of one answer,
    each value checked as a server's are (``answer_checks.probe_top_logprobs``,
    ``probe_count``)."""
    try:
        choice = response["choices"][0]
        entries = choice["logprobs"]["content"][0]["top_logprobs"]
        pairs = [(e["id"], e["logprob"]) for e in entries]
        prompt_n = (response.get("timings") or {}).get("prompt_n")
        completion_tokens = (response.get("usage") or {}).get("completion_tokens")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        message = response.get("error") if isinstance(response, dict) else None
        raise ProbeError(f"no top log-probabilities from llama.cpp ({message or exc!r})") from None
    top = probe_top_logprobs(pairs, "choices[0].logprobs.content[0].top_logprobs")
    return (top, probe_count(prompt_n, "timings.prompt_n"),
            probe_count(completion_tokens, "usage.completion_tokens"))

