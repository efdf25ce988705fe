"""The HTTP/1.1 layer of simpipe's own servers (the stub and the emulator): keep-alive
connections, requests parsed by llhttp (``httptools``), one handler call per request, answers
as one buffer or, for server-sent events, in chunked transfer encoding.

The stub must answer faster than a client can ask, or ``simpipe bench client`` measures
the stub: an aiohttp ``web.Application`` spends ~190 us of CPU per request on this
project's 2-core machine, this layer about a third of that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import httptools

MAX_BODY = 16 * 2**20


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
    def __init__(self, handler: Handler, connections: set) -> None:
        self.handler = handler
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.pending: asyncio.Task | None = None  # a request whose answer comes later

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.pending is not None:
            self.pending.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(HttpResponse(400, b'{"error":"malformed HTTP request"}'), False)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.chunks = []
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_BODY:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        if self.size > MAX_BODY:
            self._send(HttpResponse(413, b'{"error":"request body too large"}'), False)
            return
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

    def __init__(self, handler: Handler, host: str, port: int) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self.handler, self._connections), self.host, self.port
        )
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
