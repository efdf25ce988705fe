"""A small keep-alive HTTP/1.1 client: POST a body, get back status, body and headers.

Why not aiohttp here: on this project's 2-core reference machine one
``aiohttp.ClientSession.post`` + ``read`` costs about 270 us of client CPU, so one worker
process cannot send more than ~3,700 requests/s however fast the servers are. The
inference back-ends only ever POST JSON to a few known servers, which needs far less: a
pool of persistent connections per endpoint, a request written as one buffer, and the
response parsed by llhttp (the C parser behind Node.js, via ``httptools``). That costs
about 70 us per request (``simpipe bench client`` measures both).

What it does not do, on purpose: redirects, cookies, proxies, compression, HTTP/2.
Inference servers answer generation requests with JSON directly.

An answer is untrusted input, bounded before it is buffered: the status line and headers
to ``MAX_HEAD_BYTES``, the body to the pool's ``max_body`` (a ``Content-Length`` above it
is refused before any body byte is read). Beyond either, the request fails with
``ResponseTooLarge`` and the connection is dropped, so an endless answer costs at most
the bound plus one socket read. Bytes that arrive while no request is waiting (a
server talking out of turn) drop the connection too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Mapping

import httptools

from simpipe.inference.settings import parse_base_url

#: Connections idle longer than this are closed instead of reused: uvicorn (vLLM, SGLang)
#: closes idle keep-alive connections after 5 s, and a request written into a connection
#: the server is closing is lost.
IDLE_REUSE_S = 4.0
#: Status line and headers of one answer, at most (inference servers send under 1 KiB).
MAX_HEAD_BYTES = 64 * 1024
#: Body of one answer, at most, unless the pool is given another bound.
DEFAULT_MAX_BODY = 2**20
#: Seconds between checks for requests past their deadline (a timeout fires this late at most).
WATCH_S = 0.05


class HttpError(Exception):
    """A request that got no HTTP answer (the message names the endpoint and why)."""


class ConnectFailed(HttpError):
    """No connection could be opened (refused, unreachable, name not found, TLS)."""


class ConnectionLost(HttpError):
    """The server closed the connection or sent something that is not HTTP."""


class ResponseTooLarge(HttpError):
    """The answer's headers or body went past their bound (the connection is dropped)."""


