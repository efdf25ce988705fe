"""Exact answer-token logits from llama.cpp's last hidden state (``llamacpp_hidden``), with
the real Gemma model: equal to llama.cpp's own logits, the same answer distributions as the
server's top-n probes, bit-identical chains, and the server path wherever they do not apply."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from simpipe.answers.distribution import answer_distribution
from simpipe.bench.invariance import round3_prompts
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.llamacpp import hidden as llamacpp_hidden
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.gguf_vocab import (
    GGML_BLOCKS,
    _read_gguf,
    output_matrix,
    tensor_data_end,
)
from simpipe.inference.llamacpp.hidden import (
    CHECKED_XLLAMACPP,
    GGML_Q8_0,
    AnswerLogits,
    HiddenStateEngine,
    HiddenStateUnavailable,
    ModelFile,
    ModelFileChanged,
)
from simpipe.inference.llamacpp.model_files import ModelFileError, default_model_path
from simpipe.inference.settings import LlamaCppSettings
from simpipe.inference.types import ChainSettings

from support import total_variation

LANG = IntegerAnswers(0, 100)
PLAIN = ChainSettings(1.0)


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=2, threads=2))
    yield b
    asyncio.run(b.aclose())


@pytest.mark.llm
def test_answer_logits_equal_llamacpps_own():
    """After prompts and answer prefixes, the logits computed from the hidden state are
    llama.cpp's (its full-vocabulary decode) to float rounding."""
    path = default_model_path()
    matrix = output_matrix(str(path))
    assert (matrix.name, matrix.ggml_type, matrix.n_embd, matrix.n_vocab) == (
        "token_embd.weight", GGML_Q8_0, 640, 262144)  # tied to the input embeddings
    engine = HiddenStateEngine(path, threads=2, n_ctx=1024)
    try:
        ids = sorted(range(236743, 236790)) + [1, 106, 107]
        logits_of = AnswerLogits(path, ids)
        for text in (*round3_prompts(2), "Guess: 4"):
            tokens = engine.tokenize(text)
            full, hidden = engine.full_logits(tokens)
            gap = np.abs(logits_of(hidden) - full[logits_of.ids]).max()
            assert gap < 1e-4, (text[-20:], gap)
            # the stopped decode (no output projection) leaves the same hidden state
            engine.reset()
            stopped, decoded = engine.hidden_after(tokens)
            assert decoded == len(tokens) and np.array_equal(stopped, hidden)
    finally:
        engine.close()


@pytest.mark.llm
def test_exact_trees_equal_the_servers_and_repeat_bit_for_bit(backend):
    """The same answer trees as the server's top-n probes (within the mass those left
    unseen), with nothing unseen; the same chain gives the same bits again, whatever ran
    on the engine in between; each probe evaluates only what its predecessor did not."""
    vocab = backend.answer_vocab(LANG.alphabet)
    prompts = round3_prompts(4)

    def trees(*exact):
        with backend.logprob_chain(*exact) as probe_for:
            return [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4) for p in prompts]

    server = trees()
    exact = trees(vocab, PLAIN)
    for s, e in zip(server, exact, strict=True):
        tv = total_variation(e, s)
        assert e.unseen_mass == 0.0 and tv <= s.unseen_mass + 1e-5, tv
        assert e.calls == s.calls > 10
    # the first prompt is decoded whole, the next ones only past their shared prefix
    assert exact[0].tokens_in > 100 and all(e.tokens_in < exact[0].tokens_in
                                            for e in exact[1:])
    trees()  # the server's probes on the same engine in between
    again = trees(vocab, PLAIN)
    assert all(a.texts == e.texts and np.array_equal(a.probs, e.probs)
               for a, e in zip(again, exact, strict=True))


@pytest.mark.llm
def test_truncating_samplers_keep_the_servers_probes(backend):
    """top_p, top_k or min_p make llama.cpp's draw depend on the whole vocabulary: those
    trees come from the server's top-n log-probabilities."""
    vocab = backend.answer_vocab(LANG.alphabet)
    assert backend.exact_answer_logits(vocab, PLAIN) is not None
    for settings in (ChainSettings(1.0, top_p=0.9), ChainSettings(1.0, top_k=40),
                     ChainSettings(1.0, min_p=0.05)):
        assert backend.exact_answer_logits(vocab, settings) is None
        with backend.logprob_chain(vocab, settings) as probe_for:
            top, _, generated = probe_for(round3_prompts(1)[0])((), 64)
        assert not top.complete and len(top.ids) == 64 and generated == 1


