"""The timing model of one emulated GPU server: continuous batching in modelled time.

Pure and clock-free: the caller says what time it is (``advance(now)``, ``submit(now, ...)``)
in modelled seconds, so tests drive it with a virtual clock and the server with the event
loop's clock times the time scale. Work is per event, not per decode step: between two
events (an admission or a completion) every step has the same batch and length, so a run of
them is one multiplication. A request that arrives during a step joins at the next step
boundary; steps are computed when they have ended, so their admissions are exact.

A request may decode several samples of one prompt (OpenAI's ``n``): its prompt is
prefilled once and its ``width`` sequences take that many places in the batch until the
longest one ends (a shorter sample's place is not given back early: a slight overestimate
for samples of unequal length).

Prefix caching (``GpuProfile.prefix_caching``, vLLM V1's automatic prefix caching): a request
carries the keys of its prompt's whole blocks (``prefix_blocks``: ``block_size`` tokens each,
keyed by a hash of every token up to the block's end, the block holding the last prompt
token left out). When it is admitted it reuses the leading blocks that are in the GPU's
``PrefixCache`` (or that a request admitted in the same step brings: vLLM's scheduler caches
a block when it allocates it) and is charged prefill only for its other tokens, at least
one; then its blocks become the most recently used. The cache holds ``kv_cache_tokens`` less
what the running sequences' generated tokens take, and evicts least recently used blocks
beyond that (a prompt's deeper blocks before its first ones, as vLLM frees them).

Counters (modelled seconds): ``busy_s`` is the time with at least one running sequence;
``work_s`` is what the completed requests would have cost on a full batch
(``GpuProfile.full_batch_request_s``: prefill of the tokens not served from the cache, and
decode), the GPU time a perfectly fed server needs for them; ``tokens_cached``: prompt
tokens served from the prefix cache.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from simpipe.servers.emulator_profiles import GpuProfile


class Done(NamedTuple):
    """A finished request: its handle and when it queued, started and finished."""

    handle: Any
    arrived_s: float
    started_s: float
    finished_s: float


class _Plan(NamedTuple):
    start: float  # when the next step begins
    admit: int  # requests admitted in its first step (then steps == 1)
    prefill_tokens: int
    step_s: float  # the length of each step
    steps: int  # steps until something changes (a completion or a possible admission)
    evaluated: tuple[int, ...] = ()  # per admitted request: prompt tokens not from the cache


def prefix_blocks(ids: Sequence[int], block: int) -> tuple[int, ...]:
    """The keys of a prompt's cacheable blocks: each whole block of ``block`` token ids
    before the prompt's last token, keyed by a hash of every id up to its end (the key of
    the block before and its own ids), as vLLM keys its blocks. Python hashes tuples of
    ints alike in every process."""
    if block <= 0:
        return ()
    keys = []
    key = 0
    for i in range((len(ids) - 1) // block):
        key = hash((key, tuple(ids[i * block:(i + 1) * block])))
        keys.append(key)
    return tuple(keys)


class PrefixCache:
    """One GPU's cached prompt blocks by key, least recently used first, at most
    ``capacity`` blocks (less what running sequences hold: ``store``'s ``room``)."""

    def __init__(self, block: int, capacity: int) -> None:
        self.block = block
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def hits(self, keys: tuple[int, ...], pending: set[int] | None = None) -> int:
        """How many leading blocks of ``keys`` are cached, or in ``pending`` (the blocks
        of requests admitted earlier in the same step)."""
        blocks = self._blocks
        n = 0
        for key in keys:
            if key not in blocks and (pending is None or key not in pending):
                break
            n += 1
        return n

    def store(self, keys: tuple[int, ...], room: int) -> None:
        """A request with these blocks was admitted: each becomes the most recently used,
        its first block last (so a prompt's deeper blocks are evicted before its prefix);
        then the least recently used blocks go until at most ``room`` remain."""
        blocks = self._blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
        while len(blocks) > max(room, 0):
            blocks.popitem(last=False)
            self.evicted += 1


class GpuScheduler:
    """One GPU: a FIFO queue, at most ``max_batch`` running sequences, one step at a time."""

    def __init__(self, profile: GpuProfile) -> None:
        self.profile = profile
        self.clock = 0.0  # end of the last computed step
        self.steps = 0  # steps computed so far
        # running: (finish step, sequence no, handle, tokens in, tokens out (all samples),
        # arrived, started, width, tokens evaluated, cache blocks held by its output)
        self._running: list[tuple] = []
        # waiting: (arrived, sequence no, handle, tokens in, steps, width, tokens out,
        # prompt block keys)
        self._queue: deque[tuple] = deque()
        self._seqs = 0  # sequences in the batch: the running requests' widths
        self._seq = 0
        self._cost = profile.cost_model()  # what work_s charges each finished request
        self.cache = (PrefixCache(profile.block_size, profile.kv_cache_tokens // profile.block_size)
                      if profile.prefix_caching else None)
        self._held = 0  # cache blocks the running sequences' generated tokens take
        self.tokens_cached = 0
        self.admitted = 0
        self.rejected = 0
        self.completed = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.busy_s = 0.0
        self.work_s = 0.0
        self.queue_wait_s = 0.0  # summed over started requests
        self.max_running = 0
        self.max_queued = 0

    @property
    def running(self) -> int:
        """Sequences in the batch (a request with ``n`` samples counts ``n``)."""
        return self._seqs

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, now: float, handle: Any, tokens_in: int, tokens_out: int,
               width: int = 1, total_out: int | None = None,
               blocks: tuple[int, ...] = ()) -> bool:
        """Queue a request arriving at ``now``; False (refused) beyond
        ``max_concurrent_requests`` running + waiting. ``width`` samples of the prompt,
        the longest ``tokens_out`` tokens, ``total_out`` tokens in all (default: width x
        tokens_out); ``blocks``: its prompt's block keys (``prefix_blocks``), for the
        prefix cache."""
        if len(self._running) + len(self._queue) >= self.profile.max_concurrent_requests:
            self.rejected += 1
            return False
        self._seq += 1
        steps = max(1, tokens_out)
        total = max(width, total_out if total_out is not None else steps * width)
        self._queue.append((now, self._seq, handle, max(1, tokens_in), steps, width, total,
                            blocks if self.cache is not None else ()))
        self.admitted += 1
        self.max_queued = max(self.max_queued, len(self._queue))
        return True

    def _plan(self) -> _Plan | None:
        """The next run of equal steps from the current state, if there is work."""
        running, queue, p = self._running, self._queue, self.profile
        if running:
            start = self.clock
        elif queue:
            start = max(self.clock, queue[0][0])
        else:
            return None
        room = p.max_batch - self._seqs
        admit = tokens = width = 0
        evaluated: list[int] = []
        if queue and queue[0][0] <= start:
            budget = p.max_batch_prefill_tokens
            cache = self.cache
            pending: set[int] | None = None
            for arrived, _, _, n_in, _, w, _, blocks in queue:
                if arrived > start:
                    break
                new = n_in
                if blocks:  # (only with a cache) what it does not find there is evaluated
                    new = max(1, n_in - cache.hits(blocks, pending) * cache.block)  # type: ignore[union-attr]
                if admit and (width + w > room or tokens + new > budget):
                    break
                # wider than the room: it waits, or runs alone on an idle GPU
                if not admit and w > room and running:
                    break
                admit += 1
                width += w
                tokens += new
                evaluated.append(new)
                if blocks:
                    if pending is None:
                        pending = set()
                    pending.update(blocks)
        if admit:
            step = p.step_s(self._seqs + width) + tokens * p.prefill_s_per_token
            return _Plan(start, admit, tokens, step, 1, tuple(evaluated))
        step = p.step_s(self._seqs)
        steps = running[0][0] - self.steps + 1  # until the first running sequence finishes
        if queue and room > 0:  # the next arrival joins at the first boundary after it
            steps = min(steps, max(1, math.ceil((queue[0][0] - start) / step)))
        return _Plan(start, 0, 0, step, steps)

    def next_event_s(self) -> float | None:
        """When the next completion or admission happens if nothing else arrives."""
        plan = self._plan()
        return None if plan is None else plan.start + plan.step_s * plan.steps

    def advance(self, now: float) -> list[Done]:
        """Compute every step that has ended by ``now``; the requests that finished."""
        done: list[Done] = []
        running, queue = self._running, self._queue
        while (plan := self._plan()) is not None:
            if plan.admit:
                if plan.start + plan.step_s > now:
                    break
                cache = self.cache
                for new in plan.evaluated:
                    arrived, seq, handle, n_in, steps_out, width, n_out, blocks = queue.popleft()
                    held = 0
                    if cache is not None:
                        held = width * -(-steps_out // cache.block)
                        if blocks:
                            cache.store(blocks, cache.capacity - self._held - held)
                        self._held += held
                    heapq.heappush(running, (self.steps + steps_out - 1, seq, handle, n_in,
                                             n_out, arrived, plan.start, width, new, held))
                    self._seqs += width
                    self.queue_wait_s += plan.start - arrived
                self.max_running = max(self.max_running, self._seqs)
                steps = 1
            else:
                # (the epsilon: ``now`` taken from next_event_s() must reach that step's end)
                steps = min(plan.steps, int((now - plan.start) / plan.step_s + 1e-9))
                if steps <= 0:
                    break
            self.clock = plan.start + plan.step_s * steps
            self.steps += steps
            self.busy_s += plan.step_s * steps
            while running and running[0][0] < self.steps:
                (_, _, handle, n_in, n_out, arrived, started, width, new,
                 held) = heapq.heappop(running)
                self._seqs -= width
                self._held -= held
                self.completed += 1
                self.tokens_in += n_in
                self.tokens_out += n_out
                self.tokens_cached += n_in - new
                self.work_s += self._cost.request_cost_s(n_in, n_out, n_in - new)
                done.append(Done(handle, arrived, started, self.clock))
        return done

    def counters(self) -> dict[str, float | int]:
        return {
            "requests": self.admitted,
            "rejected": self.rejected,
            "completed": self.completed,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_cached": self.tokens_cached,
            "cache_blocks": len(self.cache) if self.cache is not None else 0,
            "cache_evicted": self.cache.evicted if self.cache is not None else 0,
            "busy_s": self.busy_s,
            "work_s": self.work_s,
            "queue_wait_s": self.queue_wait_s,
            "steps": self.steps,
            "running": self._seqs,
            "queued": len(self._queue),
            "max_running": self.max_running,
            "max_queued": self.max_queued,
        }


class Series:
    """A bounded time series: when ``max_rows`` is reached every other row is dropped and
    only every second later sample is kept, so a run of any length fits with even spacing."""

    def __init__(self, max_rows: int = 10_000) -> None:
        self.max_rows = max_rows
        self.rows: list[tuple] = []
        self.stride = 1
        self._seen = 0

    def add(self, row: tuple) -> None:
        if self._seen % self.stride == 0:
            self.rows.append(row)
            if len(self.rows) >= self.max_rows:
                self.rows = self.rows[::2]
                self.stride *= 2
        self._seen += 1
