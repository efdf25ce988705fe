"""The endpoint pool shared by the TGI and OpenAI-compatible back-ends.

Persistent connections per endpoint and event loop (``simpipe.inference.http.client``);
a per-endpoint semaphore (``max_concurrency``), least-loaded
endpoint choice with round-robin tie-breaks, fail-over (an endpoint that refuses
connections or times out ``DOWN_AFTER`` times in a row sits out ``DOWN_FOR_S``), retries
with exponential back-off and full jitter, and per-endpoint counters.

This is the hot path of a million-agent round, so each request costs one POST, one
``json.loads`` and one decode: no per-request tasks (a partition runs on a fixed set of
worker coroutines), no logging, URLs parsed once. A round's agents go through ``run_many``:
each distinct request is JSON-encoded once and an agent's body is that template with its
seed written in, and answers go into columns (``AnswerColumns``), not one object each.

Counters per endpoint: ``requests`` = HTTP attempts sent there, ``errors`` = attempts that
failed there (any reason), ``retries`` = failed attempts there that were tried again,
``marked_down`` = times it was taken out of the rotation (``DOWN_AFTER`` connection
failures or timeouts in a row), tokens and ``latency_s_sum`` from successes. Latency runs
from the first attempt leaving (after its wait for a slot under ``max_concurrency``) to the
answer, retries included: the time a server spent on the agent, as the embedded back-end
measures it, not the time the request queued in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simpipe.inference.answer_checks import MalformedAnswer
from simpipe.inference.base import (
    AnswerColumns,
    Backend,
    EndpointCounters,
    GenerationRequest,
    GenerationResult,
    answer_listener,
)
from simpipe.inference.http.client import (
    ConnectFailed,
    ConnectionPool,
    HttpError,
    ResponseTooLarge,
)
from simpipe.inference.http.endpoints import is_local
from simpipe.inference.settings import HttpSettings

#: Statuses worth another try: overload (429, 503), TGI's generation error (424),
#: server and gateway failures. Everything else 4xx is the request's fault.
RETRY_STATUS = frozenset({408, 424, 429, 500, 502, 503, 504})
DOWN_AFTER = 3  # consecutive connection failures / timeouts before an endpoint sits out
DOWN_FOR_S = 10.0  # how long it sits out before it is tried again

#: ``encode(request) -> (path, body)``; ``decode(json, headers) -> (text, tokens_in,
#: tokens_out, finish_reason)``, checked with ``simpipe.inference.answer_checks``. A decode
#: that raises one of DECODE_ERRORS (``MalformedAnswer`` is a ValueError; so is a body that
#: is not UTF-8 or not JSON) marks the answer malformed: that agent's error, no retry.
#: RecursionError is what ``json.loads`` raises for JSON nested thousands deep.
Encoder = Callable[[GenerationRequest], tuple[str, bytes]]
Decoder = Callable[[Any, Mapping[str, str]], tuple[str, int, int, str | None]]
DECODE_ERRORS = (KeyError, TypeError, IndexError, ValueError, AttributeError, RecursionError)
#: What sending one body came to: (text, tokens_in, tokens_out, latency_s, finish_reason,
#: endpoint, error); error is None for an answer, else text is None.
Outcome = tuple[str | None, int, int, float, str | None, str | None, str | None]
#: The seed a request is encoded with to find where its seed goes: above any real seed
#: (those are < 2**31), so the digits cannot be another number of the body.
SEED_SENTINEL = 7_355_608_123_456_789
#: The server's own words in an error are cut to this many characters.
MAX_SERVER_MESSAGE = 300
#: A run of this many characters of the API token is never shown (see ``redact``).
SECRET_RUN = 8


def api_token() -> str | None:
    """The bearer token: ``SIMPIPE_API_KEY``, else ``HF_TOKEN``, else none."""
    return os.environ.get("SIMPIPE_API_KEY") or os.environ.get("HF_TOKEN") or None


class _Endpoint:
    __slots__ = ("counters", "down_until", "fails", "index", "load", "local", "name")

    def __init__(self, url: str, index: int) -> None:
        self.name = url.rstrip("/")
        self.load = 0  # waiting for a slot + in flight, for least-loaded choice
        self.fails = 0  # consecutive connection failures / timeouts
        self.down_until = 0.0  # time.monotonic() before which it is skipped
        self.counters = EndpointCounters()
        self.index = index
        self.local = False  # on this node (see simpipe.inference.http.endpoints)


class _LoopState:
    """What must not cross event loops: connections and semaphores, one of each per endpoint."""

    __slots__ = ("conns", "sems")

    def __init__(self, conns: list[ConnectionPool], sems: list[asyncio.Semaphore]) -> None:
        self.conns = conns
        self.sems = sems


class EndpointPool:
    """Endpoints of one back-end, with load spreading, fail-over, retries and counters."""

    def __init__(self, settings: HttpSettings, token: str | None = None) -> None:
        if not settings.endpoints:
            raise ValueError("endpoints: at least one endpoint URL is needed")
        self._endpoints = [_Endpoint(url, i) for i, url in enumerate(settings.endpoints)]
        for ep in self._endpoints:
            ep.local = is_local(ep.name)
        # Only a mix of this node's and other nodes' servers needs the two-pass pick.
        self._has_remote = len({ep.local for ep in self._endpoints}) == 2
        self._max_concurrency = settings.max_concurrency
        self._max_body = settings.max_response_bytes
        self._timeout_s = settings.timeout_s
        self._retries = settings.retries
        self._backoff_s = settings.backoff_s
        self._backoff_max_s = settings.backoff_max_s
        self._token = token if token is not None else api_token()
        self._headers = {"Content-Type": "application/json"}
        if self._token:
            self._headers["Authorization"] = f"Bearer {self._token}"
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._rr = 0

    @property
    def capacity(self) -> int:
        """Requests this pool keeps in flight at most (per event loop)."""
        return self._max_concurrency * len(self._endpoints)

    def counters(self) -> dict[str, dict]:
        return {ep.name: ep.counters.as_dict() for ep in self._endpoints}

    def endpoint_counters(self) -> dict[str, EndpointCounters]:
        """The live counter objects (they keep changing while requests run)."""
        return {ep.name: ep.counters for ep in self._endpoints}

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            for old in [lp for lp in self._states if lp.is_closed()]:  # died without aclose
                del self._states[old]
            conns = [
                ConnectionPool(ep.name, self._headers, self._max_body) for ep in self._endpoints
            ]
            sems = [asyncio.Semaphore(self._max_concurrency) for _ in self._endpoints]
            state = self._states[loop] = _LoopState(conns, sems)
        return state

    async def run(
        self, requests: Sequence[GenerationRequest], encode: Encoder, decode: Decoder
    ) -> list[GenerationResult]:
        """One result per request, in order; never raises for a failed request."""
        results: list[GenerationResult | None] = [None] * len(requests)
        told = answer_listener()

        def job(i: int) -> tuple[str, bytes] | str:
            return _encoded(encode, requests[i])

        def store(i: int, o: Outcome) -> None:
            results[i] = GenerationResult(o[0], o[1], o[2], o[3],
                                          "ok" if o[6] is None else "error", o[6], o[4], o[5])
            if told is not None:
                told(1)

        await self._drive(len(requests), job, decode, store)
        return results  # type: ignore[return-value]

    async def run_many(self, distinct: Sequence[GenerationRequest], codes: np.ndarray,
                       seeds: np.ndarray, encode: Encoder, decode: Decoder) -> AnswerColumns:
        """One answer per agent ``i`` to ``distinct[codes[i]]`` with seed ``seeds[i]``.

        Each distinct request is encoded once, split around its seed (``seed_template``);
        an agent's body is that template with its seed written in. The requests go in runs
        of neighbouring prompts (``prompt_order``, ``_drive``).
        """
        n = len(codes)
        out = AnswerColumns(n)
        templates = [_template(encode, req) for req in distinct]
        code_of, seed_of = codes.tolist(), seeds.tolist()
        text, tokens_in, tokens_out = out.text, out.tokens_in, out.tokens_out
        latency, finish, error = out.latency_s, out.finish, out.error
        told = answer_listener()

        def job(i: int) -> tuple[str, bytes] | str:
            template = templates[code_of[i]]
            if type(template) is tuple:
                path, head, tail = template
                return path, b"%s%d%s" % (head, seed_of[i], tail)
            if template is None:  # an encoder that does not write the seed as "seed": N
                return _encoded(encode, dataclasses.replace(distinct[code_of[i]],
                                                            seed=seed_of[i]))
            return template  # why it cannot be encoded

        def store(i: int, o: Outcome) -> None:
            text[i], tokens_in[i], tokens_out[i], latency[i], finish[i], _, error[i] = o
            if told is not None:
                told(1)

        await self._drive(n, job, decode, store, prompt_order(distinct, codes))
        return out

    async def run_groups(self, groups: Sequence[list[int]],
                         job: Callable[[int], tuple[str, bytes] | str], decode: Decoder,
                         out: AnswerColumns) -> None:
        """One request per group of agents (``job(g)``: the body of group ``g``, asking for
        ``len(groups[g])`` samples); ``decode`` gives ``(texts, tokens_in, tokens_out,
        finishes)`` with one text and finish per sample, which go to the group's agents in
        order. Tokens are split over the group (whole tokens, sums exact), so column sums
        stay what the servers reported; a failed request is every member's error."""
        text, tokens_in, tokens_out = out.text, out.tokens_in, out.tokens_out
        latency, finish, error = out.latency_s, out.finish, out.error
        told = answer_listener()

        def store(g: int, o: Outcome) -> None:
            members = groups[g]
            texts, t_in, t_out, lat, fins, _, err = o
            k = len(members)
            if told is not None:
                told(k)
            if err is None and (len(texts) != k or len(fins) != k):  # type: ignore[arg-type]
                err = f"malformed answer: {len(texts)} choices for n = {k}"  # type: ignore[arg-type]
            for j, i in enumerate(members):
                latency[i] = lat
                if err is not None:
                    error[i] = err
                    continue
                text[i] = texts[j]  # type: ignore[index]
                finish[i] = fins[j]  # type: ignore[index]
                tokens_in[i] = t_in // k + (j < t_in % k)
                tokens_out[i] = t_out // k + (j < t_out % k)

        await self._drive(len(groups), job, decode, store)

    async def _drive(self, n: int, job: Callable[[int], tuple[str, bytes] | str],
                     decode: Decoder, store: Callable[[int, Outcome], None],
                     order: np.ndarray | None = None) -> None:
        """Send ``job(i)`` for every ``i < n`` on a fixed set of worker coroutines (no task
        per request) and ``store`` each outcome.

        ``order`` (a permutation of ``range(n)``): send in runs. The indices in this order
        are cut into one contiguous run per worker, and each worker sends its run one
        request after the other to one endpoint (``_send``'s ``prefer``). Neighbours in
        ``order`` (requests sorted by prompt) share the longest prefixes, and a server that
        caches per connection's slot (llama.cpp keeps one prompt per slot, vLLM and TGI a
        shared cache) then evaluates only what a prompt does not share with the one before
        it: measured on a llama.cpp server, 8 slots, 8 at a time, 92 ms a request instead
        of 188 ms in agent order (docs/benchmarks.md). A worker whose run is done takes the
        second half of the longest run left, so none waits while another has work.

        A llama.cpp server keeps one prompt per slot and gives a request the idle slot whose
        prompt shares the most with it, which is the slot the connection's previous request
        just left, provided a slot is idle when the request arrives: the connections of all
        processes together must not outnumber the server's slots (``max_concurrency``). With
        twice as many, a request waits for whichever slot frees first, most often one that
        held another persona (measured: 43 prompt tokens evaluated a request instead of 16,
        5.7 requests a second instead of 10.9; docs/shared-answers.md)."""
        if n == 0:
            return
        state = self._state()
        workers = min(n, self.capacity)

        async def send(i: int, prefer: int | None) -> None:
            sent = job(i)
            if type(sent) is str:
                store(i, (None, 0, 0, 0.0, None, None, sent))
            else:
                store(i, await self._send(state, sent[0], sent[1], decode, prefer))

        if order is None:
            todo = iter(range(n))  # shared by the workers: each takes the next index

            async def worker(_w: int) -> None:
                for i in todo:
                    await send(i, None)
        else:
            sequence = order.tolist()
            cuts = np.linspace(0, n, workers + 1).astype(int).tolist()
            runs = [[cuts[w], cuts[w + 1]] for w in range(workers)]  # [next, stop) each
            # The runs by what was left in each when last looked at. A run only shrinks, so
            # an entry whose length is still true is the longest run: finding it costs a few
            # heap steps, not a look at every run (thousands with many servers).
            left = [(lo - hi, w) for w, (lo, hi) in enumerate(runs)]
            heapq.heapify(left)

            def longest() -> int | None:
                while left:
                    stored, v = heapq.heappop(left)
                    size = runs[v][1] - runs[v][0]
                    if size == -stored and size >= 2:
                        return v
                    if size >= 2:
                        heapq.heappush(left, (-size, v))
                return None

            async def worker(w: int) -> None:
                run = runs[w]
                while True:
                    if run[0] >= run[1]:
                        v = longest()
                        if v is None:
                            return
                        victim = runs[v]
                        middle = (victim[0] + victim[1] + 1) // 2
                        run[0], run[1], victim[1] = middle, victim[1], middle
                        heapq.heappush(left, (middle - run[1], w))
                        heapq.heappush(left, (victim[0] - middle, v))
                    i = sequence[run[0]]
                    run[0] += 1
                    await send(i, w)

        if workers == 1:
            await worker(0)
        else:
            await asyncio.gather(*[worker(w) for w in range(workers)])

    def _pick(self, avoid: _Endpoint | None) -> _Endpoint:
        eps = self._endpoints
        n = len(eps)
        if n == 1:
            return eps[0]
        now = time.monotonic()
        start = self._rr
        self._rr = (start + 1) % n
        best = None
        for local_only in (True, False) if self._has_remote else (False,):
            # Servers on this node first while they have room; the others are the fall-back.
            for k in range(n):
                ep = eps[(start + k) % n]
                if ep is avoid or ep.down_until > now:
                    continue
                if local_only and not (ep.local and ep.load < self._max_concurrency):
                    continue
                if best is None or ep.load < best.load:
                    best = ep
            if best is not None:
                break
        if best is None:  # everything is down or avoided: try the one back soonest
            others = [ep for ep in eps if ep is not avoid] or eps
            best = min(others, key=lambda ep: ep.down_until)
        return best

    def _preferred(self, key: int) -> _Endpoint:
        """Endpoint ``key % endpoints`` unless it sits out after failures (then the usual
        pick): requests that share a prompt's prefix go where its cache is."""
        ep = self._endpoints[key % len(self._endpoints)]
        return ep if ep.down_until <= time.monotonic() else self._pick(None)

    def _other_up(self, ep: _Endpoint) -> bool:
        now = time.monotonic()
        return any(o is not ep and o.down_until <= now for o in self._endpoints)

    async def _send(self, state: _LoopState, path: str, body: bytes, decode: Decoder,
                    prefer: int | None = None) -> Outcome:
        """POST one body with retries and fail-over; its outcome, never an exception.
        ``prefer``: its first attempt goes to endpoint ``prefer % endpoints`` while that
        one is up (``_preferred``)."""
        t0 = 0.0  # set when the first attempt gets its slot
        ep = None
        error = ""
        for attempt in range(self._retries + 1):
            ep = self._pick(ep) if prefer is None or attempt else self._preferred(prefer)
            counters = ep.counters
            counters.requests += 1
            status = 0
            raw = b""
            headers: Mapping[str, str] = {}
            ep.load += 1
            try:
                async with state.sems[ep.index]:
                    if not t0:
                        t0 = time.perf_counter()
                    resp = await state.conns[ep.index].post(path, body, self._timeout_s)
                raw = resp.body
                status = resp.status
                headers = resp.headers
            except ResponseTooLarge as exc:
                # It answered (so it is up), but too much: the same request would only get
                # the same again.
                counters.errors += 1
                ep.fails = 0
                error = f"{exc} from {ep.name}"
                break
            except (HttpError, TimeoutError) as exc:
                error = _describe(exc, ep.name, self._timeout_s)
            finally:
                ep.load -= 1

            if status == 200:
                try:
                    text, tokens_in, tokens_out, finish = decode(json.loads(raw), headers)
                except DECODE_ERRORS as exc:
                    counters.errors += 1
                    error = f"malformed answer from {ep.name}: {_malformed(exc)}"
                    break
                ep.fails = 0
                latency = time.perf_counter() - t0
                counters.tokens_in += tokens_in
                counters.tokens_out += tokens_out
                counters.latency_s_sum += latency
                return text, tokens_in, tokens_out, latency, finish, ep.name, None

            counters.errors += 1
            if status == 0:
                ep.fails += 1
                if ep.fails >= DOWN_AFTER:
                    now = time.monotonic()
                    if ep.down_until <= now:  # requests failing together count it once
                        counters.marked_down += 1
                    ep.down_until = now + DOWN_FOR_S
            else:
                ep.fails = 0  # it answered: up, whatever it said
                error = error_text(status, raw, ep.name, self._token)
                if status not in RETRY_STATUS:
                    break
            if attempt == self._retries:
                break
            counters.retries += 1
            if status == 0 and self._other_up(ep):
                continue  # another endpoint can take it now; no reason to wait
            delay = random.uniform(0.0, min(self._backoff_max_s, self._backoff_s * 2**attempt))
            retry_after = headers.get("retry-after") if status else None
            # isdigit alone admits "²", which float() refuses; HTTP means ASCII digits.
            if retry_after and retry_after.isascii() and retry_after.isdigit():
                delay = max(delay, min(float(retry_after), self._backoff_max_s))
            if delay > 0:
                await asyncio.sleep(delay)
        # Belt and braces: error_text has already redacted the server's words; nothing
        # else built here contains the token.
        return (None, 0, 0, time.perf_counter() - t0 if t0 else 0.0, None,
                ep.name if ep is not None else None, redact(error, self._token))

    async def post_json(self, path: str, body: bytes, prefer: int | None = None) -> Any:
        """One POST with the pool's retries and fail-over (and counters); the answer's JSON.
        Raises ``RequestFailed`` with the reason when it fails. ``prefer``: see ``_send``."""
        outcome = await self._send(self._state(), path, body, _json_and_usage, prefer)
        if outcome[6] is not None:
            raise RequestFailed(outcome[6])
        return outcome[0]

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            for conns in state.conns:
                conns.close()


