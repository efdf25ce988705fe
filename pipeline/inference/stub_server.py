"""A fast stand-in inference server that follows the published contracts and answers at once.

TGI: ``POST /generate``, ``GET /health``, ``GET /info``; OpenAI: ``POST /v1/completions``,
``POST /v1/chat/completions``, ``GET /v1/models``. The answer is a number derived from the
request seed and prompt (so the same request gets the same answer), chosen to match the
request's regex when one is given (GBNF is not interpreted: the answer is an integer
0..100, which is what simpipe's grammars admit).

Validation follows TGI's router (422 ``{"error", "error_type": "validation"}``) with one
deliberate extra: ``max_new_tokens`` is required here, so a client that forgets it fails
in tests instead of silently getting TGI's default of 100 tokens. OpenAI routes answer
validation errors with 400 ``{"error": {"message", "type", "param", "code"}}``.

For tests: ``fail_first``/``fail_status`` (the first K generation requests get that
status), ``delay_s`` (every generation waits first: overload or client timeouts),
``max_concurrent`` (beyond it: 429 "Model is overloaded", as TGI), and ``bodies`` (the
last ``record`` request bodies with their path and Authorization header).

HTTP comes from ``simpipe.inference.stub_http``. In-process: ``async with
StubServer(...) as stub: stub.url``. As a process:
``python -m simpipe.inference.stub_server --port N`` (or ``StubProcess`` in Python), which
prints ``simpipe-stub-server listening on http://127.0.0.1:N`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Self

from simpipe import aio
from simpipe.inference.stub_http import HttpRequest, HttpResponse, HttpServer

READY_LINE = "simpipe-stub-server listening on"
MODEL_ID = "simpipe/stub"
MAX_INPUT_TOKENS = 4096
MAX_TOTAL_TOKENS = 8192
MAX_STOP_SEQUENCES = 4


@dataclass
class StubConfig:
    """Knobs a test may change while the server runs."""

    delay_s: float = 0.0
    max_concurrent: int = 128  # TGI's default max_concurrent_requests
    fail_first: int = 0
    fail_status: int = 503
    record: int = 1000
    bodies: collections.deque = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.bodies = collections.deque(maxlen=self.record)


class _Invalid(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _json(data: Any, status: int = 200, headers: dict | None = None) -> HttpResponse:
    return HttpResponse(status, json.dumps(data, separators=(",", ":")).encode(), headers)


def _n_tokens(text: str) -> int:
    # A rough stand-in for a tokenizer: ~4 bytes per token, at least one.
    return max(1, len(text) // 4)


def _answer(seed: int | None, prompt: str, regex: str | None) -> str:
    """A deterministic number 0..100 (matching ``regex`` when possible)."""
    n = zlib.crc32(f"{seed}|{prompt}".encode()) % 101
    if regex is None:
        return str(n)
    pattern = re.compile(regex)
    for k in range(101):
        candidate = str((n + k) % 101)
        if pattern.fullmatch(candidate):
            return candidate
    return str(n)


def _cut(text: str, stop: list[str], max_tokens: int) -> tuple[str, str]:
    """Apply stop sequences and the token budget (one token per character here)."""
    for s in stop:
        i = text.find(s)
        if s and i >= 0:
            return text[:i], "stop_sequence"
    if len(text) > max_tokens:
        return text[:max_tokens], "length"
    return text, "eos_token"


class StubServer:
    """The stub in this process's event loop on 127.0.0.1 (port 0: a free one)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", **config: Any) -> None:
        self.host = host
        self.port = port
        self.config = StubConfig(**config)
        self.in_flight = 0
        self.served = 0  # generation requests seen, failures included
        self._http: HttpServer | None = None
        # path -> (method, handler, tgi): a generation route (tgi True/False, the error
        # style) gets the parsed body after admission; the others take no argument.
        self._routes: dict[str, tuple[str, Any, bool | None]] = {
            "/generate": ("POST", self._tgi_answer, True),
            "/health": ("GET", self._health, None),
            "/info": ("GET", self._info, None),
            "/v1/completions": ("POST", self._completion_answer, False),
            "/v1/chat/completions": ("POST", self._chat_answer, False),
            "/v1/models": ("GET", self._models, None),
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def bodies(self) -> list[dict]:
        return list(self.config.bodies)

    async def start(self) -> str:
        self._http = HttpServer(self._dispatch, self.host, self.port)
        self.port = await self._http.start()
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- shared request handling ------------------------------------------------------------

    def _dispatch(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        route = self._routes.get(request.path)
        if route is None:
            return _json({"error": f"no route {request.path}", "error_type": "not_found"}, 404)
        method, handler, tgi = route
        if request.method != method:
            return _json({"error": f"{request.method} not allowed", "error_type": "method"}, 405)
        if tgi is None:
            return handler()
        body, refusal = self._admit(request, tgi)
        if refusal is not None:
            return refusal
        if self.config.delay_s > 0:
            # Counted from admission (not from when the task first runs), so that requests
            # arriving together see each other: that is what makes a 429 under overload.
            self.in_flight += 1
            task = asyncio.ensure_future(self._later(handler, body, tgi))
            task.add_done_callback(self._release)
            return task
        return self._answer(handler, body, tgi)

    def _release(self, _: asyncio.Future) -> None:
        self.in_flight -= 1

    def _admit(self, request: HttpRequest, tgi: bool) -> tuple[dict | None, HttpResponse | None]:
        """Parse and record the body; apply overload and injected failures."""
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            return None, self._invalid(tgi, f"Failed to parse the request body as JSON: {exc}")
        cfg = self.config
        cfg.bodies.append(
            {
                "path": request.path,
                "body": body,
                "authorization": request.headers.get("authorization"),
            }
        )
        self.served += 1
        if self.served <= cfg.fail_first:
            status = cfg.fail_status
            msg = "injected failure"
            kind = "overloaded" if status == 429 else "generation" if status == 424 else "server"
            return None, _json({"error": msg, "error_type": kind}, status)
        if self.in_flight >= cfg.max_concurrent:
            return None, _json({"error": "Model is overloaded", "error_type": "overloaded"}, 429)
        if not isinstance(body, dict):
            return None, self._invalid(tgi, "request body must be a JSON object")
        return body, None

    @staticmethod
    def _invalid(tgi: bool, message: str, param: str | None = None) -> HttpResponse:
        if tgi:
            return _json({"error": message, "error_type": "validation"}, 422)
        err = {"message": message, "type": "invalid_request_error", "param": param, "code": 400}
        return _json({"error": err}, 400)

    def _answer(self, handler: Any, body: dict, tgi: bool) -> HttpResponse:
        try:
            return handler(body)
        except _Invalid as exc:
            return self._invalid(tgi, str(exc), exc.param)

    async def _later(self, handler: Any, body: dict, tgi: bool) -> HttpResponse:
        await asyncio.sleep(self.config.delay_s)
        return self._answer(handler, body, tgi)

    # --- TGI ----------------------------------------------------------------------------------

    def _tgi_answer(self, body: dict) -> HttpResponse:
        inputs = body.get("inputs")
        p = body.get("parameters") or {}
        if not isinstance(inputs, str):
            raise _Invalid("`inputs` must be a string")
        if not inputs:
            raise _Invalid("`inputs` cannot be empty")
        max_new = p.get("max_new_tokens")
        if max_new is None:
            raise _Invalid("`max_new_tokens` must be set (simpipe stub)")
        if not isinstance(max_new, int) or max_new <= 0:
            raise _Invalid("`max_new_tokens` must be strictly positive")
        n_in = _n_tokens(inputs)
        if n_in + max_new > MAX_TOTAL_TOKENS:
            raise _Invalid(
                f"`inputs` tokens + `max_new_tokens` must be <= {MAX_TOTAL_TOKENS}. "
                f"Given: {n_in} `inputs` tokens and {max_new} `max_new_tokens`"
            )
        temperature = p.get("temperature")
        if temperature is not None and temperature <= 0:
            raise _Invalid("`temperature` must be strictly positive")
        top_p = p.get("top_p")
        if top_p is not None and not 0 < top_p < 1:
            raise _Invalid("`top_p` must be > 0.0 and < 1.0")
        stop = p.get("stop") or []
        if len(stop) > MAX_STOP_SEQUENCES:
            raise _Invalid(
                f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(stop)}"
            )
        regex, schema = _tgi_grammar(p.get("grammar"))
        seed = p.get("seed")
        text = _answer(seed, inputs, regex)
        if schema is not None:
            text = _json_answer(schema, text)
        text, finish = _cut(text, stop, max_new)
        details = None
        if p.get("details"):
            details = {
                "finish_reason": finish,
                "generated_tokens": len(text),
                "seed": seed,
                "prefill": [],
                "tokens": [
                    {"id": 100 + ord(ch), "text": ch, "logprob": -0.5, "special": False}
                    for ch in text
                ],
            }
        out = {"generated_text": text}
        if details is not None:
            out["details"] = details
        return _json(
            out, headers={"x-prompt-tokens": str(n_in), "x-generated-tokens": str(len(text))}
        )

    def _health(self) -> HttpResponse:
        return HttpResponse(200)

    def _info(self) -> HttpResponse:
        return _json(
            {
                "model_id": MODEL_ID,
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": self.config.max_concurrent,
                "max_best_of": 2,
                "max_stop_sequences": MAX_STOP_SEQUENCES,
                "max_input_tokens": MAX_INPUT_TOKENS,
                "max_total_tokens": MAX_TOTAL_TOKENS,
                "validation_workers": 2,
                "max_client_batch_size": 4,
                "router": "text-generation-router",
                "version": "3.3.7-simpipe-stub",
                "sha": None,
                "docker_label": None,
            }
        )

    # --- OpenAI -------------------------------------------------------------------------------

    def _completion_answer(self, body: dict) -> HttpResponse:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _Invalid("'prompt' must be a non-empty string", "prompt")
        text, finish, usage = _openai_answer(body, prompt)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return _json(_envelope("text_completion", body, choice, usage))

    def _chat_answer(self, body: dict) -> HttpResponse:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _Invalid("'messages' must be a non-empty list", "messages")
        parts = []
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise _Invalid("each message needs a role of system, user or assistant", "messages")
            parts.append(f"<|{m['role']}|>{m.get('content') or ''}")
        text, finish, usage = _openai_answer(body, "".join(parts))
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        return _json(_envelope("chat.completion", body, choice, usage))

    def _models(self) -> HttpResponse:
        card = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "simpipe-stub"}
        return _json({"object": "list", "data": [card]})


