"""Exact next-token logits of the answer tokens, from llama.cpp's last hidden state.

An answer-tree probe needs the probabilities of a dozen tokens (the digits, a space, the
end of generation), but llama.cpp computes the logits of all 262,144 tokens of Gemma's
vocabulary for it: the output projection is most of a one-token decode (measured on one
thread: 27-35 ms per probe through the server, 9-10 ms when the decode stops at the hidden
state; docs/measurements.md). Under the default sampler settings (no top_k, top_p or min_p)
llama.cpp's grammar-constrained draw depends only on the logits of the tokens the grammar
accepts (``sampler``: a softmax over them at the temperature), so the rest of the
vocabulary is never needed.

``HiddenStateEngine`` is a second llama.cpp context on the same GGUF file, driven through
llama.cpp's C API, which xllamacpp's extension exports (the same build, so the same
kernels as the server's). Its graph callback (``cb_eval``) watches the tensor llama.cpp
names ``result_norm`` (the normalised last hidden state, the output projection's input),
copies it and stops the graph there: the key/value cache is already written by then.
``AnswerLogits`` then computes the logits of the answer tokens with ggml's own CPU kernels
for the output matrix's type, on that matrix's rows read from the GGUF file (for the
default model's Q8_0 rows: the hidden state quantized to Q8_0 blocks, then integer dot
products; measured: equal to llama.cpp's own logits bit for bit, where plain float
products of the dequantized rows are 0.08 off). ``verify`` checks this against llama.cpp's
full logits once per engine; a model whose output it does not reproduce (a logit scale or
bias of its own) raises HiddenStateUnavailable, and the back-end keeps the server's top-n
probes.

A chain of probes runs in one sequence from an empty cache, each prompt reusing the
longest prefix the chain itself left, so a fixed sequence of probes gives bit-identical
logits on every run (the same rule as the server path, ``LlamaCppBackend.logprob_chain``).

``HiddenStateEngine`` and ``AnswerLogits`` read the GGUF file again, apart from the
server's load (before or after it: the server starts on first use): ``ModelFile`` is the
file's identity when the back-end was made, and a file replaced or rewritten since raises
``ModelFileChanged`` (the back-end then keeps the server's probes, which come from the
model its sampled calls use).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from simpipe.inference.llamacpp.gguf_vocab import output_matrix
from simpipe.inference.llamacpp.native_build import ENGINE_RELEASE, engine_module
from simpipe.inference.settings import MODEL_KEY
from simpipe.inference.types import Probe, ProbeError, TopLogprobs

_P = ctypes.c_void_p
HIDDEN_TENSOR = b"result_norm"  # llama.cpp's name for the output projection's input
GGML_F32, GGML_Q8_0 = 0, 8  # ggml_type values
# How far the logits computed here may be from llama.cpp's own (float rounding only).
VERIFY_TOLERANCE = 1e-3
VERIFY_TEXT = "Pick a whole number from 0 to 100. My number:"
N_BATCH = 512
# The xllamacpp releases whose llama.h the structs below were copied from and checked against
# (tests/inference/llamacpp/test_llamacpp_hidden.py). A struct passed by value with another
# release's layout would corrupt memory instead of failing, so other releases keep the
# server's probes; pyproject.toml pins the same release, so that an install does not silently
# lose this path.
CHECKED_XLLAMACPP = (ENGINE_RELEASE,)


class HiddenStateUnavailable(RuntimeError):
    """This model or build cannot give exact answer logits from its hidden state; the
    message says why (the back-end then asks the server for top-n log-probabilities)."""


class ModelFileChanged(HiddenStateUnavailable):
    """The model file is no longer the one the server loaded: probes read from it would
    come from another model than the sampled calls."""


@dataclass(frozen=True)
class ModelFile:
    """A GGUF file and its identity (device, inode, size, mtime, ctime) when the server
    loaded it. The back-end records it before the load; whatever later reads the file by
    name checks it first (``check``): a file replaced (another inode) or rewritten in place
    (another size, mtime or ctime; no user can set a ctime back) since is refused. For the
    default model the same identity is what its recorded sha256 was checked with."""

    path: Path
    identity: tuple[int, ...]

    @classmethod
    def of(cls, path: str | Path) -> ModelFile:
        """``path`` as it is now (OSError when it cannot be read)."""
        return cls(Path(path), _identity(os.stat(path)))

    def check(self, st: os.stat_result | None = None) -> None:
        """ModelFileChanged unless the file (``st``: of an open file; by default the path
        now) is the one recorded."""
        try:
            now = _identity(st if st is not None else os.stat(self.path))
        except OSError as exc:
            raise ModelFileChanged(self._changed(f"it can no longer be read ({exc})")) from None
        if now != self.identity:
            raise ModelFileChanged(self._changed(
                "it was replaced or rewritten since llama.cpp loaded it (device, inode, "
                "size, mtime or ctime differ)"))

    def _changed(self, what: str) -> str:
        return (f"{MODEL_KEY} = {str(self.path)!r}: {what}; what is read from it now would "
                "not be the model the sampled answers come from (a run keeps the model it "
                "loaded: start the run again to use the new file)")


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _model_file(model: ModelFile | str | Path) -> ModelFile:
    return model if isinstance(model, ModelFile) else ModelFile.of(model)


class _ModelParams(ctypes.Structure):
    """``struct llama_model_params`` of the llama.cpp that xllamacpp's pinned build holds."""

    _fields_ = [("devices", _P), ("tensor_buft_overrides", _P), ("n_gpu_layers", ctypes.c_int32),
                ("split_mode", ctypes.c_int), ("load_mode", ctypes.c_int),
                ("lazy_mode", ctypes.c_int), ("main_gpu", ctypes.c_int32),
                ("tensor_split", _P), ("progress_callback", _P),
                ("progress_callback_user_data", _P), ("kv_overrides", _P),
                ("vocab_only", ctypes.c_bool), ("check_tensors", ctypes.c_bool),
                ("use_extra_bufts", ctypes.c_bool), ("no_host", ctypes.c_bool),
                ("no_alloc", ctypes.c_bool), ("load_mtp", ctypes.c_bool)]