def prompt_order(distinct: Sequence[GenerationRequest], codes: np.ndarray) -> np.ndarray:
    """The agents (indices into ``codes``) ordered by their request's prompt text (its
    messages' for chat requests), agent order among equals: neighbours share the longest
    prefixes."""
    keys = [req.prompt if req.prompt is not None else json.dumps(list(req.messages or ()))
            for req in distinct]
    rank = np.empty(len(keys), np.int64)
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    return np.argsort(rank[np.asarray(codes, np.int64)], kind="stable")


class RequestFailed(RuntimeError):
    """A ``post_json`` request failed; the message says why."""


def _json_and_usage(data: Any, headers: Mapping[str, str]) -> tuple[Any, int, int, None]:
    """The whole JSON answer, with its ``usage`` token counts where it has them."""
    usage = data.get("usage") if type(data) is dict else None
    usage = usage if type(usage) is dict else {}
    t_in, t_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return (data, t_in if type(t_in) is int else 0, t_out if type(t_out) is int else 0, None)


def seed_template(encode: Encoder, req: GenerationRequest) -> tuple[str, bytes, bytes] | None:
    """``encode(req)`` split around its seed: with seed ``s`` the body is ``head + str(s) +
    tail``. None when the body does not hold the seed exactly once as ``"seed": N`` (text
    inside the prompt cannot match: JSON escapes its quotes)."""
    path, body = encode(dataclasses.replace(req, seed=SEED_SENTINEL))
    parts = body.split(b'"seed": %d' % SEED_SENTINEL)
    if len(parts) != 2:
        return None
    return path, parts[0] + b'"seed": ', parts[1]


