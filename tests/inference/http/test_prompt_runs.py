"""Per-agent requests over HTTP go in runs of neighbouring prompts, and a llama.cpp server
whose slots are not outnumbered by the connections keeps each run on one slot, so it
evaluates only what a prompt does not share with the one before it. Observed between the
back-end and a real llama.cpp server by a proxy that records each request and the server's
own count of prompt tokens it evaluated."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from simpipe.inference.base import GenerationRequest
from simpipe.inference.http.backend import prompt_order
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.settings import OpenAISettings
from simpipe.servers.llamacpp_server import LlamaCppProcess

RULES = ("You are playing a number-guessing game with other players. Every player chooses a "
         "number between 0 and 100 (inclusive). The target is 2/3 of the average of all "
         "chosen numbers. The player whose number is closest to the target wins.\n\n")
PERSONAS = ("a farmer", "a nurse", "a physicist", "a teacher", "a student")
# Long and shared, but after the persona: a request whose slot last held another persona
# evaluates it again.
MIDDLE = ("\n\nThe game lasts 5 rounds; after each round the winning number is announced. "
          "Think about what the others will choose, and about what they think you will "
          "choose. Winning numbers of rounds 1 to 2: 26.09, 24.77.\n\nRound 3 of 5.\n")


def _prompts() -> list[str]:
    rng = np.random.default_rng(7)
    return [f"{RULES}You are {PERSONAS[i % 5]}.{MIDDLE}Your numbers in rounds 1 to 2: "
            f"{rng.integers(0, 60)}, {rng.integers(0, 60)}.\nMy number:" for i in range(40)]


class _Recorder(ThreadingHTTPServer):
    """Forwards each POST to ``upstream`` and keeps (body, the server's timings and usage)."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.seen: list[tuple[dict, dict]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Forward)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # http.server calls it by this name
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        server: _Recorder = self.server  # type: ignore[assignment]
        request = urllib.request.Request(server.upstream + self.path, raw,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = resp.read()
        with server.lock:
            reply = json.loads(answer)
            server.seen.append((json.loads(raw), {**reply.get("timings", {}),
                                                  **reply.get("usage", {})}))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def recorded():
    with LlamaCppProcess(parallel=4) as llama:
        proxy = _Recorder(llama.url)
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        try:
            yield proxy
        finally:
            proxy.shutdown()
            proxy.server_close()


def _play(url: str, prompts: list[str], codes: np.ndarray, first_seed: int = 0,
          connections: int = 2) -> list:
    distinct = [GenerationRequest(prompt=p, max_tokens=2) for p in prompts]

    async def go():
        backend = OpenAIBackend(OpenAISettings(endpoints=[url], max_concurrency=connections,
                                               answer_distributions="llamacpp"))
        try:
            seeds = np.arange(first_seed, first_seed + len(codes), dtype=np.int64)
            return await backend.generate_many(distinct, codes, seeds)
        finally:
            await backend.aclose()

    return asyncio.run(go()).error


def test_prompt_order_sorts_agents_by_their_prompt_and_keeps_agent_order_among_equals():
    distinct = [GenerationRequest(prompt=p) for p in ("b", "a", "c")]
    codes = np.array([2, 0, 1, 0, 1])
    assert prompt_order(distinct, codes).tolist() == [2, 4, 1, 3, 0]


@pytest.mark.llm
def test_runs_of_sorted_prompts_keep_their_slots_and_the_server_evaluates_only_suffixes(
        recorded):
    # Two back-ends at once, as two Dask workers' partitions would be, with 2 connections
    # each: as many as the server has slots, so each request finds the slot its
    # connection's previous request left idle, holding that request's prompt, and llama.cpp
    # gives it that slot (the idle slot sharing the longest prefix).
    prompts = _prompts()
    codes = np.random.default_rng(3).permutation(np.repeat(np.arange(40), 2))  # agent order
    halves = (codes[:40], codes[40:])
    with ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(lambda h: _play(recorded.url, prompts, halves[h],
                                               first_seed=1000 * h), range(2)))
    assert errors == [[None] * 40] * 2
    seen = recorded.seen[-80:]
    assert sorted(b["prompt"] for b, _ in seen) == sorted(prompts[c] for c in codes)
    # What the server evaluated: the last line of most prompts, the persona and the middle
    # where a run passes from one persona to the next (measured: 41 and 47 of 150 tokens a
    # request in two runs of this test; with 4 connections each, twice the slots, 56 and
    # 89: a request then waits for whichever slot frees first, often one that last held
    # another persona).
    whole = np.mean([t["prompt_tokens"] for _, t in seen])
    evaluated = [t["prompt_n"] for _, t in seen]
    assert whole > 90 and np.mean(evaluated) < 0.4 * whole, evaluated