class _ContextParams(ctypes.Structure):
    """``struct llama_context_params`` (same build)."""

    _fields_ = [*((name, ctypes.c_uint32) for name in (
                    "n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "n_outputs_max",
                    "n_outputs_max_per_seq")),
                ("n_threads", ctypes.c_int32), ("n_threads_batch", ctypes.c_int32),
                ("ctx_type", ctypes.c_int), ("rope_scaling_type", ctypes.c_int),
                ("pooling_type", ctypes.c_int), ("attention_type", ctypes.c_int),
                ("flash_attn_type", ctypes.c_int),
                *((name, ctypes.c_float) for name in (
                    "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
                    "yarn_beta_fast", "yarn_beta_slow")),
                ("yarn_orig_ctx", ctypes.c_uint32), ("defrag_thold", ctypes.c_float),
                ("cb_eval", _P), ("cb_eval_user_data", _P),
                ("type_k", ctypes.c_int), ("type_v", ctypes.c_int),
                ("moe_cache_size", ctypes.c_size_t),
                ("abort_callback", _P), ("abort_callback_data", _P),
                *((name, ctypes.c_bool) for name in (
                    "embeddings", "offload_kqv", "no_perf", "op_offload", "swa_full",
                    "kv_unified")),
                ("samplers", _P), ("n_samplers", ctypes.c_size_t), ("ctx_other", _P)]


class _Batch(ctypes.Structure):
    _fields_ = [("n_tokens", ctypes.c_int32), ("token", ctypes.POINTER(ctypes.c_int32)),
                ("embd", ctypes.POINTER(ctypes.c_float)),
                ("pos", ctypes.POINTER(ctypes.c_int32)),
                ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))),
                ("logits", ctypes.POINTER(ctypes.c_int8))]


_EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, _P, ctypes.c_bool, _P)
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, _P)
GGML_LOG_ERROR, GGML_LOG_CONT = 4, 5  # ggml_log_level values
_FROM_FLOAT = ctypes.CFUNCTYPE(None, _P, _P, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                            _P, ctypes.c_size_t, _P, ctypes.c_size_t, ctypes.c_int)


class _TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits``."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", _P), ("from_float_ref", _P)]


class _CpuTraits(ctypes.Structure):
    """``struct ggml_type_traits_cpu``: the CPU kernels of one ggml type."""

    _fields_ = [("from_float", _P), ("vec_dot", _P), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]

#: llama.h's ``enum llama_token_attr``: the tokens ``llama_tokenize`` skips unless it is
#: asked to parse special tokens.
_TOKEN_ATTR_UNKNOWN, _TOKEN_ATTR_CONTROL = 1 << 0, 1 << 3

# name: (argument types, result type)
_SIGNATURES: dict[str, tuple[list, object]] = {
    "llama_backend_init": ([], None),
    "llama_model_default_params": ([], _ModelParams),
    "llama_context_default_params": ([], _ContextParams),
    "llama_model_load_from_file": ([ctypes.c_char_p, _ModelParams], _P),
    "llama_model_free": ([_P], None),
    "llama_init_from_model": ([_P, _ContextParams], _P),
    "llama_free": ([_P], None),
    "llama_model_get_vocab": ([_P], _P),
    "llama_model_n_embd": ([_P], ctypes.c_int32),
    "llama_vocab_n_tokens": ([_P], ctypes.c_int32),
    "llama_vocab_get_attr": ([_P, ctypes.c_int32], ctypes.c_int),
    "llama_vocab_get_text": ([_P, ctypes.c_int32], ctypes.c_char_p),
    "llama_get_memory": ([_P], _P),
    "llama_memory_clear": ([_P, ctypes.c_bool], None),
    "llama_memory_seq_rm": ([_P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32],
                            ctypes.c_bool),
    "llama_memory_seq_cp": ([_P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                             ctypes.c_int32], None),
    "llama_state_seq_get_size": ([_P, ctypes.c_int32], ctypes.c_size_t),
    "llama_state_seq_get_data": ([_P, _P, ctypes.c_size_t, ctypes.c_int32], ctypes.c_size_t),
    "llama_state_seq_set_data": ([_P, _P, ctypes.c_size_t, ctypes.c_int32], ctypes.c_size_t),
    "llama_batch_init": ([ctypes.c_int32, ctypes.c_int32, ctypes.c_int32], _Batch),
    "llama_batch_free": ([_Batch], None),
    "llama_decode": ([_P, _Batch], ctypes.c_int32),
    "llama_get_logits_ith": ([_P, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
    "llama_tokenize": ([_P, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                        ctypes.c_int32, ctypes.c_bool, ctypes.c_bool], ctypes.c_int32),
    "llama_log_set": ([_LOG_CALLBACK, _P], None),
    "ggml_get_name": ([_P], ctypes.c_char_p),
    "ggml_get_data_f32": ([_P], ctypes.POINTER(ctypes.c_float)),
    "ggml_nelements": ([_P], ctypes.c_int64),
    "ggml_get_type_traits": ([ctypes.c_int], ctypes.POINTER(_TypeTraits)),
    "ggml_get_type_traits_cpu": ([ctypes.c_int], ctypes.POINTER(_CpuTraits)),
}


def llama_api() -> ctypes.CDLL:
    """llama.cpp's C API from xllamacpp's extension module, typed; HiddenStateUnavailable
    when the installed xllamacpp is not a checked release or lacks a function this module
    calls."""
    version = importlib.metadata.version("xllamacpp")
    if version not in CHECKED_XLLAMACPP:
        raise HiddenStateUnavailable(
            f"xllamacpp {version} is installed; the llama.cpp structs this module passes were "
            f"checked against xllamacpp {', '.join(CHECKED_XLLAMACPP)} only (install "
            f"xllamacpp=={CHECKED_XLLAMACPP[-1]} for exact answer logits)")
    return _typed_api()


@functools.cache
def _typed_api() -> ctypes.CDLL:
    xllamacpp = engine_module()

    gpus = [d.get("name") for d in xllamacpp.get_device_info()
            if getattr(d.get("type"), "name", "").endswith(("_GPU", "_IGPU"))]
    if gpus:
        # The hidden state would be in device memory, and the output projection is cheap
        # there: the server's probes are the better path on a GPU build.
        raise HiddenStateUnavailable(f"this xllamacpp build runs on {', '.join(gpus)}; exact "
                                     "answer logits are computed on CPU-only builds")
    try:
        lib = ctypes.CDLL(sys.modules["xllamacpp.xllamacpp"].__file__)
        for name, (args, result) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result
    except (OSError, AttributeError, KeyError, TypeError) as exc:
        raise HiddenStateUnavailable(f"xllamacpp's module does not export llama.cpp's C API "
                                     f"as this code expects ({exc})") from None
    lib.llama_log_set(_ERRORS_ONLY, None)
    lib.llama_backend_init()
    return lib


class _ErrorsOnly:
    """llama.cpp's log through the C API: its error lines (and their continuations) to
    stderr, the rest dropped. Its default callback prints every line of every model load
    and, on each decode, the graph's input tensors: half a megabyte on the quickstart's
    terminal. The server installs its own callback (``verbosity``) when it starts."""

    def __init__(self) -> None:
        self.in_error = False

    def __call__(self, level: int, text: bytes | None, _user: int) -> None:
        try:
            if level != GGML_LOG_CONT:
                self.in_error = level >= GGML_LOG_ERROR
            if self.in_error and text:
                sys.stderr.write(text.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 -- nothing may cross into C; a lost log line is all
            pass


#: Module-level: the callback must outlive every call llama.cpp makes through it.
_ERRORS_ONLY = _LOG_CALLBACK(_ErrorsOnly())


class AnswerLogits:
    """The output-matrix rows of a set of tokens, and their logits from a hidden state
    computed by ggml's own CPU kernels for the matrix's type: the hidden state converted to
    the type the kernel pairs with it (``vec_dot_type``: Q8_0 for Q8_0 rows, Q8_K for
    k-quants, F16 for F16) by ggml's ``from_float``, then one ``vec_dot`` per row, as a
    one-row matrix product in llama.cpp does.

    The rows are copied into memory of their own with plain reads: no view into a mapping
    of the file outlives the read (a view kept alive, by a profiler holding a frame for
    one, made closing the mapping raise BufferError)."""

    def __init__(self, model_path: ModelFile | str | Path, ids: Sequence[int]) -> None:
        api = llama_api()
        model = _model_file(model_path)
        with open(model.path, "rb") as f:
            model.check(os.fstat(f.fileno()))  # the rows below come from this open file
            self._init(api, model, f, ids)

    def _init(self, api: ctypes.CDLL, model: ModelFile, f: BinaryIO,
              ids: Sequence[int]) -> None:
        matrix = output_matrix(str(model.path))
        model.check()  # the header just read was that of the open file
        self.ids = np.asarray(sorted(set(ids)), dtype=np.int64)
        if self.ids.size == 0 or self.ids[0] < 0 or self.ids[-1] >= matrix.n_vocab:
            raise ValueError(f"token ids outside the vocabulary of {matrix.n_vocab}")
        self.matrix = matrix
        self.n = matrix.n_embd
        kernel = api.ggml_get_type_traits_cpu(matrix.ggml_type).contents
        if not kernel.vec_dot:
            raise HiddenStateUnavailable(f"{matrix.name}: ggml has no CPU dot product for "
                                         f"its type ({matrix.ggml_type})")
        self._dot = _VEC_DOT(kernel.vec_dot)
        self._act_bytes = _row_bytes(api, kernel.vec_dot_type, self.n, matrix.name)
        act = api.ggml_get_type_traits_cpu(kernel.vec_dot_type).contents
        self._convert = _FROM_FLOAT(act.from_float) if act.from_float else None
        if self._convert is None and kernel.vec_dot_type != GGML_F32:
            raise HiddenStateUnavailable(f"{matrix.name}: ggml cannot convert an activation "
                                         f"to type {kernel.vec_dot_type}")
        row_bytes = _row_bytes(api, matrix.ggml_type, self.n, matrix.name)
        if matrix.offset + matrix.n_vocab * row_bytes > os.fstat(f.fileno()).st_size:
            raise HiddenStateUnavailable(f"{model.path}: {matrix.name} runs past the end of "
                                         "the file")
        self._rows = rows = np.empty((self.ids.size, row_bytes), np.uint8)
        for i, t in enumerate(self.ids.tolist()):
            f.seek(matrix.offset + t * row_bytes)
            if f.readinto(rows[i]) != row_bytes:
                raise HiddenStateUnavailable(f"{model.path}: a short read of {matrix.name}")

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        """Logits of ``self.ids`` (float64) after the hidden state ``hidden``."""
        h = np.ascontiguousarray(hidden, np.float32)
        if h.size != self.n:
            raise ProbeError(f"a hidden state of {h.size} values for rows of {self.n}")
        if self._convert is None:
            act = h
        else:
            act = np.empty(self._act_bytes, np.uint8)
            self._convert(h.ctypes.data, act.ctypes.data, self.n)
        out = ctypes.c_float()
        logits = np.empty(len(self.ids))
        act_ptr, row_ptr, stride = act.ctypes.data, self._rows.ctypes.data, self._rows.shape[1]
        for i in range(len(self.ids)):
            self._dot(self.n, ctypes.byref(out), 0, row_ptr + i * stride, 0, act_ptr, 0, 1)
            logits[i] = out.value
        cap = self.matrix.final_logit_softcapping
        return cap * np.tanh(logits / cap) if cap else logits


def _row_bytes(api: ctypes.CDLL, ggml_type: int, n: int, name: str) -> int:
    traits = api.ggml_get_type_traits(ggml_type).contents
    if traits.blck_size <= 0 or n % traits.blck_size:
        raise HiddenStateUnavailable(f"{name}: rows of {n} values are not whole blocks of "
                                     f"ggml type {ggml_type}")
    return n // traits.blck_size * traits.type_size


class HiddenStateEngine:
    """A llama.cpp context on one GGUF file whose decodes stop at the last hidden state.

    One sequence; ``hidden_after(tokens)`` reuses the longest prefix the cache holds and
    decodes the rest. Not thread-safe: the caller holds the back-end's exclusive lock.
    """

    def __init__(self, model_path: ModelFile | str | Path, threads: int, n_ctx: int) -> None:
        self.api = llama_api()
        self.model_file = _model_file(model_path)
        self.model_path = self.model_file.path
        self.n_ctx = n_ctx
        self._model = self._ctx = None
        self._batch: _Batch | None = None
        self._held: list[int] = []  # the tokens the cache holds, in order
        self._zero_next = False  # a decode gave a non-finite state: zero the pool (``reset``)
        self._hidden: np.ndarray | None = None
        self._full = False  # let a decode run on to the logits (``full_logits``)
        self._control_starts: frozenset[bytes] | None = None  # (``tokenize``)
        self._callback = _EVAL_CALLBACK(self._on_tensor)  # kept alive with the context
        try:
            self._open(threads, n_ctx)
        except BaseException:
            self.close()
            raise

    def _open(self, threads: int, n_ctx: int) -> None:
        api = self.api
        model_params = api.llama_model_default_params()
        model_params.n_gpu_layers = 0  # the callback reads the hidden state from host memory
        # llama.cpp opens the file by name: the same file before and after is the one the
        # server loaded (a swap and a swap back within the load aside).
        self.model_file.check()
        self._model = api.llama_model_load_from_file(os.fsencode(self.model_path), model_params)
        if not self._model:
            raise HiddenStateUnavailable(f"llama.cpp could not load {self.model_path}")
        self.model_file.check()
        self.n_embd = api.llama_model_n_embd(self._model)
        self._vocab = api.llama_model_get_vocab(self._model)
        self.n_vocab = api.llama_vocab_n_tokens(self._vocab)
        params = api.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = 1
        params.n_outputs_max = 1  # only the last token's hidden state is ever read
        params.n_threads = params.n_threads_batch = threads
        params.swa_full = True  # so that the cache can be cut back to any shared prefix
        params.cb_eval = ctypes.cast(self._callback, _P)
        self._ctx = api.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise HiddenStateUnavailable("llama.cpp could not create a context")
        self._memory = api.llama_get_memory(self._ctx)
        self._batch = api.llama_batch_init(N_BATCH, 0, 1)

    def _on_tensor(self, tensor: int, ask: bool, _user: int) -> bool:
        # Called by ggml for every graph node: ``ask`` whether we want its data, then with
        # the data; returning False then stops the graph (the logits are not computed).
        try:
            if ask:
                return self.api.ggml_get_name(tensor) == HIDDEN_TENSOR
            n = self.api.ggml_nelements(tensor)
            if n >= self.n_embd:
                data = np.ctypeslib.as_array(self.api.ggml_get_data_f32(tensor), (n,))
                self._hidden = data[-self.n_embd:].copy()
            return self._full
        except Exception:  # noqa: BLE001 -- nothing may cross into C: stop, report none
            self._hidden = None
            return False

    def tokenize(self, text: str) -> list[int]:
        """``text`` as the server tokenizes a prompt (special tokens added and parsed).

        Parsing special tokens makes llama.cpp look for the text of each control token in
        the prompt: 2.3 ms a prompt for Gemma 3's 6,250 (``<unused0>``...), against 0.3 ms
        without (docs/benchmarks.md, "Prompts tokenized without a search for control
        tokens"). Without it, llama.cpp skips the control and unknown tokens and nothing
        else (``tokenizer_st_partition``), so a text in which none of them can start (no
        byte that starts one: ``<`` for Gemma) gets the same tokens either way, and is
        tokenized without; any other text with."""
        raw = text.encode("utf-8")
        room = len(raw) + 8
        out = (ctypes.c_int32 * room)()
        special = any(b in raw for b in self.control_starts())
        n = self.api.llama_tokenize(self._vocab, raw, len(raw), out, room, True, special)
        if n < 0:
            raise ProbeError(f"llama.cpp could not tokenize a prompt of {len(raw)} bytes")
        return list(out[:n])

    def control_starts(self) -> frozenset[bytes]:
        """The first bytes of the control and unknown tokens' texts (read once: 0.09 s for
        Gemma 3's 262,144 tokens)."""
        if self._control_starts is None:
            api, vocab = self.api, self._vocab
            special = _TOKEN_ATTR_CONTROL | _TOKEN_ATTR_UNKNOWN
            self._control_starts = frozenset(
                (api.llama_vocab_get_text(vocab, t) or b"")[:1]
                for t in range(self.n_vocab) if api.llama_vocab_get_attr(vocab, t) & special)
        return self._control_starts

    def reset(self) -> None:
        """Empty the cache: the next decode starts afresh. The cells' old keys and values
        stay unless a decode gave a non-finite state (as ``BatchEngine.reset``: a free cell
        is masked, its finite values weighed by exactly 0 where read at all; zeroing the
        pool cost 30 ms a call)."""
        if self._ctx:  # (a closed engine holds nothing)
            self.api.llama_memory_clear(self._memory, self._zero_next)
            self._zero_next = False
        self._held = []

    def hidden_after(self, tokens: Sequence[int]) -> tuple[np.ndarray, int]:
        """(the last hidden state after ``tokens``, how many tokens were decoded for it)."""
        if not tokens:
            raise ProbeError("an empty prompt has no next token")
        if len(tokens) > self.n_ctx:
            raise ProbeError(f"a prompt of {len(tokens)} tokens does not fit the context "
                             f"of {self.n_ctx} (agents.llamacpp.n_ctx)")
        keep = 0
        for a, b in zip(self._held, tokens, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(tokens) - 1)  # the last token is decoded again for its state
        if not self.api.llama_memory_seq_rm(self._memory, 0, keep, -1):
            self.reset()
            keep = 0
        self._held = self._held[:keep]
        self._decode(tokens, keep)
        if self._hidden is None:
            raise ProbeError("llama.cpp gave no hidden state for the prompt")
        return self._hidden, len(tokens) - keep

    def _decode(self, tokens: Sequence[int], start: int) -> None:
        self._hidden = None
        batch = self._batch
        if batch is None:
            raise ProbeError("the hidden-state engine is closed")
        for lo in range(start, len(tokens), N_BATCH):
            hi = min(lo + N_BATCH, len(tokens))
            batch.n_tokens = hi - lo
            for i, pos in enumerate(range(lo, hi)):
                batch.token[i] = tokens[pos]
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = pos == len(tokens) - 1
            rc = self.api.llama_decode(self._ctx, batch)
            if self._hidden is not None and not np.isfinite(self._hidden).all():
                self._zero_next = True
            if rc != 0:
                self.reset()
                raise ProbeError(f"llama_decode failed (code {rc})")
            self._held.extend(tokens[lo:hi])

    def full_logits(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(llama.cpp's logits of the whole vocabulary, the hidden state) after ``tokens``,
        decoded afresh: what ``verify`` compares with."""
        self.reset()
        self._full = True
        try:
            self._decode(tokens, 0)
            hidden = self._hidden
            logits = np.ctypeslib.as_array(self.api.llama_get_logits_ith(self._ctx, -1),
                                           (self.n_vocab,)).copy()
        finally:
            self._full = False
            self.reset()
        if hidden is None:
            raise HiddenStateUnavailable(f"the graph has no tensor named {HIDDEN_TENSOR!r}")
        return logits, hidden

    def verify(self, logits_of: AnswerLogits) -> None:
        """HiddenStateUnavailable unless ``logits_of`` reproduces llama.cpp's own logits."""
        full, hidden = self.full_logits(self.tokenize(VERIFY_TEXT))
        gap = float(np.abs(logits_of(hidden) - full[logits_of.ids]).max())
        if not gap <= VERIFY_TOLERANCE:
            raise HiddenStateUnavailable(
                f"answer logits from the hidden state differ from llama.cpp's by {gap:.3g} "
                f"(allowed {VERIFY_TOLERANCE:g}): this model's output is not a plain "
                "projection of its last hidden state")

    @contextlib.contextmanager
    def chain(self, logits_of: AnswerLogits,
              on_probe: Callable[[int, float], None] | None = None
              ) -> Iterator[Callable[[str], Probe]]:
        """A chain of exact probes from an empty cache; yields ``probe_for(prompt)``.

        Each probe returns the logits of ``logits_of.ids`` after the prompt and path, most
        likely first, as a ``TopLogprobs`` marked complete: every token that an untruncated
        grammar-constrained draw can return is listed, and such a draw depends only on the
        differences of their logits, so they stand in for log-probabilities (which would
        need the whole vocabulary's normaliser). ``on_probe(decoded, seconds)`` is told of
        each probe.
        """
        self.reset()

        def probe(tokens: tuple[int, ...], path: tuple[int, ...],
                  top_n: int) -> tuple[TopLogprobs, int, int]:
            start = time.perf_counter()
            hidden, decoded = self.hidden_after(tokens + path)
            logits = logits_of(hidden)
            order = np.argsort(-logits, kind="stable")
            top = TopLogprobs(tuple(logits_of.ids[order].tolist()),
                              tuple(logits[order].tolist()), complete=True)
            if on_probe is not None:
                on_probe(decoded, time.perf_counter() - start)
            return top, decoded, 0

        def probe_for(prompt: str) -> Probe:
            return functools.partial(probe, tuple(self.tokenize(prompt)))

        try:
            yield probe_for
        finally:
            self.reset()

    def close(self) -> None:
        api = self.api
        if self._batch is not None:
            api.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            api.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            api.llama_model_free(self._model)
            self._model = None