@pytest.mark.llm
def test_a_model_whose_logits_are_not_reproduced_keeps_the_servers_probes(
        monkeypatch, caplog):
    """When the check against llama.cpp's own logits fails, the back-end says why once and
    answers every probe through the server."""
    monkeypatch.setattr(AnswerLogits, "__call__",
                        lambda self, hidden: np.zeros(self.ids.size))
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=1, threads=2))
    try:
        vocab = b.answer_vocab(LANG.alphabet)
        with caplog.at_level(logging.WARNING, "simpipe.inference.llamacpp.backend"):
            assert b.exact_answer_logits(vocab, PLAIN) is None
            assert b.exact_answer_logits(vocab, PLAIN) is None
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("simpipe.")]
        assert len(warned) == 1 and "differ from llama.cpp's" in warned[0]
        with b.logprob_chain(vocab, PLAIN) as probe_for:
            top, _, _ = probe_for("My number:")((), 16)
        assert not top.complete and len(top.ids) == 16
    finally:
        asyncio.run(b.aclose())


def test_an_unchecked_xllamacpp_release_is_refused_before_any_struct_is_passed(monkeypatch):
    """Another xllamacpp release may lay llama.cpp's structs out differently; the C API is
    then not touched at all and the message names the release to install."""
    monkeypatch.setattr(llamacpp_hidden, "CHECKED_XLLAMACPP", ("0.0.1",))
    with pytest.raises(HiddenStateUnavailable, match=r"install xllamacpp==0\.0\.1"):
        llamacpp_hidden.llama_api()




@pytest.mark.llm
def test_answer_rows_are_copied_while_a_profiler_holds_every_frame():
    """A profiler that keeps frames (Dask's samples ``sys._current_frames()`` every 10 ms)
    kept ``np.frombuffer`` views of the file's mapping alive through ``np.stack``'s frame,
    and closing the mapping raised ``BufferError: cannot close exported pointers exist``.
    With the frames of every function the construction calls kept alive, it succeeds, and
    the rows are the file's bytes in memory of their own."""
    path = default_model_path()
    ids = [236743, 236744, 236789, 1, 106]
    kept: dict[object, list] = {}

    def hold(frame, event, _arg):
        if event == "call":
            frames = kept.setdefault(frame.f_code, [])
            if len(frames) < 16:  # every function, not every one of 262,144 token reads
                frames.append(frame)

    sys.setprofile(hold)
    try:
        logits_of = AnswerLogits(path, ids)
    finally:
        sys.setprofile(None)
    assert len(kept) > 10
    rows = logits_of._rows
    assert rows.flags.owndata and rows.shape[0] == len(ids)
    matrix = output_matrix(str(path))
    with open(path, "rb") as f:
        for row, t in zip(rows, sorted(ids), strict=True):
            f.seek(matrix.offset + t * rows.shape[1])
            assert f.read(rows.shape[1]) == row.tobytes()


def _fail_rows(monkeypatch):
    def broken(*_args):
        raise BufferError("cannot close exported pointers exist")
    monkeypatch.setattr(AnswerLogits, "_init", broken)
    return "BufferError: cannot close exported pointers exist"


def _fail_verify(monkeypatch):
    def broken(*_args):
        raise AttributeError("no such thing")
    monkeypatch.setattr(HiddenStateEngine, "verify", broken)
    return "AttributeError: no such thing"


def _fail_third_probe(monkeypatch):
    real = HiddenStateEngine.hidden_after
    calls = []

    def flaky(self, tokens):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the engine broke")
        return real(self, tokens)
    monkeypatch.setattr(HiddenStateEngine, "hidden_after", flaky)
    return "RuntimeError: the engine broke"


@pytest.mark.llm
@pytest.mark.parametrize("fail", [_fail_rows, _fail_verify, _fail_third_probe],
                         ids=["reading-rows", "verify", "third-probe"])
def test_any_failure_of_the_exact_path_falls_back_with_one_warning(monkeypatch, caplog, fail):
    """Whatever the exact path raises, while it is built, checked or used (not only the
    errors it expects), the back-end says why once, frees the engine and the server
    answers the probe and every later one: the trees still come, as the server's (a tree
    cut in the middle mixes exact and server probes, each standing on its own)."""
    why = fail(monkeypatch)
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=1, threads=2))
    try:
        vocab = b.answer_vocab(LANG.alphabet)
        prompts = round3_prompts(2)
        with caplog.at_level(logging.WARNING, "simpipe.inference.llamacpp.backend"):
            with b.logprob_chain(vocab, PLAIN) as probe_for:
                got = [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4)
                       for p in prompts]
            with b.logprob_chain(vocab, PLAIN) as probe_for:
                top, _, _ = probe_for("My number:")((), 16)
            assert b.exact_answer_logits(vocab, PLAIN) is None
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("simpipe.")]
        assert len(warned) == 1 and why in warned[0], warned
        assert not top.complete and len(top.ids) == 16 and b._hidden is None
        with b.logprob_chain() as probe_for:
            want = [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4) for p in prompts]
        for g, w in zip(got, want, strict=True):
            assert len(g.texts) > 10 and total_variation(g, w) <= w.unseen_mass + 1e-5
    finally:
        asyncio.run(b.aclose())


