"""A fast stand-in inference server that follows the published contracts and answers at once.

TGI: ``POST /generate``, ``POST /generate_stream``, ``POST /``, ``GET /health``, ``GET /info``;
OpenAI: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``. Requests,
answers and their validation are ``simpipe.servers.contract``'s, which the GPU
emulator (``simpipe.servers.emulator``) shares; this server just answers at once.

For tests: ``fail_first``/``fail_status`` (the first K generation requests get that
status), ``delay_s`` (every generation waits first: overload or client timeouts),
``max_concurrent`` (beyond it: 429 "Model is overloaded", as TGI), and ``bodies`` (the
last ``record`` request bodies with their path and Authorization header).

HTTP comes from ``simpipe.servers.http``. In-process: ``async with
StubServer(...) as stub: stub.url``. As a process:
``python -m simpipe.servers.stub --port N`` (or ``StubProcess`` in Python,
a ``simpipe.servers.process.ServerProcess``), which prints
``simpipe-stub-server listening on http://127.0.0.1:N`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Self

from simpipe.core import aio
from simpipe.servers import contract as contract
from simpipe.servers.http import HttpRequest, HttpResponse, HttpServer
from simpipe.servers.process import ServerProcess

READY_LINE = "simpipe-stub-server listening on"
MODEL_ID = "simpipe/stub"


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


class StubServer:
    """The stub in this process's event loop on 127.0.0.1 (port 0: a free one)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", **config: Any) -> None:
        self.host = host
        self.port = port
        self.config = StubConfig(**config)
        self.in_flight = 0
        self.served = 0  # generation requests seen, failures included
        self._http: HttpServer | None = None
        self._gets = {"/health": self._health, "/info": self._info, "/v1/models": self._models}

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

    def _dispatch(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        routed = contract.route(request, self._gets)
        if isinstance(routed, HttpResponse):
            return routed
        kind, style, body = routed
        refusal = self._admit(request, body)
        if refusal is not None:
            return refusal
        if self.config.delay_s > 0:
            # Counted from admission (not from when the task first runs), so that requests
            # arriving together see each other: that is what makes a 429 under overload.
            self.in_flight += 1
            task = asyncio.ensure_future(self._later(kind, style, body))
            task.add_done_callback(self._release)
            return task
        return self._answer(kind, style, body)

    def _release(self, _: asyncio.Future) -> None:
        self.in_flight -= 1

    def _admit(self, request: HttpRequest, body: Any) -> HttpResponse | None:
        """Record the body; apply injected failures and overload."""
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
            kind = "overloaded" if status == 429 else "generation" if status == 424 else "server"
            return contract.json_response({"error": "injected failure", "error_type": kind},
                                          status)
        if self.in_flight >= cfg.max_concurrent:
            return contract.overloaded()
        return None

    @staticmethod
    def _answer(kind: str, style: str, body: Any) -> HttpResponse:
        try:
            return contract.render(contract.parse(kind, body))
        except contract.Invalid as exc:
            return contract.error_response(style, str(exc), exc.param)

    async def _later(self, kind: str, style: str, body: Any) -> HttpResponse:
        await asyncio.sleep(self.config.delay_s)
        return self._answer(kind, style, body)

    def _health(self) -> HttpResponse:
        return HttpResponse(200)

    def _info(self) -> HttpResponse:
        return contract.json_response(
            contract.tgi_info(self.config.max_concurrent, MODEL_ID, "3.3.7-simpipe-stub"))

    def _models(self) -> HttpResponse:
        return contract.json_response(contract.models_list(MODEL_ID, "simpipe-stub"))


class StubProcess(ServerProcess):
    """The stub in a child process (for benchmarks: its CPU is not the client's), on
    ``port`` (0: a free one); ``options`` are ``StubConfig``'s."""

    def __init__(self, port: int = 0, **options: Any) -> None:
        command = [sys.executable, "-m", "simpipe.servers.stub", "--port", str(port)]
        for key, value in options.items():
            command += [f"--{key.replace('_', '-')}", str(value)]
        super().__init__(command, READY_LINE, name="stub server", stop_timeout_s=5)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m simpipe.servers.stub", description=__doc__
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
