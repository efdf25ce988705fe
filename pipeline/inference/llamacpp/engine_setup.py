"""Setting up xllamacpp's engine: its parameters (the only place they are built), the thread
budget, glibc's malloc thresholds, loading the model, and what this build's grammar
sampler takes. Shared by the embedded back-end, simpipe's llama.cpp HTTP server and the
benches, so that all of them run the engine the same way.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

from simpipe.inference.llamacpp.native_build import engine_module

CTX_PER_SLOT = 512  # n_ctx = 0 means this many tokens per slot

# What xllamacpp (Cython over C++) can raise per call: C++ exceptions arrive as
# RuntimeError / ValueError / MemoryError / IndexError / OverflowError, and a payload it
# cannot serialise as TypeError. One failed call must become one agent's error, not a
# failed partition.
ENGINE_CALL_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, IndexError,
                      ArithmeticError, MemoryError, OSError)


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
    params.n_ctx = n_ctx or n_parallel * CTX_PER_SLOT
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
    except (*ENGINE_CALL_ERRORS, AttributeError):
        return False
    return isinstance(grammar, str) and grammar.startswith("%llguidance")


def server_constraint() -> str:
    """``agents.openai.constraint`` for a llama.cpp server of this xllamacpp build (the
    benches start one): the llguidance form where the build takes it, else GBNF."""
    return "lark" if build_has_llguidance() else "grammar"

