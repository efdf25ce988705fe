"""What simpipe's own inference servers (the stub and the emulator) accept and answer: the TGI
and OpenAI request contracts, validated as the real servers validate them, a deterministic
answer, and its rendering as JSON or as server-sent events.

Routes (``ROUTES``): TGI ``POST /generate``, ``POST /generate_stream`` and the compat route
``POST /`` (what the official ``text-generation`` client posts to: a JSON list, or events
when ``"stream": true``); OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``
(``"stream": true``: ``data:`` chunks ending in ``data: [DONE]``).

Validation: TGI's router rules (422 ``{"error", "error_type": "validation"}``) with one
deliberate extra, ``max_new_tokens`` is required, so a client that forgets it fails in
tests instead of silently getting TGI's default of 100 tokens; OpenAI routes answer 400
``{"error": {"message", "type", "param", "code"}}`` as vLLM and llama.cpp do.

The answer is a number derived from the request seed and prompt (the same request gets the
same answer), chosen to match the request's regex when one is given; a regex that asks for
reasoning before ``Final answer:`` (simpipe's chain-of-thought constraint) gets filler
reasoning over ``REASONING_SHARE`` of the token budget first, so emulated CoT runs generate
as many tokens as a model would. GBNF is not interpreted: the answer is an integer 0..100,
which is what simpipe's grammars admit.

Context: the prompt and the token budget must fit ``context_tokens`` (8,192 by default, Llama
3 8B's; TGI: the prompt also ``MAX_INPUT_TOKENS``), checked with TGI's and vLLM's messages,
so an answer is never longer than a real server's could be. Regexes are matched without
backtracking (``regex_automaton``): a pattern past its budget is refused as too complex.

OpenAI requests may ask for ``n`` samples (not streamed): choice i is the answer with seed
``seed + i``, as llama.cpp's server samples them (docs/shared-answers.md), and the prompt
counts once in ``usage`` while the choices' tokens add up, as vLLM and OpenAI report them.
``n x max_tokens`` (plus the prompt's tokens with ``echo``) is at most
``MAX_SAMPLED_TOKENS`` (``MAX_LOGPROB_TOKENS`` with ``logprobs``), so that no answer is built
that would hold the event loop for long: 400 naming the bound beyond it.

Token counts are an approximation, there is no tokenizer here: a prompt counts one token
per 4 characters (English text averages about 4 bytes per token with the Llama and GPT
tokenizers), at least 1; an answer counts one token per character (numbers digit by digit,
as the Llama 2 and Mistral tokenizers split them; answers here are short numbers), and the
end-of-sequence token is not counted.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.servers import synthetic_tokens
from simpipe.servers.http import HttpRequest, HttpResponse
from simpipe.servers.regex_automaton import (
    Automaton,
    RegexError,
    RegexTooComplex,
    compile_regex,
)
from simpipe.servers.regex_automaton import forget as forget_regex

MAX_INPUT_TOKENS = 4096
MAX_TOTAL_TOKENS = 8192
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5  # TGI's --max-top-n-tokens default
MAX_BEST_OF = 2  # TGI's --max-best-of default
MAX_LOGPROBS = 20  # OpenAI's limit for logprobs / top_logprobs
MAX_N = 1024  # samples per OpenAI request (vLLM has no cap; OpenAI's own is 128)
#: ``n x max_tokens`` of one request: what its answers may hold, built in one go on the event
#: loop (n = 1,024 samples of 256 tokens, or 32 of a whole 8,192-token context: a few hundred
#: kB, tens of ms). vLLM has no such cap; 1,024 x 8,000 was an 8 MB answer, 1.5 s of loop.
MAX_SAMPLED_TOKENS = 262_144
#: The same with ``logprobs``: each token is then an object of its own (about 100 bytes and
#: 15 us): 16 samples of 1,024 tokens, two of a whole context; n = 1 always fits.
MAX_LOGPROB_TOKENS = 16_384

#: path -> (route kind, error style): "tgi" errors are 422 {"error", "error_type"},
#: "openai" errors are 400 {"error": {...}}.
ROUTES: dict[str, tuple[str, str]] = {
    "/generate": ("generate", "tgi"),
    "/generate_stream": ("generate_stream", "tgi"),
    "/": ("compat", "tgi"),
    "/v1/completions": ("completion", "openai"),
    "/v1/chat/completions": ("chat", "openai"),
}
OPENAI_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models"})

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class Invalid(Exception):
    """The request breaks the contract; the message is what the real server would say."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def json_response(data: Any, status: int = 200, headers: dict | None = None) -> HttpResponse:
    return HttpResponse(status, _dumps(data).encode(), headers)


