"""A real HTTP server on 127.0.0.1 that answers the way a broken or hostile inference server
could: every byte of the answer is written here by hand, so a test controls exactly what
the wire carries (bad JSON, lying headers, endless bodies, echoed credentials).

It runs its own event loop in a daemon thread, so the same server serves a back-end in a
test's ``asyncio.run`` and Dask worker processes of a whole pipeline run. ``answer``
gets each request and returns the raw answer bytes (with ``Connection: close`` among its
headers, the server closes after them), or an async iterator of byte chunks (an answer
that never ends), or None (close without answering).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Request:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Reply = bytes | AsyncIterator[bytes] | None
Answer = Callable[[Request], Reply]


def http(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """One well-formed HTTP/1.1 answer with a correct Content-Length."""
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def ok_json(data: Any, headers: dict[str, str] | None = None) -> bytes:
    return http(200, json.dumps(data).encode(), {"Content-Type": "application/json",
                                                 **(headers or {})})


def tgi_answer(text: Any = "42", generated_tokens: Any = 2, prompt_tokens: str = "7") -> bytes:
    """TGI's ``/generate`` answer shape (any field may be replaced by something hostile)."""
    details = {"finish_reason": "eos_token", "generated_tokens": generated_tokens}
    return ok_json({"generated_text": text, "details": details}, {"x-prompt-tokens": prompt_tokens})


def openai_answer(text: Any = "42", usage: Any = None) -> bytes:
    """An OpenAI ``/v1/completions`` answer shape."""
    usage = {"prompt_tokens": 7, "completion_tokens": 2} if usage is None else usage
    return ok_json({"choices": [{"text": text, "finish_reason": "stop", "index": 0}],
                    "usage": usage})


async def endless_chunked_body(stop_after: int | None = None,
                               chunk: int = 64 * 1024) -> AsyncIterator[bytes]:
    """A 200 answer whose chunked body never ends (or, with ``stop_after``, stops coming
    after that many bytes without ever ending: a bound on what a test risks if the client
    under test does buffer it all)."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"%x\r\n%s\r\n" % (chunk, b" " * chunk)
    for _ in _pieces(stop_after, len(piece)):
        yield piece


async def endless_headers(stop_after: int | None = None,
                          chunk: int = 64 * 1024) -> AsyncIterator[bytes]:
    """A status line followed by headers that never end, each with a new name."""
    yield b"HTTP/1.1 200 OK\r\n"
    value = b"a" * chunk
    for n in _pieces(stop_after, chunk):
        yield b"X-Filler-%d: %s\r\n" % (n, value)


async def endless_header_value(stop_after: int | None = None,
                               chunk: int = 64 * 1024) -> AsyncIterator[bytes]:
    """One header whose value never ends (no line break ever comes)."""
    yield b"HTTP/1.1 200 OK\r\nX-Filler: "
    piece = b"a" * chunk
    for _ in _pieces(stop_after, chunk):
        yield piece


def _pieces(stop_after: int | None, size: int) -> Iterator[int]:
    n = 0
    while stop_after is None or n * size < stop_after:
        n += 1
        yield n


class HostileServer:
    """``with HostileServer(answer) as url: ...``; ``requests`` counts what arrived,
    ``hangups`` the endless answers the client cut off by closing the connection (and
    ``hung_up`` is set at the first)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests = 0
        self.bytes_sent = 0
        self.hangups = 0
        self.hung_up = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="hostile-server")
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

    def __enter__(self) -> str:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        # A connection's task left pending when the loop closes is logged as "Task was
        # destroyed but it is pending!" whenever it is collected, inside a later test. The
        # aborted transports end each one (its read or write fails); not cancelled, because
        # Python 3.11's stream callback logs a cancelled handler as an error.
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests += 1
                reply = self.answer(Request(lines[0].split(" ")[1], headers, body))
                if reply is None:
                    break
                if isinstance(reply, bytes):
                    await self._write(writer, reply)
                    if b"\r\nconnection: close" in reply.partition(b"\r\n\r\n")[0].lower():
                        break
                    continue
                try:
                    async for chunk in reply:  # an endless answer: until the client hangs up
                        await self._write(writer, chunk)
                except ConnectionError:
                    self.hangups += 1
                    self.hung_up.set()
                    raise
                finally:
                    await reply.aclose()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.bytes_sent += len(data)
        await writer.drain()