class Response:
    """Status, body and headers (names lower-cased) of one answer."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


class _Connection(asyncio.Protocol):
    """One TCP connection; one request at a time (no pipelining)."""

    def __init__(self, max_body: int, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.chunks: list[bytes] = []
        self.headers: dict[str, str] = {}
        self.max_body = max_body
        self.body_bytes = 0  # of the current answer
        self.head_bytes = 0  # of the current answer, until its first body byte
        self.got_bytes = False  # any byte of the current answer: then a failure is not stale
        self.closed = False
        self.keep_alive = True
        self.idle_since = 0.0
        self.deadline = 0.0  # loop time by which the current answer must be complete

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # no request is waiting: nothing here can be trusted
            self.abort()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionLost(f"not an HTTP answer ({exc})"))
            self.abort()
            return
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionLost("the server switched protocols (HTTP 101), no answer"))
            self.abort()
            return
        if self.waiter is not None:  # the answer goes on in a later read (rare: checks here)
            self._check_unfinished(len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if "content-length" not in self.headers and "transfer-encoding" not in self.headers:
            status = self._status()
            if status:  # an answer whose body runs until the connection closes
                self.keep_alive = False
                self.waiter = None
                waiter.set_result(Response(status, b"".join(self.chunks), self.headers))
                return
        reason = f": {exc}" if exc else ""
        self._fail(ConnectionLost(f"the server closed the connection{reason}"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.chunks = []
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes <= self.max_body:
            self.chunks.append(body)
        elif not self.closed:
            self._too_large(f"answer larger than {size_text(self.max_body)}")

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        waiter = self.waiter
        self.waiter = None
        if waiter is not None and not waiter.done():
            status = self._status()
            if status < 100:  # llhttp takes any three digits; "000" would read as no answer
                waiter.set_exception(ConnectionLost(f"not an HTTP answer (status {status:03d})"))
                self.abort()
                return
            waiter.set_result(Response(status, b"".join(self.chunks), self.headers))

    # used by the pool
    def send(self, data: bytes) -> asyncio.Future[Response]:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionLost("the server closed the connection")
        self.got_bytes = False
        self.body_bytes = self.head_bytes = 0
        self.waiter = self.loop.create_future()
        self.transport.write(data)
        return self.waiter

    def time_out(self) -> None:
        """The answer did not come in time: fail the request and drop the connection."""
        self._fail(TimeoutError())
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _status(self) -> int:
        try:
            return self.parser.get_status_code()
        except httptools.HttpParserError:
            return 0

    def _fail(self, exc: HttpError) -> None:
        waiter = self.waiter
        self.waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _check_unfinished(self, n: int) -> None:
        """Bounds on an answer that spans reads (one read is bounded by the event loop;
        on_body bounds the body)."""
        if not self.body_bytes:
            # No body byte yet: all of this read was status line and headers. llhttp holds
            # an unfinished header itself, so this is its only bound.
            self.head_bytes += n
            if self.head_bytes > MAX_HEAD_BYTES:
                self._too_large(f"answer headers larger than {size_text(MAX_HEAD_BYTES)}")
                return
        # A body announced larger than the bound is refused before waiting for any of it.
        length = self.headers.get("content-length")
        if length and length.isdigit() and (len(length) > 18 or int(length) > self.max_body):
            self._too_large(f"answer larger than {size_text(self.max_body)}")

    def _too_large(self, what: str) -> None:
        self.chunks = []  # the part already buffered goes now, not when the answer would end
        self._fail(ResponseTooLarge(what))
        self.abort()


class ConnectionPool:
    """Persistent connections to one server (``http://`` or ``https://`` base URL).

    Belongs to the event loop it is first used on. Connections are opened on demand and
    kept for reuse; the caller bounds how many requests run at once.

    Timeouts: every connection waiting for an answer has a deadline, and one check every
    ``WATCH_S`` (while any is waiting) fails those past it. This costs a store per request
    where ``asyncio.timeout`` costs a timer and a task cancellation each; a timeout fires
    up to ``WATCH_S`` late.
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        parts = parse_base_url(base_url)
        self.base_url = base_url
        self._max_body = max_body
        self._host = parts.hostname
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        default_port = 443 if self._tls else 80
        self._port = parts.port or default_port
        self._prefix = parts.path.rstrip("/")
        host = self._host if self._port == default_port else f"{self._host}:{self._port}"
        if ":" in self._host:  # IPv6 literal
            host = f"[{self._host}]" + ("" if self._port == default_port else f":{self._port}")
        lines = [f"Host: {host}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Connection] = []
        self._paths: dict[str, bytes] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[_Connection] = set()  # sent with a deadline (some since answered)
        self._watch: asyncio.TimerHandle | None = None

    async def post(self, path: str, body: bytes, timeout_s: float | None = None) -> Response:
        """POST ``body`` to ``base_url + path``. Raises ``ConnectFailed``, ``ConnectionLost``,
        ``ResponseTooLarge`` or ``TimeoutError`` (for the whole exchange, connecting
        included)."""
        target = self._paths.get(path)
        if target is None:
            target = self._paths[path] = (self._prefix + path).encode("latin-1")
        data = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            target,
            self._head,
            len(body),
            body,
        )
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        conn = self._warm()
        reused = conn is not None
        if conn is None:
            conn = await self._open(deadline)
        done = False
        try:
            try:
                response = await self._send(conn, data, deadline)
            except ConnectionLost:
                if not reused or conn.got_bytes:
                    raise
                # The server closed an idle connection just as we wrote to it: the request
                # never reached it, so one fresh connection is a safe second try.
                conn.abort()
                conn, reused = await self._open(deadline), False
                response = await self._send(conn, data, deadline)
            done = True
            return response
        finally:
            if done and conn.keep_alive and not conn.closed:
                conn.idle_since = loop.time()
                self._idle.append(conn)
            else:
                conn.abort()  # mid-answer (timeout, cancel) or told to close: never reuse

    def _send(self, conn: _Connection, data: bytes,
              deadline: float | None) -> asyncio.Future[Response]:
        waiter = conn.send(data)
        if deadline is not None:
            conn.deadline = deadline
            self._waiting.add(conn)
            if self._watch is None:
                self._watch = self._loop.call_later(WATCH_S, self._check)  # type: ignore[union-attr]
        return waiter

    def _check(self) -> None:
        """Fail every request past its deadline; keep checking while any is waiting."""
        now = self._loop.time()  # type: ignore[union-attr]
        for conn in list(self._waiting):
            waiter = conn.waiter
            if waiter is None or waiter.done():
                self._waiting.discard(conn)
            elif now >= conn.deadline:
                self._waiting.discard(conn)
                conn.time_out()
        self._watch = (self._loop.call_later(WATCH_S, self._check)  # type: ignore[union-attr]
                       if self._waiting else None)

    def _warm(self) -> _Connection | None:
        """An idle connection young enough to reuse, or None."""
        now = self._loop.time()  # type: ignore[union-attr]
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the warmest
            if not conn.closed and now - conn.idle_since < IDLE_REUSE_S:
                return conn
            conn.abort()
        return None

    async def _open(self, deadline: float | None = None) -> _Connection:
        # Outside the try below: TimeoutError is an OSError, and a timeout is no refusal.
        async with asyncio.timeout_at(deadline):
            return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self._max_body, loop),
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._host if self._tls else None,
            )
        except ssl.SSLError as exc:
            raise ConnectFailed(f"TLS failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise ConnectFailed(_why(exc)) from None
        return conn

    def close(self) -> None:
        """Close every idle connection (requests in flight close theirs when done)."""
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
        if self._watch is not None and not self._waiting:
            self._watch.cancel()
            self._watch = None


def size_text(n: int) -> str:
    """A byte count as people write it: "1 MiB", "64 KiB", "1000 bytes"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def _why(exc: OSError) -> str:
    # asyncio's own text ("Connect call failed (addr)") hides the reason; the errno has it.
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return exc.strerror or str(exc)
    return os.strerror(exc.errno)
