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
   callback as in ``hidden``) answers the prompt's root probe;
2. the probes in lockstep: each prompt's work (a tree walked lazily, or a full tree) runs
   in a thread of its own whose probes wait until every other prompt of the group still
   working has asked its next probe or finished; then one decode answers them all, one
   output row per sequence, and the threads go on. The next step depends only on the
   answers, so which probes share a decode is a function of the prompts and the work alone.

What is in each decode (which prompts, in which order, on which sequence ids, which
tokens) is therefore fixed by the list of prompts and the group size, never by timing, the
worker, the threads or what ran before (every list starts from an empty pool): the same
list gives the same bits on every run. They are not the serial chain's bits: llama.cpp's
matrix products group rows differently in a larger batch (measured in docs/measurements.md,
"Batched exact probes"); a list of one prompt gives the chain's bits.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
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
#: Key/value cells kept free per sequence for its probes' answer prefixes (an answer is a
#: few tokens; a prompt longer than the context less this is refused, as in the chain).
PATH_ROOM = 32


class BatchFailed(RuntimeError):
    """The batched evaluation failed for another reason than a probe's ProbeError; the
    prompts in ``results`` (by index) were evaluated and told (the caller evaluates the rest
    another way)."""

    def __init__(self, results: dict[int, Any], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.results = results


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
                 threads: int) -> None:
        self.api = api = engine.api
        self.engine = engine  # owns the model, which must outlive this context
        self.n_seq = n_seq
        self.n_ctx = n_ctx
        self.n_embd = engine.n_embd
        self._ctx = None
        self._batch: Any = None
        self._rows: list[np.ndarray] = []
        self._callback = _EVAL_CALLBACK(self._on_tensor)  # kept alive with the context
        params = api.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = n_seq + 1  # and the carry sequence (``_Group.hand_over``)
        # One row per sequence and decode at most (llama.cpp asserts, killing the process,
        # unless this covers n_seq_max rows).
        params.n_outputs_max = n_seq + 1
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
        fn = api.llama_memory_seq_cp
        fn.argtypes = [_P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
        fn.restype = None

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
        if self._ctx:
            self.api.llama_memory_clear(self._memory, True)

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
        ``n_seq`` in list order (``groups``), each group evaluated together (``_Group``);
        the works' results in order, each told to ``on_result(i, result)`` as its work
        ends. A group keeps what its last prompt shares with the next group's first
        (``_Group.hand_over``), so that, as in the chain, a prompt costs what it does not
        share with its predecessor. ``refused[i]``: why prompt ``i`` has no probes (each
        raises ProbeError with it). A work's exception is raised once every group has
        finished (the first in order); anything else that fails raises ``BatchFailed``
        with the results told so far."""
        results: dict[int, Any] = {}
        errors: list[BaseException] = []
        self.reset()
        carry: tuple[int, ...] = ()
        try:
            cuts = self.groups(prompts)
            for n, (lo, hi) in enumerate(cuts):
                def told(i: int, result: Any, lo: int = lo) -> None:
                    results[lo + i] = result
                    if on_result is not None:
                        on_result(lo + i, result)

                group = _Group(self, prompts[lo:hi], _shifted(work, lo), logits_of, on_probe,
                               carry, None if refused is None else refused[lo:hi], told)
                errors.extend(e for e in group.run() if e is not None)
                carry = group.hand_over(tuple(prompts[hi])) if n + 1 < len(cuts) else ()
        except Exception as exc:  # the caller goes on without batches
            raise BatchFailed(results, exc) from exc
        finally:
            self.reset()
        if errors:
            raise errors[0]
        return [results[i] for i in range(len(prompts))]

    def groups(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """(start, stop) of each group: ``n_seq`` prompts in list order, a group halved while
        its trie, its probes' room and a carried prefix would not fit the pool (a function
        of the prompts and the context size only)."""
        cuts: list[tuple[int, int]] = []

        def fit(lo: int, hi: int) -> None:
            part = prompts[lo:hi]
            need = (_trie_size(part) + PATH_ROOM * len(part)
                    + max((len(p) for p in part), default=0))
            if need > self.n_ctx and hi - lo > 1:
                mid = (lo + hi + 1) // 2
                fit(lo, mid)
                fit(mid, hi)
            else:
                cuts.append((lo, hi))

        for lo in range(0, len(prompts), self.n_seq):
            fit(lo, min(lo + self.n_seq, len(prompts)))
        return cuts

    def copy(self, src: int, dst: int, stop: int) -> None:
        """Sequence ``dst`` shares ``src``'s cells of positions before ``stop``."""
        self.api.llama_memory_seq_cp(self._memory, src, dst, 0, stop)

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


