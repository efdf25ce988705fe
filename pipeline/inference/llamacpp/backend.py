"""The embedded llama.cpp back-end (xllamacpp): one model per worker process.

xllamacpp's ``Server`` loads the model once and runs llama.cpp's own scheduler: calls to
``handle_completions`` / ``handle_chat_completions`` from several threads are batched into
one decode per step (continuous batching over ``n_parallel`` slots). The ``Server`` always
starts llama.cpp's HTTP listener too; in-process we bind it to 127.0.0.1 on a free port
(``port = 0``) and never use it. Exact answer logits and batched probes come from a second
context on the same model (``hidden``, ``batch``). Which file is loaded: ``model_files``;
the engine's parameters: ``engine_setup``; request bodies and answers: ``completions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from simpipe.inference.base import (
    Backend,
    EndpointCounters,
    GenerationRequest,
    GenerationResult,
    answer_listener,
)
from simpipe.inference.llamacpp.batch import Batches
from simpipe.inference.llamacpp.completions import (
    ENDPOINT,
    answer_result,
    error_result,
    request_body,
    top_logprobs_of,
)
from simpipe.inference.llamacpp.engine_setup import (
    CTX_PER_SLOT,
    ENGINE_CALL_ERRORS,
    build_has_llguidance,
    build_params,
    default_threads,
    open_engine,
)
from simpipe.inference.llamacpp.gguf_vocab import GgufError, answer_vocab
from simpipe.inference.llamacpp.hidden import (
    AnswerLogits,
    HiddenStateEngine,
    HiddenStateUnavailable,
    ModelFile,
    ModelFileChanged,
)
from simpipe.inference.llamacpp.model_files import ModelFileError, resolve_model_path
from simpipe.inference.settings import MODEL_KEY, LlamaCppSettings
from simpipe.inference.types import AnswerVocab, ChainSettings, Probe, ProbeError, TopLogprobs

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The slot lone (exclusive) calls use: with the prompt cache, a call may reuse only what
# the same batch or session left there (see _serial_calls and logprob_session).
LONE_SLOT = 0


class EngineLock:
    """Many batched calls at once, or one exclusive call alone.

    llama.cpp's numerics depend on which sequences share a decode step (measured: the same
    prompt's log-probabilities move by up to 0.05 for likely tokens and 0.6 for unlikely ones
    between a lone decode and a batch), while a lone sequence decodes bit-identically
    whatever ran before, prompt cache or not. Exclusive calls are therefore reproducible.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive callers waiting: they go before new shared ones

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class LlamaCppBackend(Backend):
    """One llama.cpp model per worker process, answering whole partitions at once.

    ``serial``: a batch's requests one at a time (each a lone sequence), so that the same
    batch gives the same texts on every run; see ``_serial_calls``.
    """

    supports_answer_distributions = True
    chains_probes = True
    batched_evaluation = True  # with exact answer logits; else ``probe_each`` is a chain

    def __init__(self, settings: LlamaCppSettings, *, serial: bool = False) -> None:
        self.settings = settings
        # One slot is serial anyway; say so, so that it is also reproducible.
        self.serial = serial or settings.n_parallel == 1
        self._lock = EngineLock()
        self.prompt_style = settings.prompt_style
        self.model_path = resolve_model_path(settings)
        # The file as the back-end first saw it: the server and the exact answer logits
        # each load it later and must load this one (``hidden.ModelFile``).
        try:
            self._model_file = ModelFile.of(self.model_path)
        except OSError as exc:
            raise ModelFileError(f"{MODEL_KEY} = {str(self.model_path)!r}: {exc}") from None
        # The server (a second copy of the model in memory, ~1 s of load per worker) is
        # started on first use: a planned round's answers come from the exact answer
        # logits alone and never need it (``_engine``).
        self._server: Any = None
        self._closed = False
        self._open_lock = threading.Lock()
        self.llguidance = build_has_llguidance()
        # One blocked thread per slot keeps every slot busy; more would only queue
        # inside llama.cpp.
        self._pool = ThreadPoolExecutor(
            max_workers=settings.n_parallel, thread_name_prefix="llamacpp"
        )
        self._counters = EndpointCounters()
        # The exact answer-logit probes (``hidden``), made on first use; why not,
        # once they were found unavailable.
        self._hidden: HiddenStateEngine | None = None
        self._hidden_problem: str | None = None
        self._answer_logits: dict[frozenset[int], AnswerLogits] = {}
        self._hidden_lock = threading.Lock()
        # Several prompts' exact probes evaluated together (``probe_each``).
        self._batches = Batches(settings.threads or default_threads())

    @property
    def listening_address(self) -> str:
        """Where the in-process server's (unused) HTTP listener is bound."""
        server = self._engine()
        if server is None:
            raise ProbeError("the llama.cpp back-end is closed")
        return server.listening_address

    @property
    def _model_named(self) -> str:
        """The model as the user named it (the key's value), or the default model's path."""
        return self.settings.model_path or str(self.model_path)

    def _engine(self) -> Any:
        """The server, started on first use (blocking, once); None once closed.
        ModelFileError naming the key when llama.cpp cannot load the model, or when the file
        is no longer the one the back-end was made with."""
        server = self._server
        if server is not None:  # every call after the first: no lock
            return server
        with self._open_lock:
            if self._server is None and not self._closed:
                s = self.settings
                params = build_params(self.model_path, n_parallel=s.n_parallel,
                                      n_ctx=s.n_ctx, threads=s.threads)
                try:
                    self._model_file.check()
                    server = open_engine(params)
                    self._model_file.check()  # (a file swapped during the load)
                except ModelFileChanged as exc:
                    raise ModelFileError(str(exc)) from None
                except RuntimeError as exc:  # xllamacpp's one error for a model it cannot load
                    raise ModelFileError(
                        f"{MODEL_KEY} = {self._model_named!r}: llama.cpp cannot load it with these "
                        f"settings ({exc}); its log lines above say why: a file that is no "
                        "model llama.cpp reads (remove the key to use the default model), or "
                        "agents.llamacpp settings (n_ctx, n_parallel) too large for this "
                        "machine's memory") from None
                self._server = server
            return self._server

    def _call(self, is_chat: bool, body: dict) -> GenerationResult:
        """One request; the caller holds the engine lock (shared or exclusive)."""
        server = self._engine()
        if server is None:
            return error_result("the llama.cpp back-end is closed", 0.0)
        start = time.perf_counter()
        try:
            if is_chat:
                response = server.handle_chat_completions(body)
            else:
                response = server.handle_completions(body)
        except ENGINE_CALL_ERRORS as exc:
            return error_result(f"xllamacpp: {type(exc).__name__}: {exc}",
                          time.perf_counter() - start)
        return answer_result(response, is_chat, time.perf_counter() - start)

    def _batched_call(self, is_chat: bool, body: dict) -> GenerationResult:
        with self._lock.shared():
            return self._call(is_chat, body)

    def _serial_calls(self, requests: Sequence[GenerationRequest],
                      told: Callable[[int], None] | None = None) -> list[GenerationResult]:
        """Every request alone and in order, the first with its prompt decoded afresh.

        A batch's numbers then depend only on its own requests, never on what ran before or
        beside it: reusing a cached prefix changes how the rest of a prompt is batched and
        the last bits of the result (measured: same seed, other text), so all run in one
        slot, the first prompt starts clean and the later ones reuse only what this batch
        itself left there.
        """
        with self._lock.exclusive():
            results = []
            for i, req in enumerate(requests):
                is_chat, body = request_body(req, cache_prompt=i > 0,
                                             llguidance=self.llguidance)
                body["id_slot"] = LONE_SLOT
                results.append(self._call(is_chat, body))
                if told is not None:  # one answer more (answer_listener)
                    told(1)
            return results

    def answer_vocab(self, alphabet: frozenset[str]) -> AnswerVocab:
        """End-of-generation ids and the tokens spelling ``alphabet``, from the GGUF file;
        ModelFileError naming the key when the file is no longer the one the back-end was
        made with (its ids could be another vocabulary's), or has no vocabulary to read (a
        planned round reads it before anything loads the model)."""
        try:
            self._model_file.check()
            found = answer_vocab(str(self.model_path), alphabet)
            self._model_file.check()
        except ModelFileChanged as exc:
            raise ModelFileError(str(exc)) from None
        except GgufError as exc:
            why = str(exc).removeprefix(f"{self.model_path}: ")
            raise ModelFileError(f"{MODEL_KEY} = {self._model_named!r}: {why}: no model "
                                 "llama.cpp can use (remove the key to use the default "
                                 "model)") from None
        return found

    @contextlib.contextmanager
    def logprob_session(self, prompt: str, lone: bool = True) -> Iterator[Probe]:
        """Exclusive use of the engine to ask for next-token log-probabilities after
        ``prompt`` followed by token ids; yields ``probe(path, top_n)`` (see ``Probe``).

        A chain (``logprob_chain``) of this one prompt through the server: the first call
        decodes the prompt afresh, so a fixed sequence of calls gives bit-identical answers
        on every run, whatever ran before. Always lone: the engine is this process's.
        """
        with self.logprob_chain() as probe_for:
            yield probe_for(prompt)

    def exact_answer_logits(self, vocab: AnswerVocab,
                            settings: ChainSettings) -> AnswerLogits | None:
        """The exact answer-token logits for ``vocab`` (``hidden``) where they decide
        llama.cpp's draw: sampler settings that do not truncate (the defaults) and a model
        whose output the check reproduces; None otherwise (the reason is logged once)."""
        if settings.truncates or self._closed:
            return None
        with self._hidden_lock:  # partitions of one worker may ask at once: one engine
            return self._answer_logits_for(frozenset(vocab.pieces) | vocab.eog_ids)

    def _answer_logits_for(self, ids: frozenset[int]) -> AnswerLogits | None:
        if self._hidden_problem is not None:
            return None
        found = self._answer_logits.get(ids)
        if found is not None:
            return found
        # The check decodes on the engine, which another partition's chain may be using.
        with self._lock.exclusive():
            try:
                found = AnswerLogits(self._model_file, sorted(ids))
                if self._hidden is None:
                    s = self.settings
                    self._hidden = HiddenStateEngine(
                        self._model_file, s.threads or default_threads(),
                        s.n_ctx or s.n_parallel * CTX_PER_SLOT)
                self._hidden.verify(found)
            except Exception as exc:  # noqa: BLE001 -- last resort: the exact path only saves time; whatever breaks it, the server's probes answer
                self._exact_failed(exc)
                self._drop_engine()
                return None
        self._answer_logits[ids] = found
        return found

    def _exact_failed(self, exc: BaseException) -> None:
        """Turn the exact answer logits off for this back-end, with one warning saying why;
        the caller holds the exclusive engine lock and then frees the engine
        (``_drop_engine``) once no chain of it is open."""
        if self._hidden_problem is None:
            known = (HiddenStateUnavailable, ProbeError, OSError, ValueError)
            self._hidden_problem = (str(exc) if isinstance(exc, known)
                                    else f"{type(exc).__name__}: {exc}")
            logger.warning("answer trees use the server's top-n log-probabilities: %s",
                           self._hidden_problem)

    def _drop_engine(self) -> None:
        self._batches.close()  # a context on the engine's model
        hidden, self._hidden = self._hidden, None
        self._answer_logits.clear()
        if hidden is not None:
            try:
                hidden.close()
            except Exception:  # last resort (logged): it failed and was reported already
                logger.debug("closing the hidden-state engine failed", exc_info=True)

    @contextlib.contextmanager
    def logprob_chain(self, vocab: AnswerVocab | None = None,
                      settings: ChainSettings | None = None
                      ) -> Iterator[Callable[[str], Probe]]:
        """Exclusive use of the engine for probes of several prompts in one chain; yields
        ``probe_for(prompt)``, which gives that prompt's ``probe(path, top_n)``.

        With the answer ``vocab`` and sampler ``settings`` that do not truncate, each probe
        gives the exact logits of the answer tokens from the last hidden state
        (``exact_answer_logits``, ``hidden``; ``top_n`` is then moot). Otherwise the
        server answers each probe with its top ``top_n`` raw log-probabilities. Should the
        exact path fail in any other way than a probe's ProbeError, it is turned off with
        one warning and the server answers that probe and every later one.

        The whole chain is one lone sequence (``EngineLock.exclusive``) in one slot: the
        first call decodes its prompt afresh and every later one reuses only the longest
        common prefix that the chain itself left there, so a prompt costs the tokens in
        which it differs from the one probed before it (sorted prompts share long
        prefixes), and a fixed sequence of calls gives bit-identical answers on every run,
        whatever ran before or beside.
        The prompt goes as text then ids: it tokenizes exactly as a sampled call's prompt
        does, and the ids are the tokens a sampled call would have generated. A probe
        raises ProbeError.
        """
        exact = (self.exact_answer_logits(vocab, settings)
                 if vocab is not None and settings is not None else None)
        if self._closed:
            raise ProbeError("the llama.cpp back-end is closed")
        with self._lock.exclusive():
            hidden = self._hidden
            if exact is None or hidden is None:
                yield self._server_probes()
                return
            chain = hidden.chain(exact, self._count_probe)
            try:
                exact_for = chain.__enter__()
            except Exception as exc:  # noqa: BLE001 -- last resort, as in _answer_logits_for
                self._exact_failed(exc)
                self._drop_engine()
                yield self._server_probes()
                return
            try:
                yield self._exact_or_server(exact_for)
            finally:
                try:
                    chain.__exit__(None, None, None)
                except Exception as exc:  # noqa: BLE001 -- last resort, as in _answer_logits_for
                    self._exact_failed(exc)
                if self._hidden_problem is not None:
                    self._drop_engine()

    def _exact_or_server(self, exact_for: Callable[[str], Probe]) -> Callable[[str], Probe]:
        """``probe_for`` of an exact chain that turns to the server's probes for good the
        moment the exact path raises anything but a ProbeError (a probe's own error, which
        stays that prompt's): that probe and every later one are then the server's. Each
        probe's answer stands on its own, so a tree may mix the two."""
        server_for: Callable[[str], Probe] | None = None

        def server_probe(prompt: str) -> Probe:
            nonlocal server_for
            if server_for is None:
                server_for = self._server_probes()
            return server_for(prompt)

        def probe_for(prompt: str) -> Probe:
            if self._hidden_problem is not None:
                return server_probe(prompt)
            try:
                exact = exact_for(prompt)
            except ProbeError:
                raise
            except Exception as exc:  # noqa: BLE001 -- last resort, as in _answer_logits_for
                self._exact_failed(exc)
                return server_probe(prompt)

            def probe(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
                if self._hidden_problem is None:
                    try:
                        return exact(path, top_n)
                    except ProbeError:
                        raise
                    except Exception as exc:  # noqa: BLE001 -- last resort, as above
                        self._exact_failed(exc)
                return server_probe(prompt)(path, top_n)

            return probe

        return probe_for

    def probe_each(self, prompts: Sequence[str], work: Callable[[int, Probe], T],
                   vocab: AnswerVocab, settings: ChainSettings,
                   on_result: Callable[[int, T], None] | None = None) -> list[T]:
        """``work(i, probe)`` for each prompt, its results in order (see ``Backend``).

        With exact answer logits (``exact_answer_logits``) the prompts are evaluated in
        groups of ``batch.GROUP`` in list order, two or (where walks are long) up to
        ``batch.IN_FLIGHT`` groups' prompts and probes together in fixed batches
        (``batch``): the same list gives the same bits on every run, which differ from a
        chain's in the last bits. Otherwise, and for what
        remains when the batches fail, one ``logprob_chain`` in list order.
        """
        done: dict[int, T] = {}
        exact = self.exact_answer_logits(vocab, settings)
        if exact is not None:
            with self._lock.exclusive():
                if self._hidden is not None and self._hidden_problem is None:
                    done = self._batches.run(self._hidden, prompts, work, exact,
                                             self._count_probe, on_result)
        if len(done) < len(prompts):
            with self.logprob_chain(vocab, settings) as probe_for:
                for i, prompt in enumerate(prompts):
                    if i not in done:
                        done[i] = work(i, probe_for(prompt))
                        if on_result is not None:
                            on_result(i, done[i])
        return [done[i] for i in range(len(prompts))]

    def _count_probe(self, decoded: int, seconds: float) -> None:
        c = self._counters
        c.requests += 1
        c.tokens_in += decoded
        c.latency_s_sum += seconds

    def _server_probes(self) -> Callable[[str], Probe]:
        """``probe_for`` of a chain through the server's ``n_probs``; the caller holds the
        exclusive engine lock."""
        if self._engine() is None:
            raise ProbeError("the llama.cpp back-end is closed")
        fresh = True

        def probe_call(prompt: str, path: tuple[int, ...],
                       top_n: int) -> tuple[TopLogprobs, int, int]:
            nonlocal fresh
            body = {"prompt": [prompt, *path] if path else prompt, "max_tokens": 1,
                    "n_probs": top_n, "temperature": 1.0, "top_k": 1, "seed": 0,
                    "cache_prompt": not fresh, "id_slot": LONE_SLOT}
            server = self._server
            if server is None:
                raise ProbeError("the llama.cpp back-end is closed")
            start = time.perf_counter()
            c = self._counters
            c.requests += 1
            try:
                response = server.handle_completions(body)
                # The slot now holds this call's tokens: later calls may build on them.
                fresh = False
                top, evaluated, generated = top_logprobs_of(response)
            except ENGINE_CALL_ERRORS as exc:
                c.errors += 1
                raise ProbeError(f"xllamacpp: {type(exc).__name__}: {exc}") from None
            except ProbeError:
                c.errors += 1
                raise
            c.tokens_in += evaluated
            c.tokens_out += generated
            c.latency_s_sum += time.perf_counter() - start
            return top, evaluated, generated

        def probe_for(prompt: str) -> Probe:
            return functools.partial(probe_call, prompt)

        return probe_for

    async def generate(self, requests: Sequence[GenerationRequest], *,
                       reproducible: bool = False) -> list[GenerationResult]:
        if self._closed:  # (its pool is shut down too)
            return [error_result("the llama.cpp back-end is closed", 0.0) for _ in requests]
        loop = asyncio.get_running_loop()
        if self._server is None:  # started here, once, not by the first of the pool's threads
            await loop.run_in_executor(self._pool, self._engine)
        told = answer_listener()
        if self.serial or reproducible:
            results = await loop.run_in_executor(self._pool, self._serial_calls, requests, told)
        else:
            futures = [
                loop.run_in_executor(self._pool, self._batched_call,
                                     *request_body(req, cache_prompt=True,
                                                   llguidance=self.llguidance))
                for req in requests
            ]
            if told is not None:
                for future in futures:
                    future.add_done_callback(lambda _: told(1))
            results = list(await asyncio.gather(*futures))
        c = self._counters
        for r in results:
            c.requests += 1
            c.errors += r.status == "error"
            c.tokens_in += r.tokens_in
            c.tokens_out += r.tokens_out
            c.latency_s_sum += r.latency_s
        return results

    def counters(self) -> dict[str, dict]:
        return {ENDPOINT: self._counters.as_dict()}

    async def aclose(self) -> None:
        with self._open_lock:  # (not while the server is being started)
            self._closed = True
            server, self._server = self._server, None
        self._pool.shutdown(wait=True)
        hidden, self._hidden = self._hidden, None
        if hidden is not None:
            with self._lock.exclusive():
                self._batches.close()  # a context on the engine's model
                hidden.close()
        # Dropping the last reference runs ~Server: stops the loop and frees the model.
        del server
