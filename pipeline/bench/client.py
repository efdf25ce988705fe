"""How much client CPU the HTTP back-ends spend per request, against a stub that answers
at once (in its own process, so its CPU is not counted as ours).

Rows: a bare ``aiohttp.ClientSession.post`` loop (the reference: docs/measurements.md), a bare
loop on our own keep-alive client (``simpipe.inference.http.client.ConnectionPool``, the
floor), then ``TgiBackend`` and ``OpenAIBackend`` through ``generate`` (the code path the pipeline
uses): same requests, same number in flight. ``x_aiohttp`` is client CPU per request
relative to the bare aiohttp loop; ``server_cpu_s_per_1k`` is the server's, which shares
the machine and bounds requests/s when it is the larger of the two. The last rows send the
back-ends' requests to the GPU emulator (one GPU, ``fast`` profile): its server CPU per
request is what an emulated fleet costs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
import psutil

from simpipe.agents.registry import build_backend
from simpipe.config.model import AgentsConfig
from simpipe.core import aio
from simpipe.core.tables import markdown_table
from simpipe.inference.base import Backend, GenerationRequest, OutputConstraint
from simpipe.inference.http.client import ConnectionPool
from simpipe.servers.emulator import EmulatorProcess
from simpipe.servers.stub import StubProcess

FORMATS = {
    "wall_s": "{:.2f}",
    "requests_per_s": "{:,.0f}",
    "cpu_s_per_1k": "{:.3f}",
    "server_cpu_s_per_1k": "{:.3f}",
    "x_aiohttp": "{:.2f}",
}
_PROMPT = (
    "You are a 34-year-old economist with a Master's degree. You take part in a game: every "
    "player picks a number between 0 and 100; the winner is closest to 2/3 of the average. "
    "Round {i}. Your number:"
)
_CONSTRAINT = OutputConstraint(
    gbnf='root ::= "100" | [1-9] [0-9] | [0-9]', regex="(100|[1-9]?[0-9])"
)


def _requests(n: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            prompt=_PROMPT.format(i=i % 5), seed=i, max_tokens=4, constraint=_CONSTRAINT
        )
        for i in range(n)
    ]


def _tgi_body(r: GenerationRequest) -> bytes:
    return json.dumps(
        {
            "inputs": r.prompt,
            "parameters": {"max_new_tokens": r.max_tokens, "seed": r.seed, "details": True},
        }
    ).encode()


async def _bare_loop(
    post: Callable[[bytes], Coroutine[Any, Any, tuple[int, bytes]]],
    reqs: Sequence[GenerationRequest],
    concurrency: int,
) -> int:
    """``concurrency`` coroutines taking the next request: encode, POST, ``json.loads``."""
    errors = 0
    todo = iter(reqs)

    async def worker() -> None:
        nonlocal errors
        for r in todo:
            status, raw = await post(_tgi_body(r))
            if status != 200 or "generated_text" not in json.loads(raw):
                errors += 1

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return errors


async def _aiohttp_loop(url: str, reqs: Sequence[GenerationRequest], concurrency: int) -> int:
    """The reference: one shared session, ``post``, ``read``."""
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post(body: bytes) -> tuple[int, bytes]:
            async with session.post(url + "/generate", data=body, headers=headers) as resp:
                return resp.status, await resp.read()

        return await _bare_loop(post, reqs, concurrency)


async def _pool_loop(url: str, reqs: Sequence[GenerationRequest], concurrency: int) -> int:
    """The floor: the back-ends' own transport without their bookkeeping."""
    pool = ConnectionPool(url, {"Content-Type": "application/json"})
    try:

        async def post(body: bytes) -> tuple[int, bytes]:
            resp = await pool.post("/generate", body)
            return resp.status, resp.body

        return await _bare_loop(post, reqs, concurrency)
    finally:
        pool.close()


def _backend(protocol: str, url: str, concurrency: int) -> Backend:
    section = {"endpoints": [url], "max_concurrency": concurrency}
    return build_backend(AgentsConfig.model_validate({"backend": protocol, protocol: section}))


async def _through(backend: Backend, reqs: Sequence[GenerationRequest]) -> int:
    results = await backend.generate(reqs)
    return sum(r.status != "ok" for r in results)


def run_client_bench(
    n_requests: int, protocols: Sequence[str] = ("tgi", "openai"), concurrency: int = 64,
    emulator: bool = True,
) -> list[dict]:
    """Send ``n_requests`` per client (the two bare loops, then each protocol's back-end)
    to a stub server process, then each protocol's back-end to a one-GPU emulator process
    with the ``fast`` profile (its server CPU per request is the emulator's cost); one row
    per client and server."""
    if n_requests < 1:
        raise ValueError("n_requests must be at least 1")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    reqs = _requests(n_requests)
    warm = _requests(min(500, n_requests))
    rows: list[dict] = []

    async def measure(server: psutil.Process, server_name: str, client: str,
                      run: Callable[[Sequence[GenerationRequest]], Coroutine[Any, Any, int]]
                      ) -> None:
        await run(warm)  # connections open, code paths hot
        server_cpu0 = sum(server.cpu_times()[:2])
        cpu0, t0 = time.process_time(), time.perf_counter()
        errors = await run(reqs)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server_cpu = sum(server.cpu_times()[:2]) - server_cpu0
        rows.append(
            {
                "client": client,
                "server": server_name,
                "requests": n_requests,
                "concurrency": concurrency,
                "wall_s": wall,
                "requests_per_s": n_requests / wall,
                "cpu_s_per_1k": cpu / n_requests * 1000,
                "server_cpu_s_per_1k": server_cpu / n_requests * 1000,
                "x_aiohttp": 1.0,
                "errors": errors,
            }
        )

    async def backends(server: psutil.Process, server_name: str, url: str) -> None:
        for protocol in protocols:
            backend = _backend(protocol, url, concurrency)
            try:
                await measure(server, server_name, f"{protocol} back-end",
                              lambda rs, b=backend: _through(b, rs))
            finally:
                await backend.aclose()

    with StubProcess(max_concurrent=max(128, concurrency), record=1) as stub:
        server = psutil.Process(stub.proc.pid)  # type: ignore[union-attr]

        async def bench(url: str) -> None:
            await measure(server, "stub", "aiohttp, bare loop",
                          lambda rs: _aiohttp_loop(url, rs, concurrency))
            await measure(server, "stub", "http_client, bare loop",
                          lambda rs: _pool_loop(url, rs, concurrency))
            await backends(server, "stub", url)

        # The pipeline's workers run on uvloop when it is installed; measure what they run.
        aio.run(bench(stub.url))
    if emulator:
        with EmulatorProcess(gpus=1, profile="fast") as emu:
            server = psutil.Process(emu.proc.pid)  # type: ignore[union-attr]
            aio.run(backends(server, "emulator, fast profile", emu.urls[0]))
    reference = rows[0]["cpu_s_per_1k"] or 1e-9
    for row in rows:
        row["x_aiohttp"] = row["cpu_s_per_1k"] / reference
    return rows


def format_table(rows: Sequence[dict]) -> str:
    return markdown_table(rows, FORMATS)