def _trie_size(prompts: Sequence[Sequence[int]]) -> int:
    """Distinct (prefix) tokens of ``prompts``: the cells their trie takes."""
    seen: set[tuple[int, ...]] = set()
    for p in prompts:
        seen.update(tuple(p[:n]) for n in range(1, len(p) + 1))
    return len(seen)


class _Group:
    """One group's prompts evaluated together: the trie decode, then each prompt's work in
    a thread of its own, its probes answered in lockstep decodes. Prompt ``i`` is sequence
    ``i``; ``carry``: the tokens the carry sequence (``engine.n_seq``) holds, left by the
    previous group."""

    def __init__(self, engine: BatchEngine, prompts: Sequence[Sequence[int]],
                 work: Callable[[int, Probe], Any], logits_of: AnswerLogits,
                 on_probe: Callable[[int, float], None] | None,
                 carry: tuple[int, ...] = (),
                 refused: Sequence[str | None] | None = None,
                 told: Callable[[int, Any], None] | None = None) -> None:
        self.engine, self.work, self.logits_of, self.on_probe = engine, work, logits_of, on_probe
        self.prompts = [tuple(p) for p in prompts]
        self.carry = carry
        self.told = told
        k = len(self.prompts)
        self.held: list[tuple[int, ...]] = [()] * k  # the tokens each sequence holds
        # the tokens of each sequence's last decoded state, and that state
        self.known: list[tuple[tuple[int, ...], np.ndarray] | None] = [None] * k
        # tokens decoded for a prompt and their share of the decodes' time, not yet
        # reported with a probe
        self.owed = [0] * k
        self.spent = [0.0] * k
        self.refused: list[str | None] = list(refused) if refused is not None else [None] * k
        self.cond = threading.Condition()
        self.asked: list[tuple[int, ...] | None] = [None] * k
        self.answer: list[Any] = [None] * k
        self.done = [False] * k
        self.abandoned = False
        self.outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * k

    def run(self) -> list[BaseException | None]:
        """Evaluate the group; each work's result is told (``told(i, result)``, on this
        thread, in index order among those that end at the same step) as it ends. The
        works' exceptions, in order (None for each that returned); anything else that fails
        is raised once every work has ended (their probes then raise ProbeError and nothing
        more is told)."""
        failure: BaseException | None = None
        try:
            self._prefill()
        except ProbeError as exc:
            self._emptied()
            self.refused = [r or str(exc) for r in self.refused]
        except Exception as exc:  # noqa: BLE001 -- raised below, once the works have ended
            failure = exc
        threads = [threading.Thread(target=self._thread, args=(i,), daemon=True,
                                    name=f"batch-probe-{i}") for i in range(len(self.prompts))]
        for t in threads:
            t.start()
        ended = [False] * len(self.prompts)
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: all(
                        d or a is not None for d, a in zip(self.done, self.asked, strict=True)))
                    waiting = [i for i, a in enumerate(self.asked) if a is not None]
                    asked = {i: self.asked[i] for i in waiting}
                    now = [i for i, d in enumerate(self.done) if d and not ended[i]]
                for i in now:
                    ended[i] = True
                    result, error = self.outcomes[i]
                    if error is None and failure is None and self.told is not None:
                        try:
                            self.told(i, result)
                        except Exception as exc:  # noqa: BLE001 -- raised once the works end
                            failure = exc
                if not waiting:
                    break
                if failure is None:
                    try:
                        answers = self._step(asked)
                    except Exception as exc:  # noqa: BLE001 -- raised once the works end
                        failure = exc
                if failure is not None:
                    answers = {i: ProbeError(f"the batch failed ({failure})") for i in waiting}
                with self.cond:
                    for i in waiting:
                        self.asked[i] = None
                        self.answer[i] = answers[i]
                    self.cond.notify_all()
        finally:
            with self.cond:  # (left early: whatever a work asks now fails at once)
                self.abandoned = True
                for i, a in enumerate(self.asked):
                    if a is not None and self.answer[i] is None:
                        self.answer[i] = ProbeError("the batch was abandoned")
                self.cond.notify_all()
            for t in threads:
                t.join()
        if failure is not None:
            raise failure
        return [error for _, error in self.outcomes]

    def hand_over(self, following: tuple[int, ...]) -> tuple[int, ...]:
        """Leave in the pool only what the group's last prompt shares with ``following``
        (the next group's first prompt), on the carry sequence; its tokens."""
        engine = self.engine
        last = len(self.prompts) - 1
        keep = min(_common(self.held[last], following), max(0, len(following) - 1))
        carry = engine.n_seq
        engine.api.llama_memory_seq_rm(engine._memory, carry, -1, -1)
        if keep:
            engine.copy(last, carry, keep)
        for i in range(len(self.prompts)):
            engine.api.llama_memory_seq_rm(engine._memory, i, -1, -1)
        return following[:keep]

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

    def _prefill(self) -> None:
        """The prompts' trie in one decode (several when it exceeds a batch): a token that
        several prompts share decoded once, with every sequence that holds it; what a
        prompt shares with the carried prefix copied from it instead; each prompt's last
        token an output. A prompt too long for the pool is refused (its probes raise
        ProbeError)."""
        engine = self.engine
        room = engine.n_ctx - PATH_ROOM
        entries: list[_Entry] = []
        # (parent, token) -> entry; a parent is an entry's index, or ("carry", depth)
        children: dict[tuple[object, int], int] = {}
        ends: list[tuple[int, int]] = []  # (entry, prompt)
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
            shared = min(_common(self.carry, tokens), len(tokens) - 1)
            if shared:
                engine.copy(engine.n_seq, i, shared)
            self.held[i] = tokens[:shared]
            parent: object = ("carry", shared)
            for pos in range(shared, len(tokens)):
                at = children.get((parent, tokens[pos]))
                if at is None:
                    at = children[(parent, tokens[pos])] = len(entries)
                    entries.append(_Entry(tokens[pos], pos, [i]))
                    self.owed[i] += 1
                else:
                    entries[at].seqs.append(i)
                parent = at
            entries[parent].output = True  # type: ignore[index]
            ends.append((parent, i))  # type: ignore[arg-type]
        engine.api.llama_memory_seq_rm(engine._memory, engine.n_seq, -1, -1)
        if not entries:
            return
        start = time.perf_counter()
        rows = engine.decode(entries)
        seconds = (time.perf_counter() - start) / len(ends)
        row_of = dict(zip((k for k, e in enumerate(entries) if e.output), rows, strict=True))
        for at, i in ends:
            self.held[i] = self.prompts[i]
            self.known[i] = (self.prompts[i], row_of[at])
            self.spent[i] += seconds

    def _emptied(self) -> None:
        """The pool was emptied (a failed decode): every sequence starts afresh."""
        self.held = [()] * len(self.held)
        self.known = [None] * len(self.known)

    def _step(self, asked: dict[int, tuple[int, ...]]) -> dict[int, Any]:
        """One lockstep decode: every asked probe not answered by a state already held."""
        engine = self.engine
        answers: dict[int, Any] = {}
        entries: list[_Entry] = []
        order: list[int] = []
        for i, tokens in sorted(asked.items()):
            if self.refused[i] is not None:
                answers[i] = ProbeError(self.refused[i])
                continue
            known = self.known[i]
            if known is not None and known[0] == tokens:
                answers[i] = known[1]
                continue
            keep = min(_common(self.held[i], tokens), len(tokens) - 1)
            try:
                engine.cut(i, keep)
            except ProbeError as exc:
                answers[i] = exc
                continue
            self.held[i] = tokens[:keep]
            entries.extend(_Entry(tokens[p], p, [i], p == len(tokens) - 1)
                           for p in range(keep, len(tokens)))
            self.owed[i] += len(tokens) - keep
            order.append(i)
        if order:
            start = time.perf_counter()
            try:
                rows = engine.decode(entries)
            except ProbeError as exc:
                self._emptied()
                for i in order:
                    answers[i] = exc
                rows = []
            spent = (time.perf_counter() - start) / len(order)
            for i, row in zip(order, rows, strict=False):
                self.held[i] = asked[i]
                self.known[i] = (asked[i], row)
                self.spent[i] += spent
                answers[i] = row
        return {i: self._answer(i, got) for i, got in answers.items()}

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
