"""The HTTP/1.1 layer of simpipe's own servers (the stub and the emulator): keep-alive
connections, requests parsed by llhttp (``httptools``), one handler call per request, answers
as one buffer or, for server-sent events, in chunked transfer encoding.

The stub must answer faster than a client can ask, or ``simpipe bench client`` measures
the stub: an aiohttp ``web.Application`` spends ~190 us of CPU per request on this
project's 2-core machine, this layer about a third of that.

Bounds (each answered with its status and one JSON line, then the connection is closed):
the request line and headers together ``MAX_HEAD`` bytes (431), the URL ``MAX_URL`` (414),
a body ``MAX_BODY`` (413, before any byte of it when ``Content-Length`` says so), and the
bodies being received on every connection of a process together ``MAX_BUFFERED_BODIES``
(503, shared through a ``BodyBudget``). Nothing beyond a bound is kept: a 400 MB header
value or URL costs what 64 KiB does. After such an answer the connection reads and drops at
most ``LINGER_BYTES`` more for ``LINGER_S``, so that a client still sending its request reads
the answer instead of a connection reset.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import httptools

MAX_HEAD = 64 * 2**10
MAX_URL = 8 * 2**10
MAX_BODY = 2_000_000  # TGI's --payload-limit default
MAX_BUFFERED_BODIES = 32 * 2**20
LINGER_BYTES = MAX_BODY + MAX_HEAD
LINGER_S = 2.0


class BodyBudget:
    """Request body bytes held while their requests are being received, over every
    connection of the servers that share it (the GPUs of one emulator process)."""

    def __init__(self, limit: int = MAX_BUFFERED_BODIES) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the answer is ``resp``."""

    def __init__(self, resp: HttpResponse) -> None:
        super().__init__(resp.status)
        self.resp = resp


def _refusal(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, json.dumps({"error": message, "error_type": "limit"}).encode())


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: dict[str, str] | None = None
    content_type: str = "application/json"
    chunks: list[bytes] | None = None  # set: sent with Transfer-Encoding: chunked, not body


#: A handler answers at once (``HttpResponse``) or later: an ``asyncio.Future`` of one (no
#: task per request: the answer goes out from the future's done callback) or any other
#: awaitable of one.
Handler = Callable[[HttpRequest], "HttpResponse | Awaitable[HttpResponse]"]


