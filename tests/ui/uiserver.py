"""Helpers shared by the UI tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import asyncio
import http.client
import threading
from pathlib import Path

from aiohttp import web

from simpipe.ui.app import make_app


class ServerThread:
    """The real aiohttp app on 127.0.0.1:<free port>, in a thread of the test process (so a
    monkeypatched SIMPIPE_HOME reaches it)."""

    def __init__(self, results: Path, token: str | None = None, loopback_only: bool = True):
        self.results, self.token, self.loopback_only = results, token, loopback_only
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the UI server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = make_app(self.results, token=self.token, loopback_only=self.loopback_only)
        runner = web.AppRunner(app, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()


def raw_request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with the path sent byte for byte (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        headers = headers or {}
        conn.putrequest(method, path, skip_accept_encoding=True,
                        skip_host=any(k.lower() == "host" for k in headers))
        for key, value in headers.items():
            conn.putheader(key, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