def _tgi_grammar(grammar: Any) -> tuple[str | None, dict | None]:
    if grammar is None:
        return None, None
    if not isinstance(grammar, dict) or grammar.get("type") not in ("json", "regex"):
        raise _Invalid("grammar is not valid: `type` must be `json` or `regex`")
    value = grammar.get("value")
    if grammar["type"] == "regex":
        if not isinstance(value, str):
            raise _Invalid("grammar is not valid: regex `value` must be a string")
        try:
            re.compile(value)
        except re.error as exc:
            raise _Invalid(f"grammar is not valid: {exc}") from None
        return value, None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _Invalid(f"grammar is not valid: {exc}") from None
    if not isinstance(value, dict) or "properties" not in value:
        raise _Invalid("grammar is not valid: Grammar must have a 'properties' field")
    return None, value


def _json_answer(schema: dict, number: str) -> str:
    name = next(iter(schema.get("properties") or {"answer": None}), "answer")
    return json.dumps({name: int(number)})


def _openai_answer(body: dict, prompt: str) -> tuple[str, str, dict]:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise _Invalid("max_tokens must be at least 1", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise _Invalid("temperature must be between 0 and 2", "temperature")
    top_p = body.get("top_p", 1.0)
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise _Invalid("top_p must be in (0, 1]", "top_p")
    if body.get("grammar") is not None and body.get("json_schema") is not None:
        # llama.cpp's server refuses both at once
        raise _Invalid('Either "json_schema" or "grammar" can be specified, but not both')
    so = body.get("structured_outputs") or {}
    regex = so.get("regex") if isinstance(so, dict) else None
    regex = regex or body.get("guided_regex")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise _Invalid(f"invalid regex: {exc}", "structured_outputs") from None
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    text = _answer(body.get("seed"), prompt, regex)
    text, finish = _cut(text, stop, max_tokens)
    finish = "length" if finish == "length" else "stop"
    n_in = _n_tokens(prompt)
    usage = {
        "prompt_tokens": n_in,
        "completion_tokens": len(text),
        "total_tokens": n_in + len(text),
    }
    return text, finish, usage


def _envelope(obj: str, body: dict, choice: dict, usage: dict) -> dict:
    return {
        "id": "cmpl-stub",
        "object": obj,
        "created": int(time.time()),
        "model": body.get("model") or MODEL_ID,
        "choices": [choice],
        "usage": usage,
    }


class StubProcess:
    """The stub in a child process (for benchmarks: its CPU is not the client's)."""

    def __init__(self, port: int = 0, **options: Any) -> None:
        self.port = port
        self.options = options
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-m", "simpipe.inference.stub_server", "--port", str(self.port)]
        for key, value in self.options.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if READY_LINE not in line:
            self.proc.kill()
            raise RuntimeError(f"stub server did not start: {line!r}")
        self.url = line.split()[-1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m simpipe.inference.stub_server", description=__doc__
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--max-concurrent", type=int, default=128)
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--fail-status", type=int, default=503)
    ap.add_argument("--record", type=int, default=1000)
    args = ap.parse_args(argv)

    async def serve() -> None:
        stub = StubServer(
            args.port,
            args.host,
            delay_s=args.delay_s,
            max_concurrent=args.max_concurrent,
            fail_first=args.fail_first,
            fail_status=args.fail_status,
            record=args.record,
        )
        await stub.start()
        print(f"{READY_LINE} {stub.url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await stub.stop()

    try:
        aio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