def error_response(style: str, message: str, param: str | None = None,
                   status: int | None = None) -> HttpResponse:
    """A validation error in the route's style (``tgi`` 422, ``openai`` 400)."""
    if style == "tgi":
        return json_response({"error": message, "error_type": "validation"}, status or 422)
    err = {"message": message, "type": "invalid_request_error", "param": param,
           "code": status or 400}
    return json_response({"error": err}, status or 400)


def overloaded() -> HttpResponse:
    """TGI's answer beyond ``--max-concurrent-requests``."""
    return json_response({"error": "Model is overloaded", "error_type": "overloaded"}, 429)


def queue_full(style: str, limit_bytes: int) -> HttpResponse:
    """503 in the route's style: the waiting requests already hold ``limit_bytes``."""
    message = (f"queue full: the waiting requests hold more than {limit_bytes // 2**20} MiB; "
               "try again")
    if style == "tgi":
        return json_response({"error": message, "error_type": "overloaded"}, 503)
    err = {"message": message, "type": "server_error", "param": None, "code": 503}
    return json_response({"error": err}, 503)


def route(request: HttpRequest, gets: dict[str, Callable[[], HttpResponse]],
          openai_only: bool = False) -> HttpResponse | tuple[str, str, Any]:
    """A GET route's answer, an error, or a generation route's ``(kind, error style, JSON
    body)``. ``openai_only``: the routes a vLLM server has (no TGI routes)."""
    path = request.path
    entry = ROUTES.get(path)
    if openai_only and entry is not None and path not in OPENAI_ROUTES:
        entry = None
    if entry is None:
        get = gets.get(path)
        if get is None:
            return json_response({"error": f"no route {path}", "error_type": "not_found"}, 404)
        if request.method != "GET":
            return json_response({"error": f"{request.method} not allowed",
                                  "error_type": "method"}, 405)
        return get()
    if request.method != "POST":
        return json_response({"error": f"{request.method} not allowed", "error_type": "method"},
                             405)
    kind, style = entry
    try:
        body = json.loads(request.body)
    except ValueError as exc:
        return error_response(style, f"Failed to parse the request body as JSON: {exc}")
    return kind, style, body


