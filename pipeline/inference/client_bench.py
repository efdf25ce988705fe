"""How much client CPU the HTTP back-ends spend per request, against a stub that answers
at once (in its own process, so its CPU is not counted as ours).

Rows: a bare ``aiohttp.ClientSession.post`` loop (the floor), then ``TgiBackend`` and
``OpenAIBackend`` through ``generate`` (the code path the pipeline uses), same requests,
same number in flight. ``overhead_x`` is client CPU per request relative to the bare loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
from simpipe.inference.base import Backend, GenerationRequest, OutputConstraint
from simpipe.inference.stub_server import StubProcess

COLUMNS = (
    "client",
    "requests",
    "concurrency",
    "wall_s",
    "requests_per_s",
    "cpu_s_per_1k",
    "overhead_x",
    "errors",
)
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


async def _raw(url: str, reqs: Sequence[GenerationRequest], concurrency: int) -> int:
    """The floor: one shared session, ``post(json=...)``, ``json.loads`` of the answer."""
    errors = 0
    todo = iter(reqs)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal errors
            for r in todo:
                body = {
                    "inputs": r.prompt,
                    "parameters": {"max_new_tokens": r.max_tokens, "seed": r.seed, "details": True},
                }
                async with session.post(url + "/generate", json=body) as resp:
                    data = json.loads(await resp.read())
                    if resp.status != 200 or "generated_text" not in data:
                        errors += 1

        await asyncio.gather(*[worker() for _ in range(concurrency)])
    return errors


def _backend(protocol: str, url: str, concurrency: int) -> Backend:
    if protocol == "tgi":
        from simpipe.inference.settings import TgiSettings
        from simpipe.inference.tgi import TgiBackend

        return TgiBackend(TgiSettings(endpoints=[url], max_concurrency=concurrency))
    if protocol == "openai":
        from simpipe.inference.openai_compat import OpenAIBackend
        from simpipe.inference.settings import OpenAISettings

        return OpenAIBackend(OpenAISettings(endpoints=[url], max_concurrency=concurrency))
    raise ValueError(f"protocol: unknown {protocol!r}; allowed: 'tgi', 'openai'")


async def _through(backend: Backend, reqs: Sequence[GenerationRequest]) -> int:
    results = await backend.generate(reqs)
    return sum(r.status != "ok" for r in results)


async def _measure(run: Callable[[], Coroutine[Any, Any, int]]) -> tuple[float, float, int]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    errors = await run()
    return time.perf_counter() - t0, time.process_time() - cpu0, errors


def run_client_bench(
    n_requests: int, protocols: Sequence[str] = ("tgi", "openai"), concurrency: int = 64
) -> list[dict]:
    """Send ``n_requests`` per client (bare aiohttp, then each protocol) to a stub server
    process; one row per client with the ``COLUMNS`` keys."""
    if n_requests < 1:
        raise ValueError("n_requests must be at least 1")
    reqs = _requests(n_requests)
    warm = _requests(min(500, n_requests))
    rows: list[dict] = []

    async def bench(url: str) -> None:
        await _raw(url, warm, concurrency)
        wall, cpu, errors = await _measure(lambda: _raw(url, reqs, concurrency))
        rows.append(_row("aiohttp (raw)", n_requests, concurrency, wall, cpu, errors))
        for protocol in protocols:
            backend = _backend(protocol, url, concurrency)
            try:
                await _through(backend, warm)
                wall, cpu, errors = await _measure(lambda b=backend: _through(b, reqs))
            finally:
                await backend.aclose()
            rows.append(_row(protocol, n_requests, concurrency, wall, cpu, errors))

    with StubProcess(max_concurrent=max(128, concurrency), record=1) as stub:
        _run_loop(bench(stub.url))
    floor = rows[0]["cpu_s_per_1k"] or 1e-9
    for row in rows:
        row["overhead_x"] = round(row["cpu_s_per_1k"] / floor, 2)
    return rows


def _row(client: str, n: int, concurrency: int, wall: float, cpu: float, errors: int) -> dict:
    return {
        "client": client,
        "requests": n,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests_per_s": round(n / wall, 1),
        "cpu_s_per_1k": round(cpu / n * 1000, 4),
        "overhead_x": 1.0,
        "errors": errors,
    }


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    # The pipeline's workers run on uvloop when it is installed; measure what they run.
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def format_table(rows: Sequence[dict]) -> str:
    """The rows as a fixed-width text table."""
    cells = [list(COLUMNS)] + [[str(row.get(c, "")) for c in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
