"""Exact answer-logit probes of several prompts evaluated together, in fixed batches.

The serial chain (``HiddenStateEngine.chain``) evaluates one prompt at a time: a distinct
prompt's last line (~16 tokens) as one small decode, then each answer-tree probe as a
one-token decode of its own. ``BatchEngine`` evaluates a list of prompts in groups of
``GROUP`` in list order, a group's prompts together in one llama.cpp context with a
sequence per prompt and one key/value pool for all (``kv_unified``):

1. the group's prompts as one token trie in one decode: a token that several prompts share
   (the rules, the persona, the announced numbers) is decoded once, with all their sequence
   ids, and what the first prompt shares with the previous group's last is copied from
   cells that group left (the carry sequence), so each prompt costs the tokens in which it
   differs from its predecessor, as in the chain; the last token of each prompt is an
   output, and its row of the last hidden state (``result_norm``, read by the graph
   callback as in ``hidden``) answers the prompt's root probe; after it, the answer's
   likely first token (``_Pipeline.lookahead``) as one more output, whose row answers the
   probe of that token without a decode of its own;
2. the probes in lockstep: each prompt's work (a tree walked lazily, or a full tree) runs
   in a thread of its own whose probes wait until every other prompt of the group still
   working has asked its next probe or finished; then one decode answers them all, one
   output row per sequence, and the threads go on. The next step depends only on the
   answers, so which probes share a decode is a function of the prompts and the work alone;
3. ``SHORT_WALK_IN_FLIGHT`` groups in the pool at once, up to ``IN_FLIGHT`` while the
   oldest has been there for ``LONG_WALK`` decodes (``_Pipeline``): each decode holds the
   next group's trie (when a slot and the cells it may need are free) together with every
   live group's pending probes. A probe alone is a decode of a few tokens that reads every
   weight of the model for them (6-7 ms a token on one core, where a token of a decode of
   a hundred costs 3.8: docs/benchmarks.md, "Probes ride in the next group's decode").
   Which group enters at which decode follows from the prompts and the answers alone.

Before the first group, the tokens that every prompt of the list starts with (for a
round's list, the rules: ``shared_prefix``, cut to a multiple of ``PREFIX_BLOCK`` tokens)
are put on the carry sequence, and the first group copies them as later groups copy what
their predecessor left. The key/value state of that prefix is kept (``_PrefixStates``): a
later list of the process with the same prefix (every walk task of a run, whatever its
round) restores it instead of decoding it again (docs/benchmarks.md, "The rules decoded
once per worker"). Kept or just decoded, the pool then starts from those bytes restored
into an emptied pool. The prefix is decoded alone in one decode, and its cells then hold
the bits they held inside the first group's decode (measured: a 1,000 x 5 run gave the same
5,000 answers before and after this stage).

What is in each decode (which prompts, in which order, on which sequence ids, which
tokens) is therefore fixed by the list of prompts and these constants, never by timing,
the worker, the threads or what ran before (every list starts from an emptied pool and its
prefix's state): the same list gives the same bits on every run. They are not the serial
chain's bits: llama.cpp's matrix products group rows differently in a larger batch
(measured in docs/measurements.md, "Batched exact probes"); a list of one prompt (no
shared prefix) gives the chain's bits.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpipe.inference.llamacpp.hidden import (
    _EVAL_CALLBACK,
    _P,
    HIDDEN_TENSOR,
    N_BATCH,
    AnswerLogits,
    HiddenStateEngine,
    HiddenStateUnavailable,
)
from simpipe.inference.types import Probe, ProbeError, TopLogprobs

logger = logging.getLogger(__name__)

#: Prompts evaluated together: one sequence each. A function of nothing but this constant
#: and the caller's list, so that the batches are the same on every run and cluster.
GROUP = 8
#: Groups in the pool at once (``_Pipeline``): while the works of one wait for their next
#: probes, the next group's prompts are decoded with them.
IN_FLIGHT = 4
#: Groups in the pool at once while its oldest group has been there for fewer than
#: ``LONG_WALK`` decodes. Every token's attention steps over the cells the other groups hold
#: (masked for it), so more groups cost every token: where walks are short (a prompt of a
#: few agents: its root and a probe or two) a third and fourth group made the 1,000 x 5 run
#: 2.7 % slower; where they are long (hundreds of agents a prompt: a dozen probe steps)
#: keeping to two made a million agents' 2 rounds 8 % slower, their probes no longer sharing
#: decodes (docs/benchmarks.md, "More groups only for long walks").
SHORT_WALK_IN_FLIGHT = 2
LONG_WALK = 4
#: Key/value cells kept free per sequence for its probes' answer prefixes (an answer is a
#: few tokens; a prompt longer than the context less this is refused, as in the chain).
PATH_ROOM = 32
#: A list's shared prefix is cut to a multiple of this many tokens, so that lists whose
#: prompts part a few tokens apart (after "You are a" or "You are a female") share one.
PREFIX_BLOCK = 16
#: The key/value states kept per batched context, least recently used dropped first (a
#: state is ~18 KB a token for Gemma 3 270M: the 80 tokens of the rules take 1.5 MB).
PREFIX_STATES_BYTES = 32 << 20


class BatchFailed(RuntimeError):
    """The batched evaluation failed for another reason than a probe's ProbeError; the
    prompts in ``results`` (by index) were evaluated and told (the caller evaluates the rest
    another way)."""

    def __init__(self, results: dict[int, Any], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.results = results


class _PrefixStates:
    """Key/value states of the carry sequence by the tokens it held, the least recently used
    dropped once they take more than ``max_bytes`` (never the one just kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self._bytes = 0

    def get(self, tokens: tuple[int, ...]) -> np.ndarray | None:
        state = self._states.get(tokens)
        if state is not None:
            self._states.move_to_end(tokens)
        return state

    def put(self, tokens: tuple[int, ...], state: np.ndarray) -> None:
        old = self._states.pop(tokens, None)
        self._bytes += state.nbytes - (0 if old is None else old.nbytes)
        self._states[tokens] = state
        while self._bytes > self.max_bytes and len(self._states) > 1:
            self._bytes -= self._states.popitem(last=False)[1].nbytes

    def __len__(self) -> int:
        return len(self._states)


@dataclass
class _Entry:
    token: int
    pos: int
    seqs: list[int]
    output: bool = False


class BatchEngine:
    """A second context on a ``HiddenStateEngine``'s model with ``n_seq`` sequences in one
    key/value pool, whose decodes stop at the last hidden state. Not thread-safe: the
    caller holds the back-end's exclusive lock (``run`` itself starts threads that only
    talk to it)."""

    def __init__(self, engine: HiddenStateEngine, n_seq: int, n_ctx: int,
                 threads: int, in_flight: int = IN_FLIGHT) -> None:
        self.api = api = engine.api
        self.engine = engine  # owns the model, which must outlive this context
        self.n_seq = n_seq
        self.in_flight = in_flight
        self.carry = n_seq * in_flight  # the sequence a group leaves its successor's prefix on
        self.n_ctx = n_ctx
        self.n_embd = engine.n_embd
        self._ctx = None
        self._batch: Any = None
        self._rows: list[np.ndarray] = []
        self._zero_next = False  # a decode gave a non-finite state: zero the pool (``reset``)
        self._callback = _EVAL_CALLBACK(self._on_tensor)  # kept alive with the context
        params = api.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = self.carry + 1
        # One row per sequence and decode at most, two for an entering group's (its
        # prompts' lookahead: ``_Group.prefill``); llama.cpp asserts, killing the process,
        # unless this covers n_seq_max rows.
        params.n_outputs_max = self.carry + 1 + n_seq
        params.n_threads = params.n_threads_batch = threads
        params.swa_full = True  # so that a sequence can be cut back to any prefix
        # One pool: a token several prompts share is one cell, and one ubatch may hold
        # every sequence's tokens (llama.cpp splits a batch by sequence otherwise).
        params.kv_unified = True
        params.cb_eval = ctypes.cast(self._callback, _P)
        self._ctx = api.llama_init_from_model(engine._model, params)
        if not self._ctx:
            raise HiddenStateUnavailable("llama.cpp could not create a batched context")
        self._memory = api.llama_get_memory(self._ctx)
        self._batch = api.llama_batch_init(N_BATCH, 0, n_seq)
        self.prefixes = _PrefixStates(PREFIX_STATES_BYTES)

    def _on_tensor(self, tensor: int, ask: bool, _user: int) -> bool:
        try:
            if ask:
                return self.api.ggml_get_name(tensor) == HIDDEN_TENSOR
            n = self.api.ggml_nelements(tensor)
            if n:
                data = np.ctypeslib.as_array(self.api.ggml_get_data_f32(tensor), (n,))
                self._rows.append(data.reshape(-1, self.n_embd).copy())
            return False  # stop before the output projection
        except Exception:  # noqa: BLE001 -- nothing may cross into C: stop, report none
            self._rows.append(np.empty((0, self.n_embd), np.float32))
            return False

    def reset(self) -> None:
        """Every cell free. Their old keys and values stay (``data = false``): zeroing the
        pool wrote all of its ~18 KB a cell (32 ms for 4,096 cells, twice per walk task), and
        nothing reads them: a free cell is masked for every token, the flash-attention
        kernels skip it or weigh its finite keys and values by exactly 0, so the bits do not
        depend on what an earlier list left, as they never depended on the cells a cut or a
        finished group frees inside a list (``test_batched_trees_repeat_bit_for_bit...``
        repeats a list on a used pool). A NaN or infinity weighed by 0 is no 0: after a
        decode that gave a non-finite state the pool is zeroed, so that a model's bad
        output costs the list that met it, not the worker's later lists."""
        if self._ctx:
            self.api.llama_memory_clear(self._memory, self._zero_next)
            self._zero_next = False

    def decode(self, entries: Sequence[_Entry]) -> list[np.ndarray]:
        """Decode ``entries`` in order (at most ``N_BATCH`` tokens per llama.cpp decode);
        the last hidden state of each output entry, in order."""
        if not self._ctx:
            raise ProbeError("the batched hidden-state engine is closed")
        batch, out = self._batch, []
        for lo in range(0, len(entries), N_BATCH):
            chunk = entries[lo:lo + N_BATCH]
            batch.n_tokens = len(chunk)
            for i, e in enumerate(chunk):
                batch.token[i] = e.token
                batch.pos[i] = e.pos
                batch.n_seq_id[i] = len(e.seqs)
                for j, s in enumerate(e.seqs):
                    batch.seq_id[i][j] = s
                batch.logits[i] = e.output
            self._rows = []
            rc = self.api.llama_decode(self._ctx, batch)
            wanted = sum(e.output for e in chunk)
            rows = np.concatenate(self._rows) if self._rows else np.empty((0, self.n_embd))
            if not np.isfinite(rows).all():
                self._zero_next = True
            if rc != 0 or rows.shape[0] != wanted:
                self.reset()
                raise ProbeError(f"llama_decode of a batch failed (code {rc}, "
                                 f"{rows.shape[0]} of {wanted} hidden states)")
            out.extend(rows)
        return out

    def cut(self, seq: int, keep: int) -> None:
        """Drop sequence ``seq``'s cells from position ``keep`` on."""
        if not self.api.llama_memory_seq_rm(self._memory, seq, keep, -1):
            raise ProbeError("llama.cpp could not cut a sequence back")

    def run(self, prompts: Sequence[Sequence[int]], work: Callable[[int, Probe], Any],
            logits_of: AnswerLogits,
            on_probe: Callable[[int, float], None] | None = None,
            on_result: Callable[[int, Any], None] | None = None,
            refused: Sequence[str | None] | None = None) -> list[Any]:
        """``work(i, probe)`` for each prompt (token ids), the prompts in groups of
        ``n_seq`` in list order (``groups``), up to ``in_flight`` groups in the pool at once
        (``_Pipeline``); the works' results in order, each told to ``on_result(i, result)``
        as its work ends. A group keeps what its last prompt shares with the next group's
        first, so that, as in the chain, a prompt costs what it does not share with its
        predecessor. ``refused[i]``: why prompt ``i`` has no probes (each raises ProbeError
        with it). A work's exception is raised once every group has finished (the first in
        order); anything else that fails raises ``BatchFailed`` with the results told so
        far."""
        results: dict[int, Any] = {}

        def told(i: int, result: Any) -> None:
            results[i] = result
            if on_result is not None:
                on_result(i, result)

        try:
            prefix = shared_prefix(prompts, refused, self.n_ctx - PATH_ROOM)
            try:
                decoded, seconds = self.load_prefix(prefix)
            except ProbeError as exc:  # the first group decodes the prefix with its prompts
                logger.warning("a shared prompt prefix could not be kept: %s", exc)
                prefix, decoded, seconds = (), 0, 0.0
                self.reset()
            errors = _Pipeline(self, prompts, work, logits_of, on_probe, refused, told,
                               prefix, (decoded, seconds)).run()
        except Exception as exc:  # the caller goes on without batches
            raise BatchFailed(results, exc) from exc
        finally:
            self.reset()
        if errors:
            raise errors[0]
        return [results[i] for i in range(len(prompts))]

    def groups(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
        """(start, stop, cells) of each group: ``n_seq`` prompts in list order, a group
        halved while the cells it may hold (``_cells``: its trie, its probes' room and a
        carried prefix) would not fit the pool (a function of the prompts and the context
        size only)."""
        cuts: list[tuple[int, int, int]] = []

        def fit(lo: int, hi: int) -> None:
            cells = _cells(prompts[lo:hi])
            if cells > self.n_ctx and hi - lo > 1:
                mid = (lo + hi + 1) // 2
                fit(lo, mid)
                fit(mid, hi)
            else:
                cuts.append((lo, hi, cells))

        for lo in range(0, len(prompts), self.n_seq):
            fit(lo, min(lo + self.n_seq, len(prompts)))
        return cuts

    def load_prefix(self, prefix: tuple[int, ...]) -> tuple[int, float]:
        """An emptied pool whose carry sequence holds ``prefix``; the tokens decoded for it
        and the seconds taken. Its state is restored if it was kept, else decoded (in one
        decode, as a group's trie would hold it), kept and restored, so that what comes
        after it never depends on which (a prefix decoded in pieces would have other bits:
        docs/benchmarks.md, "The rules decoded once per worker")."""
        if not prefix:
            self.reset()
            return 0, 0.0
        start = time.perf_counter()
        decoded, state = 0, self.prefixes.get(prefix)
        if state is None:
            self.reset()
            self.decode([_Entry(t, pos, [self.carry]) for pos, t in enumerate(prefix)])
            decoded, state = len(prefix), self.save(self.carry)
            self.prefixes.put(prefix, state)
        self.restore(state)
        return decoded, time.perf_counter() - start

    def save(self, seq: int) -> np.ndarray:
        """Sequence ``seq``'s cells (positions, keys, values) as llama.cpp writes them."""
        size = self.api.llama_state_seq_get_size(self._ctx, seq)
        state = np.empty(size, np.uint8)
        if size == 0 or self.api.llama_state_seq_get_data(self._ctx, state.ctypes.data,
                                                          size, seq) != size:
            raise ProbeError("llama.cpp could not save a sequence's key/value state")
        return state

    def restore(self, state: np.ndarray) -> None:
        """An emptied pool whose carry sequence holds the cells ``save`` wrote."""
        self.reset()
        if self.api.llama_state_seq_set_data(self._ctx, state.ctypes.data, state.size,
                                             self.carry) != state.size:
            self.reset()
            raise ProbeError("llama.cpp could not restore a sequence's key/value state")

    def copy(self, src: int, dst: int, stop: int) -> None:
        """Sequence ``dst`` shares ``src``'s cells of positions before ``stop``."""
        self.api.llama_memory_seq_cp(self._memory, src, dst, 0, stop)

    def drop(self, seq: int) -> None:
        """Sequence ``seq`` holds nothing (its cells stay where another sequence holds them)."""
        self.api.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def close(self) -> None:
        if self._batch is not None:
            self.api.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self.api.llama_free(self._ctx)
            self._ctx = None


def _shifted(work: Callable[[int, Probe], Any], offset: int) -> Callable[[int, Probe], Any]:
    return lambda i, probe: work(offset + i, probe)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shared_prefix(prompts: Sequence[Sequence[int]], refused: Sequence[str | None] | None,
                  room: int) -> tuple[int, ...]:
    """The tokens that two or more prompts of the list all start with, short of each one's
    last token (whose hidden state answers it), cut to whole blocks of ``PREFIX_BLOCK``;
    prompts refused, empty or longer than ``room`` do not count. A function of the list
    alone, so that the decodes are."""
    usable = [p for i, p in enumerate(prompts)
              if (refused is None or refused[i] is None) and 0 < len(p) <= room]
    if len(usable) < 2:
        return ()
    n = min(len(p) for p in usable) - 1
    first = usable[0]
    for p in usable[1:]:
        n = min(n, _common(first, p))
        if n < PREFIX_BLOCK:
            return ()
    return tuple(first[:n - n % PREFIX_BLOCK])


def likely_first(counts: Counter[int], probing: int) -> int | None:
    """The token that over half of ``probing`` prompts probed first (``counts``: by token,
    the prompts that probed it), the most probed and then the lowest id; None if none."""
    if not counts:
        return None
    token, n = min(counts.items(), key=lambda item: (-item[1], item[0]))
    return token if 2 * n > probing else None


def _trie_size(prompts: Sequence[Sequence[int]]) -> int:
    """Distinct (prefix) tokens of ``prompts``: the cells their trie takes."""
    seen: set[tuple[int, ...]] = set()
    for p in prompts:
        seen.update(tuple(p[:n]) for n in range(1, len(p) + 1))
    return len(seen)


def _cells(prompts: Sequence[Sequence[int]]) -> int:
    """The key/value cells a group of ``prompts`` may hold at most: its trie, each prompt's
    probe room, and a prefix carried for the next group."""
    return (_trie_size(prompts) + PATH_ROOM * len(prompts)
            + max((len(p) for p in prompts), default=0))


class _Pipeline:
    """One ``BatchEngine.run``: its groups through the pool, ``SHORT_WALK_IN_FLIGHT`` at
    once, up to ``engine.in_flight`` while the oldest has walked ``LONG_WALK`` decodes or
    more. Each decode holds the next group's prompts (when a slot and the cells it may need
    are free) and every live group's pending probes, so a probe rides in a decode of a
    hundred or more tokens instead of one of a few (a one-token decode per sequence pays
    for reading every weight; docs/benchmarks.md). Which group is admitted at which decode,
    and so what each decode holds, follows from the prompts and the works' answers alone,
    never from timing: the same list gives the same bits on every run."""

    def __init__(self, engine: BatchEngine, prompts: Sequence[Sequence[int]],
                 work: Callable[[int, Probe], Any], logits_of: AnswerLogits,
                 on_probe: Callable[[int, float], None] | None,
                 refused: Sequence[str | None] | None,
                 told: Callable[[int, Any], None], carry: tuple[int, ...],
                 carry_cost: tuple[int, float]) -> None:
        self.engine, self.prompts, self.work = engine, prompts, work
        self.logits_of, self.on_probe, self.refused, self.told = logits_of, on_probe, refused, told
        self.cuts = engine.groups(prompts)
        self.live: list[_Group] = []  # in the order admitted
        self.admitted = 0
        self.carry = carry  # the tokens the carry sequence holds
        # the tokens decoded for the carry and their seconds, owed by the first prompt
        # evaluated (as in the chain, where the first prompt decodes the rules)
        self.carry_cost = carry_cost
        self.errors: dict[int, BaseException] = {}
        # the first answer tokens probed by the groups that have left: by token, the
        # prompts that probed it; the prompts that probed any
        self.firsts: Counter[int] = Counter()
        self.probing = 0

    def run(self) -> list[BaseException]:
        """Every group evaluated; the works' exceptions in prompt order."""
        try:
            while self.live or self.admitted < len(self.cuts):
                for group in self.live:
                    group.settle()
                self._retire()
                new = self._admit()
                parts = [(g, g.step_entries()) for g in self.live if g is not new]
                if new is not None:
                    parts.insert(0, (new, new.entries))
                entries = [e for _, part in parts for e in part]
                outputs = sum(e.output for e in entries)
                rows: list[np.ndarray] | ProbeError = []
                start = time.perf_counter()
                if entries:
                    try:
                        rows = self.engine.decode(entries)
                    except ProbeError as exc:  # the pool was emptied
                        rows = exc
                        for group in self.live:
                            group.emptied()
                        self.carry = ()
                each = (time.perf_counter() - start) / max(1, outputs)
                at = 0
                for group, part in parts:
                    group.age += 1
                    n = sum(e.output for e in part)
                    got = rows if isinstance(rows, ProbeError) else rows[at:at + n]
                    at += n
                    if group is new:
                        group.prefilled(got, each)
                    else:
                        group.stepped(got, each)
        finally:
            for group in self.live:
                group.abandon()
        return [self.errors[i] for i in sorted(self.errors)]

    def _retire(self) -> None:
        """Groups whose works have all ended leave the pool; the one just before the next
        group to enter first leaves what its last prompt shares with that group's first on
        the carry sequence."""
        following = self.cuts[self.admitted][0] if self.admitted < len(self.cuts) else -1
        for group in [g for g in self.live if g.over]:
            self.live.remove(group)
            self.errors.update(group.errors())
            self.firsts.update(token for _, token in group.firsts)
            self.probing += len({i for i, _ in group.firsts})
            if group.first + len(group.prompts) == following:
                self.carry = group.hand_over(tuple(self.prompts[following]))
            else:
                group.clear()

    def lookahead(self) -> int | None:
        """The first answer token that over half of the list's prompts that probed one so
        far probed (the most probed; the lowest id on a tie), else None. A walk of an
        answer first probes the state after one of its tokens, almost always the same one
        (a space before the number: 257 of 258 prompts of a round; a full tree probes
        every first token), so a group's trie decodes that token after each prompt in the
        same decode, and that probe is answered without a decode of its own: the group
        leaves the pool a decode sooner, and fewer decodes hold only a few probes' tokens
        (docs/benchmarks.md, "The answer's first token decoded with its prompt"). What was
        probed before follows from the list and the answers alone, so the decodes still
        do."""
        counts, probing = self.firsts.copy(), self.probing
        for group in self.live:
            counts.update(token for _, token in group.firsts)
            probing += len({i for i, _ in group.firsts})
        return likely_first(counts, probing)

    def _admit(self) -> _Group | None:
        """The next group, its prompts' trie ready to decode, where a slot and the cells it
        may need are free (a group always enters an empty pool: ``groups`` fits it) and,
        past ``SHORT_WALK_IN_FLIGHT`` groups, the oldest has walked long."""
        engine = self.engine
        if self.admitted >= len(self.cuts) or len(self.live) >= engine.in_flight:
            return None
        if (len(self.live) >= min(SHORT_WALK_IN_FLIGHT, engine.in_flight)
                and self.live[0].age < LONG_WALK):
            return None
        lo, hi, cells = self.cuts[self.admitted]
        used = sum(g.cells for g in self.live) + len(self.carry)
        if self.live and used + cells > engine.n_ctx:
            return None
        taken = {g.base for g in self.live}
        base = next(b for b in range(0, engine.in_flight * engine.n_seq, engine.n_seq)
                    if b not in taken)
        group = _Group(engine, base, self.prompts[lo:hi], cells, _shifted(self.work, lo),
                       self.logits_of, self.on_probe,
                       None if self.refused is None else self.refused[lo:hi],
                       _shifted(self.told, lo), lo)
        # What the first prompts share with the group before: from its last sequence while
        # it is in the pool, else from what it left on the carry sequence.
        before = self.live[-1] if self.live else None
        lookahead = self.lookahead()
        if before is not None and before.first + len(before.prompts) == lo:
            group.prefill(before.seq(len(before.prompts) - 1), before.held[-1], lookahead)
        else:
            group.prefill(engine.carry, self.carry, lookahead)
        engine.drop(engine.carry)
        self.carry = ()
        if self.carry_cost[0] and (i := group.first_evaluated()) is not None:
            group.owed[i] += self.carry_cost[0]
            group.spent[i] += self.carry_cost[1]
            self.carry_cost = (0, 0.0)
        self.live.append(group)
        self.admitted += 1
        return group


class _Group:
    """One group's prompts in the pool: their trie, then each prompt's work in a thread of
    its own whose probes wait until every other work of the group still running has asked
    its next probe or ended (``settle``); the probes that need a decode are then evaluated
    together (``step_entries``, in the pipeline's next decode) and answered (``stepped``).
    Prompt ``i`` is sequence ``base + i``."""

    def __init__(self, engine: BatchEngine, base: int, prompts: Sequence[Sequence[int]],
                 cells: int, work: Callable[[int, Probe], Any], logits_of: AnswerLogits,
                 on_probe: Callable[[int, float], None] | None,
                 refused: Sequence[str | None] | None,
                 told: Callable[[int, Any], None], first: int) -> None:
        self.engine, self.work, self.logits_of, self.on_probe = engine, work, logits_of, on_probe
        self.base, self.first, self.told = base, first, told
        self.prompts = [tuple(p) for p in prompts]
        self.cells = cells  # the most it may hold (``_cells``), what admission counts
        self.age = 0  # the decodes it has been in
        k = len(self.prompts)
        self.held: list[tuple[int, ...]] = [()] * k  # the tokens each sequence holds
        # the states each sequence's last decode gave, by the tokens they follow
        self.known: list[dict[tuple[int, ...], np.ndarray]] = [{} for _ in range(k)]
        # tokens decoded for a prompt and their share of the decodes' time, not yet
        # reported with a probe
        self.owed = [0] * k
        self.spent = [0.0] * k
        self.refused: list[str | None] = list(refused) if refused is not None else [None] * k
        self.cond = threading.Condition()
        self.asked: list[tuple[int, ...] | None] = [None] * k
        self.answer: list[Any] = [None] * k
        self.done = [False] * k
        self.ended = [False] * k
        self.abandoned = False
        self.outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * k
        self.threads: list[threading.Thread] = []
        self.entries: list[_Entry] = []  # the next decode's tokens for this group
        # (prefill entry, prompt, the tokens its state follows): each prompt's last token
        # and, where the trie held one, its lookahead token
        self.ends: list[tuple[int, int, tuple[int, ...]]] = []
        # the first answer tokens the works have probed, as (prompt, token)
        self.firsts: set[tuple[int, int]] = set()
        self.waiting: dict[int, tuple[int, ...]] = {}  # probes that need a decode
        self.order: list[int] = []  # the prompts whose probes are in ``entries``
        self.answers: dict[int, Any] = {}  # probes answered with the next decode

    def seq(self, i: int) -> int:
        return self.base + i

    def first_evaluated(self) -> int | None:
        """The first prompt that ``prefill`` did not refuse."""
        return next((i for i, r in enumerate(self.refused) if r is None), None)

    @property
    def over(self) -> bool:
        """Every work has ended and been told (after ``settle``)."""
        return all(self.ended)

    def errors(self) -> dict[int, BaseException]:
        """The works' exceptions, by index in the run's list."""
        return {self.first + i: error for i, (_, error) in enumerate(self.outcomes)
                if error is not None}

    def prefill(self, source: int, source_holds: tuple[int, ...],
                lookahead: int | None = None) -> None:
        """The prompts' trie as the next decode's entries: a token that several prompts
        share once, with every sequence that holds it; what a prompt shares with
        ``source_holds`` (the tokens sequence ``source`` holds) copied from it instead; each
        prompt's last token an output, and after it ``lookahead`` (``_Pipeline.lookahead``:
        the answer's likely first token) as one more, whose state answers the work's
        probe of that token without a decode of its own. A prompt too long for the pool
        is refused (its probes raise ProbeError)."""
        engine = self.engine
        room = engine.n_ctx - PATH_ROOM
        entries: list[_Entry] = []
        # (parent, token) -> entry; a parent is an entry's index, or ("source", depth)
        children: dict[tuple[object, int], int] = {}
        for i, tokens in enumerate(self.prompts):
            if self.refused[i] is not None:
                continue
            if not tokens:
                self.refused[i] = "an empty prompt has no next token"
                continue
            if len(tokens) > room:
                self.refused[i] = (f"a prompt of {len(tokens)} tokens does not fit the "
                                   f"context of {engine.n_ctx} (agents.llamacpp.n_ctx)")
                continue
            shared = min(_common(source_holds, tokens), len(tokens) - 1)
            if shared:
                engine.copy(source, self.seq(i), shared)
            self.held[i] = tokens[:shared]
            parent: object = ("source", shared)
            for pos in range(shared, len(tokens)):
                at = children.get((parent, tokens[pos]))
                if at is None:
                    at = children[(parent, tokens[pos])] = len(entries)
                    entries.append(_Entry(tokens[pos], pos, [self.seq(i)]))
                    self.owed[i] += 1
                else:
                    entries[at].seqs.append(self.seq(i))
                parent = at
            entries[parent].output = True  # type: ignore[index]
            self.ends.append((parent, i, tokens))  # type: ignore[arg-type]
            if lookahead is not None:
                at = children.get((parent, lookahead))
                if at is None:
                    at = children[(parent, lookahead)] = len(entries)
                    entries.append(_Entry(lookahead, len(tokens), [self.seq(i)], True))
                    self.owed[i] += 1
                else:  # another prompt's token, or its lookahead too
                    entries[at].seqs.append(self.seq(i))
                    entries[at].output = True
                self.ends.append((at, i, (*tokens, lookahead)))
        self.entries = entries

    def prefilled(self, rows: Sequence[np.ndarray] | ProbeError, seconds_each: float) -> None:
        """The trie's decode is done (``rows``: its outputs' hidden states, or why it
        failed): start the works."""
        if isinstance(rows, ProbeError):
            self.emptied()
            self.refused = [r or str(rows) for r in self.refused]
        elif self.entries:
            outputs = (k for k, e in enumerate(self.entries) if e.output)
            row_of = dict(zip(outputs, rows, strict=True))
            for at, i, tokens in self.ends:
                if len(tokens) > len(self.held[i]):
                    self.held[i] = tokens
                self.known[i][tokens] = row_of[at]
                self.spent[i] += seconds_each
        self.entries = []
        self.threads = [threading.Thread(target=self._thread, args=(i,), daemon=True,
                                         name=f"batch-probe-{self.first + i}")
                        for i in range(len(self.prompts))]
        for t in self.threads:
            t.start()

    def settle(self) -> None:
        """Wait until every work has asked its next probe or ended; tell the works that
        ended (in index order) and answer at once the probes that need no decode (a state
        already held, a refused prompt), until every probe left waiting needs one."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: all(
                    d or a is not None for d, a in zip(self.done, self.asked, strict=True)))
                asked = {i: a for i, a in enumerate(self.asked) if a is not None}
                now = [i for i, d in enumerate(self.done) if d and not self.ended[i]]
            for i in now:
                self.ended[i] = True
                result, error = self.outcomes[i]
                if error is None:
                    self.told(i, result)
            quick: dict[int, Any] = {}
            for i, tokens in asked.items():
                if len(tokens) == len(self.prompts[i]) + 1:
                    self.firsts.add((i, tokens[-1]))
                if self.refused[i] is not None:
                    quick[i] = ProbeError(self.refused[i])
                elif (row := self.known[i].get(tokens)) is not None:
                    quick[i] = self._answer(i, row)
            if not quick:
                self.waiting = asked
                return
            self._deliver(quick)

    def step_entries(self) -> list[_Entry]:
        """The waiting probes' tokens for the next decode: each sequence cut back to what it
        shares with its probe's tokens, then the rest of them, the last an output."""
        engine = self.engine
        self.answers, self.order, entries = {}, [], []
        for i, tokens in sorted(self.waiting.items()):
            keep = min(_common(self.held[i], tokens), len(tokens) - 1)
            try:
                engine.cut(self.seq(i), keep)
            except ProbeError as exc:
                self.answers[i] = exc
                continue
            self.held[i] = tokens[:keep]
            entries.extend(_Entry(tokens[p], p, [self.seq(i)], p == len(tokens) - 1)
                           for p in range(keep, len(tokens)))
            self.owed[i] += len(tokens) - keep
            self.order.append(i)
        return entries

    def stepped(self, rows: Sequence[np.ndarray] | ProbeError, seconds_each: float) -> None:
        """The decode of ``step_entries`` is done: answer the waiting probes."""
        for i in self.order:
            if isinstance(rows, ProbeError):
                self.answers[i] = rows
        if not isinstance(rows, ProbeError):
            for i, row in zip(self.order, rows, strict=True):
                self.held[i] = self.waiting[i]
                self.known[i] = {self.waiting[i]: row}
                self.spent[i] += seconds_each
                self.answers[i] = row
        answers = {i: self._answer(i, got) for i, got in self.answers.items()}
        self.waiting, self.order, self.answers = {}, [], {}
        self._deliver(answers)

    def _deliver(self, answers: dict[int, Any]) -> None:
        with self.cond:
            for i, got in answers.items():
                self.asked[i] = None
                self.answer[i] = got
            self.cond.notify_all()

    def abandon(self) -> None:
        """Left early (the run failed): whatever a work asks now fails at once; the works
        are joined."""
        with self.cond:
            self.abandoned = True
            for i, a in enumerate(self.asked):
                if a is not None and self.answer[i] is None:
                    self.answer[i] = ProbeError("the batch was abandoned")
            self.cond.notify_all()
        for t in self.threads:
            t.join()

    def hand_over(self, following: tuple[int, ...]) -> tuple[int, ...]:
        """Leave in the pool only what the group's last prompt shares with ``following``
        (the next group's first prompt), on the carry sequence; its tokens."""
        engine = self.engine
        last = len(self.prompts) - 1
        keep = min(_common(self.held[last], following), max(0, len(following) - 1))
        engine.drop(engine.carry)
        if keep:
            engine.copy(self.seq(last), engine.carry, keep)
        self.clear()
        return following[:keep]

    def clear(self) -> None:
        """The group's sequences hold nothing."""
        for i in range(len(self.prompts)):
            self.engine.drop(self.seq(i))

    def emptied(self) -> None:
        """The pool was emptied (a failed decode): every sequence starts afresh."""
        self.held = [()] * len(self.held)
        self.known = [{} for _ in self.known]

    def _thread(self, i: int) -> None:
        def probe(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
            with self.cond:
                if self.abandoned:
                    raise ProbeError("the batch was abandoned")
                self.asked[i] = self.prompts[i] + tuple(path)
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.answer[i] is not None)
                got, self.answer[i] = self.answer[i], None
            if isinstance(got, BaseException):
                raise got
            return got

        try:
            self.outcomes[i] = (self.work(i, probe), None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller, in order
            self.outcomes[i] = (None, exc)
        finally:
            with self.cond:
                self.done[i] = True
                self.cond.notify_all()

    def _answer(self, i: int, got: Any) -> Any:
        if isinstance(got, BaseException):
            return got
        logits = self.logits_of(got)
        order = np.argsort(-logits, kind="stable")
        top = TopLogprobs(tuple(self.logits_of.ids[order].tolist()),
                          tuple(logits[order].tolist()), complete=True)
        decoded, self.owed[i] = self.owed[i], 0
        seconds, self.spent[i] = self.spent[i], 0.0
        if self.on_probe is not None:
            self.on_probe(decoded, seconds)
        return top, decoded, 0


#: The batched context's key/value cells at most (a group of ``GROUP`` prompts of ~500
#: tokens with nothing shared); longer groups are halved, and a prompt longer than this less
#: ``PATH_ROOM`` is refused (its agents get calls of their own).
MAX_BATCH_CTX = GROUP * 512


class Batches:
    """A back-end's batched evaluation: a ``BatchEngine`` on its hidden-state engine's
    model, made on first use and remade if that engine is replaced; none, with one warning
    saying why, once it could not be made or failed."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.engine: BatchEngine | None = None
        self.problem: str | None = None

    def engine_for(self, hidden: HiddenStateEngine) -> BatchEngine | None:
        if self.problem is not None:
            return None
        if self.engine is not None and self.engine.engine is hidden:
            return self.engine
        self.close()
        try:
            self.engine = BatchEngine(hidden, GROUP, min(hidden.n_ctx, MAX_BATCH_CTX),
                                      self.threads)
        except (HiddenStateUnavailable, AttributeError, OSError) as exc:
            self.failed(exc)
        return self.engine

    def run(self, hidden: HiddenStateEngine, prompts: Sequence[str],
            work: Callable[[int, Probe], Any], logits_of: AnswerLogits,
            on_probe: Callable[[int, float], None] | None,
            on_result: Callable[[int, Any], None] | None) -> dict[int, Any]:
        """``BatchEngine.run`` on ``prompts``: the results by index, of all of them, or of
        those told before the batches failed, none where they could not be made (the
        caller evaluates the rest another way; no batches from then on)."""
        engine = self.engine_for(hidden)
        if engine is None:
            return {}
        tokens: list[Sequence[int]] = []
        refused: list[str | None] = []
        for p in prompts:
            try:
                tokens.append(hidden.tokenize(p))
                refused.append(None)
            except ProbeError as exc:
                tokens.append(())
                refused.append(str(exc))
        try:
            return dict(enumerate(engine.run(tokens, work, logits_of, on_probe, on_result,
                                             refused)))
        except BatchFailed as exc:
            self.failed(exc)
            return exc.results

    def failed(self, exc: BaseException) -> None:
        if self.problem is None:
            self.problem = str(exc)
            logger.warning("answer-tree probes are evaluated one prompt at a time: %s", exc)
        self.close()

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