@pytest.mark.llm
def test_a_model_file_replaced_after_the_server_loaded_it_is_never_read(tmp_path, caplog):
    """The model file swapped for another between the server's load and the first exact
    probe: the exact path refuses it with one warning naming the key, the probes are the
    server's (of the model the sampled calls use, bit for bit as before the swap), the
    second context refuses it before llama.cpp opens it, and the answer vocabulary is not
    read from it."""
    model = tmp_path / "model.gguf"
    shutil.copyfile(default_model_path(), model)
    b = LlamaCppBackend(LlamaCppSettings(model_path=str(model), n_parallel=1, threads=2))
    try:
        vocab = b.answer_vocab(LANG.alphabet)
        prompts = round3_prompts(2)
        with b.logprob_chain() as probe_for:
            want = [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4) for p in prompts]
        # Another model in its place: the same file with the answer tokens' rows zeroed.
        other = tmp_path / "other.gguf"
        shutil.copyfile(model, other)
        matrix = output_matrix(str(other))
        row_bytes = llamacpp_hidden._row_bytes(llamacpp_hidden.llama_api(), matrix.ggml_type,
                                               matrix.n_embd, matrix.name)
        with open(other, "r+b") as f:
            for t in set(vocab.pieces) | vocab.eog_ids:
                f.seek(matrix.offset + t * row_bytes)
                f.write(bytes(row_bytes))
        os.replace(other, model)
        with caplog.at_level(logging.WARNING, "simpipe.inference.llamacpp.backend"):
            assert b.exact_answer_logits(vocab, PLAIN) is None
            with b.logprob_chain(vocab, PLAIN) as probe_for:
                got = [answer_distribution(probe_for(p), LANG, vocab, PLAIN, 4)
                       for p in prompts]
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("simpipe.")]
        assert len(warned) == 1, warned
        assert "agents.llamacpp.model_path" in warned[0] and "replaced or rewritten" in warned[0]
        for g, w in zip(got, want, strict=True):
            assert g.texts == w.texts and np.array_equal(g.probs, w.probs)
        with pytest.raises(ModelFileChanged, match="agents.llamacpp.model_path"):
            HiddenStateEngine(b._model_file, threads=2, n_ctx=512)
        with pytest.raises(ModelFileError, match="agents.llamacpp.model_path"):
            b.answer_vocab(LANG.alphabet)
    finally:
        asyncio.run(b.aclose())