def prompt_tokens(text: str) -> int:
    """Prompt tokens: ~4 characters of English text per token, at least one."""
    return max(1, len(text) // 4)


#: A chain-of-thought answer spends this share of its token budget. Calibration: the paper
#: this project reproduces ran 1M agents in 12 min with basic prompts and 85 min with CoT
#: (7.1x); the a100-llama3-8b profile gives 7.1x for ~100 prompt tokens and 3 answer tokens
#: against ~130 and 205 (0.8 of the default 256-token budget).
REASONING_SHARE = 0.8
_REASONING = ("Others will guess around the middle, and two thirds of that is lower; they "
              "reason the same way, so the target moves down again. ")


def answer_number(seed: int | None, prompt: str, regex: str | None) -> str:
    """A deterministic number 0..100 (matching ``regex`` when possible); ``RegexError``
    for a regex that cannot be matched cheaply."""
    n = zlib.crc32(f"{seed}|{prompt}".encode()) % 101
    if regex is None:
        return str(n)
    pattern = compile_regex(regex)
    for k in range(101):
        candidate = str((n + k) % 101)
        if pattern.fullmatch(candidate):
            return candidate
    return str(n)


def answer_text(seed: int | None, prompt: str, regex: str | None, max_tokens: int) -> str:
    """The answer: the number, or, when the regex asks for reasoning before the answer marker
    (simpipe's chain-of-thought constraint), reasoning that fills ``REASONING_SHARE`` of the
    token budget, then the marker and the number. ``RegexError`` as ``answer_number``."""
    number = answer_number(seed, prompt, regex)
    if regex is None:
        return number
    pattern = compile_regex(regex)
    if pattern.fullmatch(number):
        return number
    tail = f" {ANSWER_MARKER} {number}"
    room = max(0, int(max_tokens * REASONING_SHARE) - len(tail))
    reasoning = (_REASONING * (room // len(_REASONING) + 1))[:room]
    if pattern.fullmatch(reasoning + tail):
        return reasoning + tail
    return number


#: style -> (how the real server words a bad regex, what it calls the regex, its param)
_REGEX_WORDS = {"tgi": ("grammar is not valid", "grammar", None),
                "openai": ("invalid regex", "regex", "structured_outputs")}


def _answer(seed: int | None, prompt: str, regex: str | None, max_tokens: int,
            style: str) -> str:
    """``answer_text``; a regex that runs out of budget makes the request ``Invalid``."""
    try:
        return answer_text(seed, prompt, regex, max_tokens)
    except RegexError as exc:
        raise _regex_invalid(regex or "", exc, style) from None


def _regex_invalid(regex: str, exc: RegexError, style: str) -> Invalid:
    invalid, name, param = _REGEX_WORDS[style]
    if isinstance(exc, RegexTooComplex):
        forget_regex(regex)  # a later request with it starts with a fresh budget
        return Invalid(f"{name} is too complex: {exc}", param)
    return Invalid(f"{invalid}: {exc}", param)


def _matcher(regex: str, style: str) -> Automaton:
    try:
        return compile_regex(regex)
    except RegexError as exc:
        raise _regex_invalid(regex, exc, style) from None


def _cut(text: str, stop: list[str], max_tokens: int) -> tuple[str, str]:
    """Apply stop sequences and the token budget (one token per character of an answer)."""
    for s in stop:
        i = text.find(s)
        if s and i >= 0:
            return text[:i], "stop_sequence"
    if len(text) > max_tokens:
        return text[:max_tokens], "length"
    return text, "eos_token"


@dataclass(slots=True)
class Generation:
    """One validated request and its answer, ready to be rendered now or later."""

    kind: str  # a ROUTES kind
    text: str  # the generated text (stop sequences and the token budget applied)
    finish: str  # TGI's words: eos_token | length | stop_sequence
    tokens_in: int
    seed: int | None
    stream: bool
    body: dict
    prompt: str
    #: choices 1..n-1 of an OpenAI request with ``n`` > 1: (text, finish) each
    more: tuple[tuple[str, str], ...] = ()
    #: a completion prompt given as token ids with ``logprobs`` (a probe)
    prompt_ids: tuple[int, ...] | None = None

    @property
    def tokens_out(self) -> int:
        return len(self.text) + sum(len(t) for t, _ in self.more)

    @property
    def samples(self) -> int:
        """Sequences decoded for it (OpenAI's ``n``)."""
        return 1 + len(self.more)

    @property
    def longest_out(self) -> int:
        """Tokens of its longest sample: the decode steps it runs."""
        return max(len(self.text), *(len(t) for t, _ in self.more)) if self.more \
            else len(self.text)


def parse(kind: str, body: Any, context_tokens: int = MAX_TOTAL_TOKENS) -> Generation:
    """Validate a request body for a route kind and compute its answer; ``Invalid`` if bad.
    ``context_tokens``: the served model's context (prompt + token budget)."""
    if not isinstance(body, dict):
        raise Invalid("request body must be a JSON object")
    if kind == "completion":
        return _parse_completion(body, context_tokens)
    if kind == "chat":
        return _parse_chat(body, context_tokens)
    return _parse_tgi(kind, body, context_tokens)


def render(gen: Generation, headers: dict | None = None) -> HttpResponse:
    """The answer to a parsed request: JSON, or server-sent events when it asked to stream."""
    if gen.kind in ("generate", "compat", "generate_stream"):
        if gen.stream or gen.kind == "generate_stream":
            return _events(_tgi_events(gen))
        out = _tgi_answer(gen)
        tgi_headers = {"x-prompt-tokens": str(gen.tokens_in),
                       "x-generated-tokens": str(gen.tokens_out), **(headers or {})}
        return json_response([out] if gen.kind == "compat" else out, headers=tgi_headers)
    if gen.stream:
        return _events(_openai_events(gen))
    return json_response(_openai_answer(gen), headers=headers)


def _events(events: list[Any]) -> HttpResponse:
    chunks = [b"data:" + _dumps(e).encode() + b"\n\n" if not isinstance(e, bytes) else e
              for e in events]
    return HttpResponse(200, b"", None, "text/event-stream", chunks)


# --- TGI ------------------------------------------------------------------------------------


def _parse_tgi(kind: str, body: dict, context_tokens: int) -> Generation:
    inputs = body.get("inputs")
    p = body.get("parameters") or {}
    if not isinstance(inputs, str):
        raise Invalid("`inputs` must be a string")
    if not inputs:
        raise Invalid("`inputs` cannot be empty")
    if not isinstance(p, dict):
        raise Invalid("`parameters` must be an object")
    max_new = p.get("max_new_tokens")
    if max_new is None:
        raise Invalid("`max_new_tokens` must be set (simpipe servers)")
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new <= 0:
        raise Invalid("`max_new_tokens` must be strictly positive")
    n_in = prompt_tokens(inputs)
    truncate = p.get("truncate")
    if truncate is not None:
        if not isinstance(truncate, int) or truncate <= 0:
            raise Invalid("`truncate` must be strictly positive")
        n_in = min(n_in, truncate)
    max_input = min(MAX_INPUT_TOKENS, context_tokens - 1)
    if n_in > max_input:
        raise Invalid(f"`inputs` must have less than {max_input} tokens. Given: {n_in}")
    if n_in + max_new > context_tokens:
        raise Invalid(
            f"`inputs` tokens + `max_new_tokens` must be <= {context_tokens}. "
            f"Given: {n_in} `inputs` tokens and {max_new} `max_new_tokens`"
        )
    for name in ("temperature", "repetition_penalty", "frequency_penalty", "top_k"):
        value = p.get(name)
        if value is not None and (not isinstance(value, (int, float)) or value <= 0):
            raise Invalid(f"`{name}` must be strictly positive")
    for name in ("top_p", "typical_p"):
        value = p.get(name)
        if value is not None and (not isinstance(value, (int, float)) or not 0 < value < 1):
            raise Invalid(f"`{name}` must be > 0.0 and < 1.0")
    seed = p.get("seed")
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise Invalid("`seed` must be a non-negative integer")
    top_n = p.get("top_n_tokens")
    if top_n is not None and (not isinstance(top_n, int) or not 0 < top_n <= MAX_TOP_N_TOKENS):
        raise Invalid(f"`top_n_tokens` must be >= 1 and <= {MAX_TOP_N_TOKENS}. Given: {top_n}")
    _check_best_of(p, seed, body.get("stream") or kind == "generate_stream")
    stop = p.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise Invalid("`stop` must be a list of strings")
    if len(stop) > MAX_STOP_SEQUENCES:
        raise Invalid(
            f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(stop)}"
        )
    regex, schema = _tgi_grammar(p.get("grammar"))
    text = _answer(seed, inputs, regex, max_new, "tgi")
    if schema is not None:
        text = _json_answer(schema, text)
    text, finish = _cut(text, stop, max_new)
    # Only what the answer shows is kept: a request may wait in a queue for long.
    shown = {k: p[k] for k in ("return_full_text", "details", "decoder_input_details",
                               "top_n_tokens", "best_of") if k in p}
    return Generation(kind, text, finish, n_in, seed, bool(body.get("stream")),
                      {"parameters": shown}, inputs)


def _check_best_of(p: dict, seed: Any, stream: bool) -> None:
    best_of = p.get("best_of")
    if best_of is None:
        return
    if not isinstance(best_of, int) or best_of <= 0:
        raise Invalid("`best_of` must be strictly positive")
    if best_of > MAX_BEST_OF:
        raise Invalid(f"`best_of` must be <= {MAX_BEST_OF}. Given: {best_of}")
    if best_of > 1:
        sampling = p.get("do_sample") or any(
            p.get(k) is not None for k in ("temperature", "top_k", "top_p", "typical_p"))
        if not sampling:
            raise Invalid("you must use sampling when `best_of` is > 1")
        if seed is not None:
            raise Invalid("`seed` must not be set when `best_of` > 1")
        if stream:
            raise Invalid("`best_of` != 1 is not allowed for this endpoint")


def _tgi_grammar(grammar: Any) -> tuple[str | None, dict | None]:
    if grammar is None:
        return None, None
    if not isinstance(grammar, dict) or grammar.get("type") not in ("json", "regex"):
        raise Invalid("grammar is not valid: `type` must be `json` or `regex`")
    value = grammar.get("value")
    if grammar["type"] == "regex":
        if not isinstance(value, str) or not value:
            raise Invalid("grammar is not valid: regex `value` must be a non-empty string")
        _matcher(value, "tgi")
        return value, None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise Invalid(f"grammar is not valid: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("properties"), dict):
        raise Invalid("grammar is not valid: Grammar must have a 'properties' field")
    return None, value


def _json_answer(schema: dict, number: str) -> str:
    name = next(iter(schema.get("properties") or {"answer": None}), "answer")
    return json.dumps({name: int(number)})


def _token(ch: str) -> dict:
    return {"id": 100 + ord(ch), "text": ch, "logprob": -0.5, "special": False}


def _prefill(prompt: str) -> list[dict]:
    pieces = [prompt[i:i + 4] for i in range(0, len(prompt), 4)] or [prompt]
    return [{"id": 1000 + i, "text": piece, "logprob": None if i == 0 else -1.0}
            for i, piece in enumerate(pieces)]


def _tgi_answer(gen: Generation) -> dict:
    p = gen.body.get("parameters") or {}
    prefix = gen.prompt if p.get("return_full_text") else ""
    out: dict[str, Any] = {"generated_text": prefix + gen.text}
    if p.get("details"):
        tokens = [_token(ch) for ch in gen.text]
        details: dict[str, Any] = {
            "finish_reason": gen.finish,
            "generated_tokens": gen.tokens_out,
            "seed": gen.seed,
            "prefill": _prefill(gen.prompt) if p.get("decoder_input_details") else [],
            "tokens": tokens,
        }
        if p.get("top_n_tokens"):
            details["top_tokens"] = [[t] for t in tokens]
        best_of = p.get("best_of") or 1
        if best_of > 1:
            seq = {k: details[k] for k in ("finish_reason", "generated_tokens", "seed",
                                           "prefill", "tokens")}
            details["best_of_sequences"] = [{"generated_text": out["generated_text"], **seq}
                                            for _ in range(best_of - 1)]
        out["details"] = details
    return out


def _tgi_events(gen: Generation) -> list[dict]:
    p = gen.body.get("parameters") or {}
    top_n = bool(p.get("top_n_tokens"))
    events = []
    text = gen.text or " "  # TGI always streams at least one token
    last = len(text) - 1
    for i, ch in enumerate(text):
        token = _token(ch)
        event: dict[str, Any] = {"index": i + 1, "token": token,
                                 "top_tokens": [token] if top_n else None,
                                 "generated_text": None, "details": None}
        if i == last:
            prefix = gen.prompt if p.get("return_full_text") else ""
            event["generated_text"] = prefix + gen.text
            event["details"] = {"finish_reason": gen.finish, "generated_tokens": len(text),
                                "seed": gen.seed, "input_length": gen.tokens_in}
        events.append(event)
    return events


def tgi_info(max_concurrent: int, model_id: str, version: str,
             max_total_tokens: int = MAX_TOTAL_TOKENS) -> dict:
    """``GET /info`` of a TGI server (the fields TGI 3.x reports)."""
    return {
        "model_id": model_id,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": max_concurrent,
        "max_best_of": MAX_BEST_OF,
        "max_stop_sequences": MAX_STOP_SEQUENCES,
        "max_input_tokens": min(MAX_INPUT_TOKENS, max_total_tokens - 1),
        "max_total_tokens": max_total_tokens,
        "validation_workers": 2,
        "max_client_batch_size": 4,
        "router": "text-generation-router",
        "version": version,
        "sha": None,
        "docker_label": None,
    }


# --- OpenAI ---------------------------------------------------------------------------------


def _parse_completion(body: dict, context_tokens: int) -> Generation:
    prompt = body.get("prompt")
    ids = None
    if isinstance(prompt, list) and prompt and all(
            type(t) is int and 0 <= t < 2**31 for t in prompt):
        # vLLM takes a prompt as token ids (what the answer-distribution probes send)
        ids = tuple(prompt)
        prompt = "ids:" + ",".join(map(str, ids))
    elif not isinstance(prompt, str) or not prompt:
        raise Invalid("'prompt' must be a non-empty string or a list of token ids", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= MAX_LOGPROBS):
        # vLLM's check against --max-logprobs (default 20)
        raise Invalid(f"Requested sample logprobs of {logprobs}, which is greater than max "
                      f"allowed: {MAX_LOGPROBS}" if isinstance(logprobs, int)
                      else f"logprobs must be an integer 0..{MAX_LOGPROBS}", "logprobs")
    gen = _openai_generation("completion", body, prompt, context_tokens,
                             None if ids is None else len(ids))
    if ids is not None and logprobs:
        # The answer of a log-probability probe: the most likely next token.
        top = synthetic_tokens.top_logprobs(ids, logprobs)
        text = synthetic_tokens.token_text(top[0][0])
        gen = dataclasses.replace(gen, text=text, finish="length", prompt_ids=ids,
                                  body={**gen.body, "return_tokens_as_token_ids":
                                        bool(body.get("return_tokens_as_token_ids"))})
    return gen


def _parse_chat(body: dict, context_tokens: int) -> Generation:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid("'messages' must be a non-empty list", "messages")
    parts = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant",
                                                             "developer"):
            raise Invalid("each message needs a role of system, user or assistant", "messages")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise Invalid("message content must be a string", "messages")
        parts.append(f"<|{m['role']}|>{content}")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS):
        raise Invalid(f"top_logprobs must be an integer 0..{MAX_LOGPROBS}", "top_logprobs")
    if top and not body.get("logprobs"):
        raise Invalid("top_logprobs needs logprobs = true", "top_logprobs")
    return _openai_generation("chat", body, "".join(parts), context_tokens)


def _openai_generation(kind: str, body: dict, prompt: str, context_tokens: int,
                       n_in: int | None = None) -> Generation:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise Invalid("max_tokens must be at least 1", "max_tokens")
    n_in = prompt_tokens(prompt) if n_in is None else n_in
    if n_in >= context_tokens:  # vLLM's words
        raise Invalid(f"This model's maximum context length is {context_tokens} tokens. "
                      f"However, your request has {n_in} input tokens. Please reduce the "
                      "length of the input messages.", "messages" if kind == "chat" else
                      "prompt")
    if n_in + max_tokens > context_tokens:
        raise Invalid(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. "
                      f"This model's maximum context length is {context_tokens} tokens and "
                      f"your request has {n_in} input tokens ({max_tokens} > {context_tokens}"
                      f" - {n_in}).", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise Invalid("temperature must be between 0 and 2", "temperature")
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise Invalid("top_p must be in (0, 1]", "top_p")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise Invalid(f"n must be an integer 1..{MAX_N}", "n")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise Invalid("stream must be a boolean", "stream")
    if stream and n > 1:
        raise Invalid("n > 1 is not streamed by simpipe servers", "n")
    _check_sampled_tokens(kind, body, n, max_tokens, n_in)
    if body.get("stream_options") is not None and not stream:
        raise Invalid("stream_options is only allowed with stream = true", "stream_options")
    if body.get("grammar") is not None and body.get("json_schema") is not None:
        # llama.cpp's server refuses both at once
        raise Invalid('Either "json_schema" or "grammar" can be specified, but not both')
    so = body.get("structured_outputs") or {}
    regex = so.get("regex") if isinstance(so, dict) else None
    regex = regex or body.get("guided_regex")
    if regex is not None:
        if not isinstance(regex, str):
            raise Invalid("regex must be a string", "structured_outputs")
        _matcher(regex, "openai")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise Invalid("stop must be a string or a list of strings", "stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise Invalid("seed must be an integer", "seed")
    min_tokens = body.get("min_tokens") or 0
    if not isinstance(min_tokens, int) or min_tokens < 0 or min_tokens > max_tokens:
        raise Invalid("min_tokens must be an integer 0..max_tokens", "min_tokens")
    samples = []
    for i in range(n):
        # choice i as llama.cpp's server samples it: seed + i
        text = _answer(seed + i if seed is not None else (i or None), prompt, regex,
                       max_tokens, "openai")
        text, finish = _cut(text, stop, max_tokens)
        # vLLM's extensions that fix the output length (its own benchmarks send
        # ignore_eos): the answer goes on with spaces, as a model that may not stop goes
        # on with something.
        if body.get("ignore_eos"):
            text, finish = text.ljust(max_tokens), "length"
        elif len(text) < min_tokens:
            text = text.ljust(min_tokens)
        samples.append((text, finish))
    text, finish = samples[0]
    # Only what the answer shows is kept: a request may wait in a queue for long.
    options = body.get("stream_options")
    shown = {"model": body.get("model"), "echo": body.get("echo"),
             "logprobs": body.get("logprobs"), "top_logprobs": body.get("top_logprobs"),
             "stream_options": {"include_usage": bool(options.get("include_usage"))}
             if isinstance(options, dict) else None}
    return Generation(kind, text, finish, n_in, seed, stream, shown, prompt, tuple(samples[1:]))


def _check_sampled_tokens(kind: str, body: dict, n: int, max_tokens: int, n_in: int) -> None:
    """Invalid naming the bound when ``n`` choices of ``max_tokens`` (and the prompt, each
    choice echoing it) pass ``MAX_SAMPLED_TOKENS``, or ``MAX_LOGPROB_TOKENS`` with
    ``logprobs`` (a completion's ``logprobs = 0`` still lists every token)."""
    echo = kind == "completion" and bool(body.get("echo"))
    per_choice = max_tokens + (n_in if echo else 0)
    asked = body.get("logprobs")
    logprobs = asked is not None and asked is not False if kind == "completion" else bool(asked)
    bound = MAX_LOGPROB_TOKENS if logprobs else MAX_SAMPLED_TOKENS
    if n * per_choice > bound:
        what = "(max_tokens + echoed prompt tokens)" if echo else "max_tokens"
        raise Invalid(f"n x {what} = {n} x {per_choice} = {n * per_choice:,} tokens: at most "
                      f"{bound:,} per request{' with logprobs' if logprobs else ''} (simpipe "
                      "servers); ask for fewer samples or fewer tokens", "n")


def _finish(gen: Generation) -> str:
    return _openai_finish(gen.finish)


def _openai_finish(finish: str) -> str:
    return "length" if finish == "length" else "stop"


def _usage(gen: Generation) -> dict:
    return {"prompt_tokens": gen.tokens_in, "completion_tokens": gen.tokens_out,
            "total_tokens": gen.tokens_in + gen.tokens_out}


def _envelope(gen: Generation, obj: str, choices: list[dict]) -> dict:
    return {
        "id": f"cmpl-{zlib.crc32(gen.prompt.encode()) ^ (gen.seed or 0):08x}",
        "object": obj,
        "created": 0,  # deterministic answers: the same request gets the same bytes
        "model": gen.body.get("model") or "default",
        "system_fingerprint": "simpipe",
        "choices": choices,
    }


def _completion_logprobs(gen: Generation, text: str) -> dict | None:
    k = gen.body.get("logprobs")
    if k is None:
        return None
    if gen.prompt_ids is not None and k:
        # vLLM's CompletionLogProbs of one generated token; with
        # return_tokens_as_token_ids its tokens are written "token_id:<id>".
        top = synthetic_tokens.top_logprobs(gen.prompt_ids, k)
        as_ids = gen.body.get("return_tokens_as_token_ids")

        def name(tid: int) -> str:
            return f"token_id:{tid}" if as_ids else synthetic_tokens.token_text(tid)

        return {"tokens": [name(top[0][0])], "token_logprobs": [top[0][1]],
                "text_offset": [0], "top_logprobs": [{name(t): lp for t, lp in top}]}
    tokens = list(text)
    return {"tokens": tokens, "token_logprobs": [-0.5] * len(tokens),
            "text_offset": list(range(len(tokens))),
            "top_logprobs": [{t: -0.5} for t in tokens] if k else None}


def _chat_logprobs(gen: Generation, text: str) -> dict | None:
    if not gen.body.get("logprobs"):
        return None
    top = gen.body.get("top_logprobs") or 0
    entries = []
    for ch in text:
        entry = {"token": ch, "logprob": -0.5, "bytes": list(ch.encode())}
        entries.append({**entry, "top_logprobs": [entry] if top else []})
    return {"content": entries, "refusal": None}


def _openai_answer(gen: Generation) -> dict:
    choices = []
    for i, (text, finish) in enumerate(((gen.text, gen.finish), *gen.more)):
        if gen.kind == "completion":
            prefix = gen.prompt if gen.body.get("echo") else ""
            choices.append({"index": i, "text": prefix + text,
                            "logprobs": _completion_logprobs(gen, text),
                            "finish_reason": _openai_finish(finish)})
        else:
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "logprobs": _chat_logprobs(gen, text),
                            "finish_reason": _openai_finish(finish)})
    out = _envelope(gen, "text_completion" if gen.kind == "completion" else "chat.completion",
                    choices)
    out["usage"] = _usage(gen)
    return out


def _openai_events(gen: Generation) -> list[Any]:
    chat = gen.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"
    events: list[Any] = []
    if chat:  # the first chunk names the role, as OpenAI and vLLM do
        delta = {"role": "assistant", "content": "", "tool_calls": None}
        events.append(_envelope(gen, obj, [{"index": 0, "delta": delta, "logprobs": None,
                                            "finish_reason": None}]))
    for ch in gen.text:
        if chat:
            choice = {"index": 0, "delta": {"role": "assistant", "content": ch,
                                            "tool_calls": None},
                      "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": ch, "logprobs": None, "finish_reason": None}
        events.append(_envelope(gen, obj, [choice]))
    last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish(gen)}
    if chat:
        last["delta"] = {"role": "assistant", "content": "", "tool_calls": None}
    else:
        last["text"] = ""
    events.append(_envelope(gen, obj, [last]))
    options = gen.body.get("stream_options") or {}
    if isinstance(options, dict) and options.get("include_usage"):
        events.append({**_envelope(gen, obj, []), "usage": _usage(gen)})
    events.append(b"data: [DONE]\n\n")
    return events


def tokenize_response(body: Any, context_tokens: int) -> HttpResponse:
    """vLLM's ``POST /tokenize`` (a completion-style body: ``prompt``, optional
    ``add_special_tokens`` and ``return_token_strs``) with the synthetic tokenizer
    (``synthetic_tokens``): ``{"count", "max_model_len", "tokens", "token_strs"}``."""
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        return error_response("openai", "'prompt' must be a string", "prompt")
    ids = synthetic_tokens.tokenize(body["prompt"])
    if body.get("add_special_tokens", True) and body["prompt"] not in synthetic_tokens.SPECIALS:
        ids = [synthetic_tokens.SPECIALS["<s>"], *ids]
    strs = [synthetic_tokens.token_text(t) for t in ids] \
        if body.get("return_token_strs") else None
    return json_response({"count": len(ids), "max_model_len": context_tokens, "tokens": ids,
                          "token_strs": strs})


def models_list(model_id: str, owner: str) -> dict:
    """``GET /v1/models``."""
    card = {"id": model_id, "object": "model", "created": 0, "owned_by": owner}
    return {"object": "list", "data": [card]}
