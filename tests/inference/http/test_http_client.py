"""The keep-alive HTTP/1.1 client under the tgi and openai back-ends, against real sockets:
servers written here byte by byte, so each test controls exactly what the wire carries."""

from __future__ import annotations

import asyncio

import pytest

from simpipe.inference.http.client import ConnectFailed, ConnectionLost, ConnectionPool


class _Server:
    """A TCP server whose ``answer(request_no_on_connection, request_bytes)`` returns the
    raw bytes to send back (``None``: close without answering)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                reply = self.answer(n, request)
                n += 1
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_requests_share_one_connection_and_carry_path_headers_and_body():
    async def go():
        server = _Server(lambda n, req: _ok(b'{"n": %d}' % n, b"X-Prompt-Tokens: 7\r\n"))
        async with server as url:
            pool = ConnectionPool(url + "/prefix/", {"Authorization": "Bearer t"})
            answers = [await pool.post("/generate", b'{"a":1}') for _ in range(3)]
            pool.close()
        return server, answers

    server, answers = asyncio.run(go())
    assert server.connections == 1
    assert [a.body for a in answers] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    assert answers[0].status == 200 and answers[0].headers["x-prompt-tokens"] == "7"
    first = server.requests[0]
    assert first.startswith(b"POST /prefix/generate HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:" in first and b"\r\nAuthorization: Bearer t\r\n" in first
    assert first.endswith(b'Content-Length: 7\r\n\r\n{"a":1}')


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error():
    """uvicorn (vLLM) drops idle keep-alive connections: the request written into one is
    sent again on a fresh connection, once."""

    async def go():
        server = _Server(lambda n, req: _ok(b"{}") if n == 0 else None)
        async with server as url:
            pool = ConnectionPool(url)
            statuses = [(await pool.post("/x", b"{}")).status for _ in range(3)]
            pool.close()
        return server, statuses

    server, statuses = asyncio.run(go())
    assert statuses == [200, 200, 200]
    assert server.connections == 3


def test_chunked_and_read_until_close_bodies():
    chunked = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n" + (
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"until\": \"close\"}"

    async def go():
        server = _Server(lambda n, req: chunked if n == 0 else until_close)
        async with server as url:
            pool = ConnectionPool(url)
            first = await pool.post("/x", b"{}")
            second = await pool.post("/x", b"{}")
            pool.close()
        return first, second

    first, second = asyncio.run(go())
    assert (first.status, first.body) == (503, b"hello world")
    assert (second.status, second.body) == (200, b'{"until": "close"}')


def test_timeout_covers_the_whole_exchange_and_the_connection_is_not_reused():
    async def go():
        server = _Server(lambda n, req: None if n == 0 else _ok(b"{}"))
        hang = asyncio.Event()

        async def slow(reader, writer):
            server.connections += 1
            await reader.readuntil(b"\r\n\r\n")
            if server.connections == 1:
                await hang.wait()  # never answers the first request
            writer.write(_ok(b"{}"))
            await writer.drain()

        srv = await asyncio.start_server(slow, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        pool = ConnectionPool(url)
        with pytest.raises(TimeoutError):
            await pool.post("/x", b"", timeout_s=0.2)
        after = await pool.post("/x", b"", timeout_s=5)
        pool.close()
        srv.close()
        return server.connections, after.status

    connections, status = asyncio.run(go())
    assert status == 200 and connections == 2


def test_a_connection_that_never_completes_its_handshake_times_out():
    """The timeout covers connecting too: a server that accepts TCP but never speaks TLS
    is a timeout (retried elsewhere), not a refusal, and many such requests each end."""
    async def go():
        accepted = []
        srv = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
        pool = ConnectionPool(f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}")
        outcomes = await asyncio.gather(*[pool.post("/x", b"", timeout_s=0.2)
                                          for _ in range(5)], return_exceptions=True)
        pool.close()
        srv.close()
        return outcomes

    outcomes = asyncio.run(go())
    assert all(type(o) is TimeoutError for o in outcomes), outcomes


def test_each_request_keeps_its_own_deadline():
    """Requests in flight together time out each at its own deadline: a slow answer fails
    only the request that waited too long."""
    async def go():
        async def serve(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            if b"/slow" in head:
                await asyncio.sleep(1.0)
            writer.write(_ok(b"{}"))
            await writer.drain()

        srv = await asyncio.start_server(serve, "127.0.0.1", 0)
        pool = ConnectionPool(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}")
        outcomes = await asyncio.gather(pool.post("/slow", b"", timeout_s=0.2),
                                        pool.post("/fast", b"", timeout_s=0.2),
                                        pool.post("/slow", b"", timeout_s=5),
                                        return_exceptions=True)
        pool.close()
        srv.close()
        return outcomes

    slow, fast, patient = asyncio.run(go())
    assert type(slow) is TimeoutError
    assert fast.status == 200 and patient.status == 200


def test_refused_and_garbage_answers_raise_errors_that_say_so():
    async def go():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        with pytest.raises(ConnectFailed, match="[Rr]efused"):
            await ConnectionPool(f"http://127.0.0.1:{port}").post("/x", b"")
        async with _Server(lambda n, req: b"SSH-2.0-OpenSSH\r\n\r\n") as url:
            with pytest.raises(ConnectionLost, match="not an HTTP answer"):
                await ConnectionPool(url).post("/x", b"", timeout_s=5)

    asyncio.run(go())


@pytest.mark.parametrize("url", ["ftp://h", "http://", "http://h:port", "http://h/v1?x=1"])
def test_bad_base_urls_are_refused_up_front(url):
    with pytest.raises(ValueError, match="URL|expected|query"):
        ConnectionPool(url)


def test_https_endpoints_verify_the_server_against_the_system_trust_store(tmp_path, monkeypatch):
    """TLS with a private CA, trusted the way a cluster would: ``SSL_CERT_FILE``."""
    trustme = pytest.importorskip("trustme")
    import ssl

    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_ok(b'{"tls": true}'))
        await writer.drain()
        writer.close()

    async def go(trusted: bool):
        if trusted:
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        else:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        try:
            return await ConnectionPool(f"https://localhost:{port}").post("/x", b"", 5)
        finally:
            srv.close()

    assert asyncio.run(go(True)).body == b'{"tls": true}'
    with pytest.raises(ConnectFailed, match="TLS failed|CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(go(False))