def test_a_model_file_rewritten_in_place_with_its_mtime_set_back_is_refused(tmp_path):
    """The same inode and size, the mtime set back: the ctime (which no user can set)
    still tells."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    recorded = ModelFile.of(path)
    recorded.check()
    st = path.stat()
    time.sleep(0.05)  # past the file system's clock tick
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"x")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_ino == st.st_ino and path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(ModelFileChanged, match="agents.llamacpp.model_path"):
        recorded.check()


def test_the_install_pins_the_checked_xllamacpp_release():
    """pyproject.toml installs exactly the release the structs were checked against: a
    newer one would install silently and lose the exact path (2-3x slower probes)."""
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("xllamacpp")]
    assert pins == [f"xllamacpp=={CHECKED_XLLAMACPP[-1]}"]
    from importlib.metadata import version
    assert version("xllamacpp") in CHECKED_XLLAMACPP


# The defaults llama.h documents for the pinned release (llama_*_default_params).
CONTEXT_DEFAULTS = dict(
    n_ctx=512, n_batch=2048, n_ubatch=512, n_seq_max=1, n_rs_seq=0, n_outputs_max=0,
    n_outputs_max_per_seq=1, n_threads=4, n_threads_batch=4, ctx_type=0,
    rope_scaling_type=-1, pooling_type=-1, attention_type=-1, flash_attn_type=-1,
    rope_freq_base=0.0, rope_freq_scale=0.0, yarn_ext_factor=-1.0, yarn_attn_factor=-1.0,
    yarn_beta_fast=-1.0, yarn_beta_slow=-1.0, yarn_orig_ctx=0, defrag_thold=-1.0,
    cb_eval=None, cb_eval_user_data=None, type_k=1, type_v=1, moe_cache_size=0,
    abort_callback=None, abort_callback_data=None, embeddings=False, offload_kqv=True,
    no_perf=True, op_offload=True, swa_full=True, kv_unified=False, samplers=None,
    n_samplers=0, ctx_other=None)
MODEL_DEFAULTS = dict(
    devices=None, tensor_buft_overrides=None, n_gpu_layers=-1, split_mode=1, load_mode=-1,
    lazy_mode=1, main_gpu=0, tensor_split=None, progress_callback=None,
    progress_callback_user_data=None, kv_overrides=None, vocab_only=False,
    check_tensors=False, use_extra_bufts=True, no_host=False, no_alloc=False, load_mtp=False)


def _fields(value: ctypes.Structure) -> dict:
    return {name: getattr(value, name) for name, *_ in type(value)._fields_}


def _returned_bytes(name: str, *args: int) -> tuple[bytes, set[int]]:
    """The bytes the library's ``name`` writes for the struct it returns, and which bytes it
    wrote. On x86-64 a struct of more than 16 bytes is returned through a pointer the caller
    passes as a hidden first argument: passed here explicitly, to a buffer of a marker byte
    far larger than the struct, so that the library itself shows how much it writes."""
    lib = ctypes.CDLL(llamacpp_hidden.llama_api()._name)
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p, *[ctypes.c_int32] * len(args)]
    fn.restype = ctypes.c_void_p
    buf = (ctypes.c_ubyte * 1024)(*[0xAB] * 1024)
    assert fn(ctypes.addressof(buf), *args) == ctypes.addressof(buf)
    return bytes(buf), {i for i, b in enumerate(buf) if b != 0xAB}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="reads the struct-return convention of x86-64")
@pytest.mark.parametrize(("function", "struct", "args", "defaults"), [
    ("llama_context_default_params", llamacpp_hidden._ContextParams, (), CONTEXT_DEFAULTS),
    ("llama_model_default_params", llamacpp_hidden._ModelParams, (), MODEL_DEFAULTS),
    ("llama_batch_init", llamacpp_hidden._Batch, (8, 0, 1), None),
])
def test_the_struct_copies_have_the_librarys_layout(function, struct, args, defaults):
    """The structs passed by value (copied by hand from llama.h) against the library: it
    writes every byte of their fields and nothing past their size when it returns one (a
    struct grown or shrunk shows), each field reads back as the default llama.h gives it,
    both through that buffer and through the typed call (a field moved reads another's
    value), and the two parameter structs, which this build stores field by field, leave
    exactly the gaps between the fields alone (a field added into a gap shows)."""
    raw, written = _returned_bytes(function, *args)
    size = ctypes.sizeof(struct)
    fields = {i for name, *_ in struct._fields_
              for i in range(getattr(struct, name).offset,
                             getattr(struct, name).offset + getattr(struct, name).size)}
    assert fields <= written and max(written) < size, (sorted(fields - written), size)
    if defaults is not None:
        assert written == fields, sorted(written - fields)
    value = struct.from_buffer_copy(raw[:size])
    if defaults is not None:
        assert _fields(value) == defaults
        assert _fields(getattr(llamacpp_hidden.llama_api(), function)()) == defaults
        return
    api = llamacpp_hidden.llama_api()
    try:  # llama_batch_init(8 tokens, no embeddings, 1 sequence each)
        assert value.n_tokens == 0 and not value.embd
        assert all(bool(getattr(value, name)) for name in ("token", "pos", "n_seq_id",
                                                           "seq_id", "logits"))
        assert bool(value.seq_id[7]) and not value.seq_id[8]  # its end marker
    finally:
        api.llama_batch_free(value)


def test_the_ggml_type_trait_copies_read_the_librarys_values():
    """The trait structs read through pointers: Q8_0 and its CPU kernels as ggml defines
    them (a field moved would read another's value)."""
    api = llamacpp_hidden.llama_api()
    q8 = api.ggml_get_type_traits(GGML_Q8_0).contents
    assert (q8.type_name, q8.blck_size, q8.type_size, q8.is_quantized) == (b"q8_0", 32, 34, True)
    assert q8.to_float and q8.from_float_ref
    cpu = api.ggml_get_type_traits_cpu(GGML_Q8_0).contents
    assert cpu.from_float and cpu.vec_dot and cpu.vec_dot_type == GGML_Q8_0
    assert cpu.nrows in (1, 2)
    f32 = api.ggml_get_type_traits(llamacpp_hidden.GGML_F32).contents
    assert (f32.type_name, f32.blck_size, f32.type_size, f32.is_quantized) == (b"f32", 1, 4,
                                                                               False)


@pytest.mark.llm
def test_the_hidden_state_engine_prints_nothing_but_llama_cpps_errors(tmp_path):
    """In a process where the server never started (a planned round's worker), llama.cpp's
    default log would print every line of the model load and of each decode (half a
    megabyte on the quickstart's terminal); only its errors reach stderr."""
    script = ("from simpipe.inference.llamacpp.model_files import default_model_path\n"
              "from simpipe.inference.llamacpp.hidden import HiddenStateEngine\n"
              "e = HiddenStateEngine(default_model_path(), threads=1, n_ctx=512)\n"
              "e.hidden_after(e.tokenize('Round 3 of 5. My number:'))\n"
              "e.close()\n"
              "HiddenStateEngine(__import__('sys').argv[1], threads=1, n_ctx=512)\n")
    cut = tmp_path / "cut.gguf"
    with default_model_path().open("rb") as f:
        cut.write_bytes(f.read(20_000_000))  # a download cut short: llama.cpp says why
    proc = subprocess.run([sys.executable, "-c", script, str(cut)], capture_output=True,
                          text=True, timeout=120)
    assert "HiddenStateUnavailable" in proc.stderr  # the last line failed, as it must
    llama_lines = [line for line in proc.stderr.splitlines()
                   if not line.startswith(("Traceback", "  ", "simpipe.", "    "))]
    assert llama_lines and all("error" in line or "fail" in line or "Unavailable" in line
                               for line in llama_lines), llama_lines
    assert len(proc.stderr) < 4000, proc.stderr[:2000]


def test_the_gguf_block_sizes_are_the_linked_ggmls():
    """``GGML_BLOCKS`` (what a cut-short file is measured with) agrees with ggml's own type
    traits for every type it lists, and with the default model file's length."""
    api = llamacpp_hidden.llama_api()
    for kind, (block, size) in GGML_BLOCKS.items():
        traits = api.ggml_get_type_traits(kind).contents
        assert (traits.blck_size, traits.type_size) == (block, size), (kind, traits.type_name)
    path = default_model_path()
    _, tensors = _read_gguf(path, (), tensors=True)
    assert tensor_data_end(tensors) == path.stat().st_size


class _TokenizeCalls:
    """llama.cpp's calls as ``real`` makes them, each ``llama_tokenize``'s ``parse_special``
    recorded."""

    def __init__(self, real):
        self.real, self.special = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def llama_tokenize(self, vocab, raw, size, out, room, add_special, parse_special):
        self.special.append(parse_special)
        return self.real.llama_tokenize(vocab, raw, size, out, room, add_special,
                                        parse_special)


@pytest.mark.llm
def test_prompts_are_tokenized_as_with_special_tokens_parsed_searching_them_only_where_needed(
        request):
    """A text in which no control token can start (no ``<`` for Gemma) is tokenized without
    llama.cpp's search for them (seven times faster a prompt) and gets the same tokens; a
    chat turn, a control token's text, or any ``<`` is searched, and its control tokens are
    parsed."""
    engine = HiddenStateEngine(default_model_path(), threads=1, n_ctx=512)
    request.addfinalizer(engine.close)
    assert engine.control_starts() == {b"<"}
    api = engine.api
    texts = [*round3_prompts(4), "My number: 42.\n\nWinning numbers: 26.3, 24.87."]
    marked = ["<start_of_turn>user\nMy number?<end_of_turn>\n<start_of_turn>model\n",
              "x <unused7> y", "3 < 4 and 5 > 2", "<"]
    engine.api = watched = _TokenizeCalls(api)
    try:
        got = [engine.tokenize(t) for t in texts + marked]
    finally:
        engine.api = api
    assert watched.special == [False] * len(texts) + [True] * len(marked)

    def parsed(text):
        raw = text.encode()
        out = (ctypes.c_int32 * (len(raw) + 8))()
        n = api.llama_tokenize(engine._vocab, raw, len(raw), out, len(raw) + 8, True, True)
        return list(out[:n])

    assert got == [parsed(t) for t in texts + marked]
    turn = got[len(texts)]
    assert len(turn) < len(engine.tokenize(marked[0].replace("<", "(")))  # parsed: one id each