# --- A fake llama.cpp server for the answer-distribution routes -----------------------------
# The routes and fields as ``simpipe.inference.llamacpp.logprobs`` documents llama.cpp's own
# server: ``POST /tokenize`` (``with_pieces``) answers ``{"tokens": [{"id", "piece"}]}``,
# ``POST /completion`` with ``n_probs`` answers ``completion_probabilities[0].top_logprobs``
# (``{"id", "token", "bytes", "logprob"}``, most likely first) with ``timings.prompt_n`` and
# ``tokens_predicted``; ``POST /v1/completions`` is a sampled call.

#: The fake vocabulary: one token per character, the answer alphabet at ids 10-21, the
#: end-of-generation marker ``<eos>`` a special token (one token only with parse_special).
FAKE_EOS_ID = 1
FAKE_IDS = {c: 10 + i for i, c in enumerate("0123456789 -")}


def llamacpp_tokens(body: dict) -> dict:
    """llama.cpp's ``/tokenize`` answer for a request body, in the fake vocabulary."""
    text = body["content"]
    if body.get("parse_special") and text == "<eos>":
        return {"tokens": [{"id": FAKE_EOS_ID, "piece": "<eos>"}]}
    return {"tokens": [{"id": FAKE_IDS.get(c, 1000 + ord(c)), "piece": c} for c in text]}


def good_top_logprobs() -> list[tuple[Any, Any]]:
    """``(id, logprob)`` of every answer token and ``<eos>``, most likely first, summing to
    probability 1: nothing the grammar accepts is unseen."""
    probs = {FAKE_IDS[" "]: 0.3, FAKE_EOS_ID: 0.2, FAKE_IDS["-"]: 0.1,
             **{FAKE_IDS[d]: 0.04 for d in "0123456789"}}
    return [(t, math.log(p)) for t, p in sorted(probs.items(), key=lambda kv: -kv[1])]


def llamacpp_completion(top: list[tuple[Any, Any]], prompt_n: Any = 7,
                        tokens_predicted: Any = 1) -> dict:
    """llama.cpp's ``/completion`` answer with ``n_probs`` (any field may be hostile)."""
    entries = [{"id": t, "token": "x", "bytes": [120], "logprob": lp} for t, lp in top]
    return {"content": "x", "completion_probabilities": [
        {"id": entries[0]["id"] if entries else 0, "token": "x", "bytes": [120],
         "logprob": entries[0]["logprob"] if entries else 0.0, "top_logprobs": entries}],
        "timings": {"prompt_n": prompt_n}, "tokens_predicted": tokens_predicted}


def fake_llamacpp(completion: Callable[[Request], Reply] | None = None,
                  tokenize: Callable[[Request], Reply] | None = None) -> Answer:
    """A ``HostileServer`` answer playing llama.cpp's server: ``/tokenize`` and the
    probes' ``/completion`` (a prompt of text and token ids) from ``tokenize`` and
    ``completion`` where given (a function of the request, returning its raw answer), else
    good answers; every agent's own call answers ``"42"``: on ``/v1/completions``, or on
    ``/completion`` (a prompt of text) as llama.cpp does where a stop string ended it."""

    def answer(req: Request) -> Reply:
        if req.path == "/tokenize":
            if tokenize is not None:
                return tokenize(req)
            return ok_json(llamacpp_tokens(req.json()))
        if req.path == "/completion" and isinstance(req.json().get("prompt"), str):
            return ok_json({"content": "", "stop_type": "word", "stopping_word": " 42",
                            "tokens_evaluated": 7, "tokens_predicted": 3})
        if req.path == "/completion":
            if completion is not None:
                return completion(req)
            return ok_json(llamacpp_completion(good_top_logprobs()))
        if req.path == "/v1/completions":
            return openai_answer("42")
        return http(404, b'{"error": {"code": 404, "message": "File Not Found"}}')

    return answer


class Silences:
    """Answers that never come (the client under test times out): ``answer()`` holds its
    connection without sending a byte until ``release()`` (or ``limit_s``), then closes it.
    Call ``release()`` before the server stops, so that no answer outlives its loop."""

    def __init__(self, limit_s: float = 60.0) -> None:
        self.limit_s = limit_s
        self.held = 0
        self._released = threading.Event()

    def answer(self) -> AsyncIterator[bytes]:
        return self._silence()

    async def _silence(self) -> AsyncIterator[bytes]:
        self.held += 1
        try:
            deadline = asyncio.get_running_loop().time() + self.limit_s
            while not self._released.is_set() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
        finally:
            self.held -= 1
        return
        yield b""  # an async generator

    def release(self, timeout_s: float = 10.0) -> None:
        """End every held answer, and wait until they have ended."""
        self._released.set()
        deadline = time.monotonic() + timeout_s
        while self.held and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # their connections' handlers see the close