def encode_response(resp: HttpResponse, keep_alive: bool) -> bytes:
    try:
        phrase = HTTPStatus(resp.status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {resp.status} {phrase}"]
    if resp.body or resp.chunks is not None or resp.status not in (204, 304):
        lines.append(f"Content-Type: {resp.content_type}")
    if resp.chunks is None:
        lines.append(f"Content-Length: {len(resp.body)}")
    else:
        lines.append("Transfer-Encoding: chunked")
    if not keep_alive:
        lines.append("Connection: close")
    for name, value in (resp.headers or {}).items():
        lines.append(f"{name}: {value}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if resp.chunks is None:
        return head + resp.body
    parts = [head]
    for chunk in resp.chunks:
        if chunk:  # an empty chunk would end the body early
            parts += [f"{len(chunk):x}\r\n".encode(), chunk, b"\r\n"]
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def _server_error(exc: Exception) -> HttpResponse:
    body = json.dumps({"error": f"{type(exc).__name__}: {exc}", "error_type": "server"})
    return HttpResponse(500, body.encode())


class _ServerConnection(asyncio.Protocol):
    def __init__(self, handler: Handler, connections: set, budget: BodyBudget) -> None:
        self.handler = handler
        self.connections = connections
        self.budget = budget
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.held = 0  # body bytes taken from the budget for the request being received
        self.in_head = True  # receiving a request line or headers
        self.head_bytes = 0
        self.dropped: int | None = None  # after a refusal: bytes read and dropped since
        self.pending: asyncio.Task | None = None  # a request whose answer comes later

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self._release()
        if self.pending is not None:
            self.pending.cancel()

    def data_received(self, data: bytes) -> None:
        if self.dropped is not None:  # refused: read the rest of the request, keep nothing
            self.dropped += len(data)
            if self.dropped > LINGER_BYTES and self.transport is not None:
                self.transport.close()
            return
        try:
            while data:
                if not self.in_head:
                    self.parser.feed_data(data)
                    return
                # The parser keeps a header value until it ends: feed it no more head than
                # the bound allows, so that an endless one is refused after MAX_HEAD bytes.
                room = MAX_HEAD - self.head_bytes
                piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
                self.head_bytes += len(piece)
                self.parser.feed_data(piece)
                if self.in_head and self.head_bytes >= MAX_HEAD:
                    raise _Refused(_refusal(431, f"request headers larger than {MAX_HEAD} "
                                                 "bytes"))
        except _Refused as refused:
            self._refuse(refused.resp)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):  # raised in a callback, wrapped by the parser
                self._refuse(cause.resp)
            else:
                self._refuse(HttpResponse(400, b'{"error":"malformed HTTP request"}'))

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.chunks = []
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL:
            raise _Refused(_refusal(414, f"URL longer than {MAX_URL} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.in_head = False
        length = self.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > MAX_BODY:
            raise _Refused(_refusal(413, f"request body larger than {MAX_BODY} bytes"))

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_BODY:
            raise _Refused(_refusal(413, f"request body larger than {MAX_BODY} bytes"))
        if not self.budget.take(len(body)):
            raise _Refused(_refusal(503, "server busy: too many request bytes being "
                                         "received, try again"))
        self.held += len(body)
        self.chunks.append(body)

    def _release(self) -> None:
        self.budget.give(self.held)
        self.held = 0

    def _refuse(self, resp: HttpResponse) -> None:
        """Answer ``resp`` and end the connection: reading stops counting, the answer goes
        out with a FIN, and the socket closes once the client has closed its side, has sent
        ``LINGER_BYTES`` more or ``LINGER_S`` have passed."""
        self._release()
        self.chunks = []
        self.dropped = 0
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(encode_response(resp, False))
        if transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        self.in_head = True
        self.head_bytes = 0
        self._release()
        path = httptools.parse_url(self.url).path.decode("latin-1")
        method = self.parser.get_method().decode("latin-1")
        request = HttpRequest(method, path, self.headers, b"".join(self.chunks))
        try:
            answer = self.handler(request)
        except Exception as exc:  # noqa: BLE001 - a handler bug is a 500, never a hung client
            answer = _server_error(exc)
        if isinstance(answer, HttpResponse):
            self._send(answer, keep_alive)
            return
        # Answers go out in request order: read nothing more until this one is written.
        self.transport.pause_reading()  # type: ignore[union-attr]
        if isinstance(answer, asyncio.Future):
            answer.add_done_callback(lambda fut: self._deliver(fut, keep_alive))
            return
        self.pending = asyncio.ensure_future(self._later(answer, keep_alive))

    def _deliver(self, fut: asyncio.Future, keep_alive: bool) -> None:
        if fut.cancelled():
            resp = HttpResponse(503, b'{"error":"server shutting down","error_type":"server"}')
        elif fut.exception() is not None:
            resp = _server_error(fut.exception())  # type: ignore[arg-type]
        else:
            resp = fut.result()
        self._answered(resp, keep_alive)

    async def _later(self, answer: Awaitable[HttpResponse], keep_alive: bool) -> None:
        try:
            resp = await answer
        except Exception as exc:  # noqa: BLE001 - as above
            resp = _server_error(exc)
        self.pending = None
        self._answered(resp, keep_alive)

    def _answered(self, resp: HttpResponse, keep_alive: bool) -> None:
        """A deferred answer is ready: send it and read the connection's next request."""
        self._send(resp, keep_alive)
        if keep_alive and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _send(self, resp: HttpResponse, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(encode_response(resp, keep_alive))
        if not keep_alive:
            transport.close()


class HttpServer:
    """Serves ``handler`` on ``host:port`` (port 0: a free one) on the running loop."""

    def __init__(self, handler: Handler, host: str, port: int,
                 budget: BodyBudget | None = None) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.budget = budget or BodyBudget()  # servers of one process may share one
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self.handler, self._connections, self.budget), self.host,
            self.port)
        if not self._server.sockets:  # no free port left: the same as any failed bind
            self._server.close()
            raise OSError(f"no socket could be bound on {self.host}:{self.port}")
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            if conn.transport is not None:
                conn.transport.abort()
        await self._server.wait_closed()
        self._server = None