def _template(encode: Encoder, req: GenerationRequest) -> tuple[str, bytes, bytes] | str | None:
    try:
        return seed_template(encode, req)
    except (ValueError, TypeError) as exc:
        return f"cannot encode request: {exc}"


def _encoded(encode: Encoder, req: GenerationRequest) -> tuple[str, bytes] | str:
    try:
        return encode(req)
    except (ValueError, TypeError) as exc:
        return f"cannot encode request: {exc}"


def _describe(exc: BaseException, endpoint: str, timeout_s: float | None) -> str:
    if isinstance(exc, TimeoutError):
        return f"timeout after {timeout_s:g} s at {endpoint}"
    if isinstance(exc, ConnectFailed):
        return f"cannot connect to {endpoint}: {exc}"
    return f"{type(exc).__name__} at {endpoint}: {exc}"


def _malformed(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    if isinstance(exc, MalformedAnswer):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def redact(text: str, secret: str | None) -> str:
    """``text`` with every run of ``SECRET_RUN`` or more characters of ``secret`` (the
    whole token, a prefix left by someone's cut, any other piece) replaced by ``***``."""
    if not secret or not text:
        return text
    if len(secret) <= SECRET_RUN:
        return text.replace(secret, "***")
    pieces = _pieces(secret)
    out = []
    start = i = 0
    end = len(text) - SECRET_RUN
    while i <= end:
        if text[i : i + SECRET_RUN] in pieces:
            j = i + SECRET_RUN
            while j < len(text) and text[i : j + 1] in secret:
                j += 1
            out.append(text[start:i])
            out.append("***")
            start = i = j
        else:
            i += 1
    out.append(text[start:])
    return "".join(out)


@functools.lru_cache(maxsize=4)
def _pieces(secret: str) -> frozenset[str]:
    return frozenset(secret[i : i + SECRET_RUN] for i in range(len(secret) - SECRET_RUN + 1))


def error_text(status: int, raw: bytes, endpoint: str, secret: str | None = None) -> str:
    """The server's own words: TGI ``{"error", "error_type"}``, OpenAI / llama.cpp /
    vLLM >= 0.8 ``{"error": {"message"}}``, older vLLM ``{"message"}``, FastAPI ``{"detail"}``;
    on one line, ``secret`` redacted and then cut to MAX_SERVER_MESSAGE characters."""
    try:
        msg = _server_message(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON, or nested too deep to load or show
        msg = None
    if msg is None:
        msg = raw[: 4 * MAX_SERVER_MESSAGE].decode("utf-8", "replace")
    # Redact before the final cut, so a cut through the token cannot leave a piece of it.
    # Cutting first to a window a few times longer keeps this cheap for a 1 MiB message:
    # a piece of the token that window leaves at its end is redacted like any other.
    msg = redact(" ".join(msg[: 4 * MAX_SERVER_MESSAGE].split()), secret)
    return f"HTTP {status} from {endpoint}: {msg[:MAX_SERVER_MESSAGE] or '(empty body)'}"


def _server_message(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or json.dumps(err))
    if isinstance(err, str):
        kind = data.get("error_type")
        return f"{kind}: {err}" if kind else err
    for key in ("message", "detail"):
        if key in data:
            return str(data[key])
    return None


class HttpBackend(Backend):
    """A back-end that is one ``EndpointPool`` plus a request encoder and answer decoder."""

    def __init__(self, settings: HttpSettings) -> None:
        self._pool = EndpointPool(settings)

    def _encode(self, req: GenerationRequest) -> tuple[str, bytes]:
        raise NotImplementedError

    def _decode(self, data: Any, headers: Mapping[str, str]) -> tuple[str, int, int, str | None]:
        raise NotImplementedError

    async def generate(self, requests: Sequence[GenerationRequest], *,
                       reproducible: bool = False) -> list[GenerationResult]:
        return await self._pool.run(requests, self._encode, self._decode)

    def counters(self) -> dict[str, dict]:
        return self._pool.counters()

    def endpoint_counters(self) -> dict[str, EndpointCounters]:
        """The live per-endpoint counters, e.g. to watch a batch in progress."""
        return self._pool.endpoint_counters()

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def generate_many(self, distinct: Sequence[GenerationRequest], codes: np.ndarray,
                            seeds: np.ndarray, *, reproducible: bool = False) -> AnswerColumns:
        # Servers batch as they like: ``reproducible`` cannot be honoured here.
        return await self._pool.run_many(distinct, codes, seeds, self._encode, self._decode)
