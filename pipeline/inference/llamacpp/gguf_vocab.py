"""The vocabulary facts answer sharing needs, read from a GGUF model file's metadata.

Two things cannot be learnt from a llama.cpp server's answers: which token ids end
generation (the grammar admits them once an answer is complete) and every token whose text
could be part of an answer (a digit can also come as a byte-fallback token such as
``<0x35>``). Both are in the GGUF header, read here without loading the weights.

The rules follow llama.cpp's vocabulary loader (``src/llama-vocab.cpp``): end-of-generation
tokens are the eos/eot/eom ids and the fill-in-the-middle pad/rep/sep ids from the metadata
plus every token whose text is one of llama.cpp's known end markers; a token's text
("piece") is what ``token_to_piece(id, special=true)`` renders: SentencePiece (``llama``)
vocabularies write spaces as U+2581 and bytes as ``<0xXX>``; byte-level BPE (``gpt2``)
vocabularies map bytes to printable characters (GPT-2's table).
"""

from __future__ import annotations

import functools
import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simpipe.inference.types import EOG_TEXTS, AnswerVocab

_MAGIC = b"GGUF"
# GGUF value types: fixed-size ones by struct format; 8 = string, 9 = array.
_ARRAY = 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_WANTED = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
           "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
           "tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id",
           "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id")
_TYPE_BYTE = 6  # llama.cpp's LLAMA_TOKEN_TYPE_BYTE
# ggml types (ggml.h's ``enum ggml_type``) -> (values per block, bytes per block): what a
# tensor's data takes in the file. A type not listed is not checked. The test suite checks
# every entry against the type traits of the ggml that xllamacpp links.
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
               8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
               13: (256, 176), 14: (256, 210), 15: (256, 292), 20: (32, 18), 23: (256, 136),
               24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}


class GgufError(ValueError):
    """The file is not a GGUF model or lacks the vocabulary metadata."""


def _read_gguf(path: Path, wanted: tuple[str, ...], tensors: bool = False,
               scalars: bool = False
               ) -> tuple[dict[str, object], dict[str, tuple[tuple[int, ...], int, int]]]:
    """(the ``wanted`` metadata keys, with ``scalars`` every key whose value is no array
    too, and with ``tensors`` each tensor's (dims, ggml type, absolute offset of its data in
    the file)) of a GGUF file; GgufError for a file that is none, or whose metadata is
    damaged or cut short (read past its end)."""
    meta, layout = _parse_checked(path, wanted, tensors, scalars)
    return meta, layout.tensors


def _parse_checked(path: Path, wanted: tuple[str, ...], tensors: bool, scalars: bool = False
                   ) -> tuple[dict[str, object], GgufLayout]:
    try:
        return _parse_gguf(path, wanted, tensors, scalars)
    except GgufError:
        raise
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as exc:
        raise GgufError(f"{path}: its GGUF metadata is damaged or cut short "
                        f"({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class GgufLayout:
    """Where a GGUF file's parts lie: the metadata ends (and the tensor list starts) at
    ``info_start``; each tensor's data at its absolute offset, from ``data_start`` on, every
    tensor aligned to ``alignment`` bytes."""

    info_start: int
    data_start: int
    alignment: int
    tensors: dict[str, tuple[tuple[int, ...], int, int]]  # name -> (dims, type, offset)


def tensor_layout(path: Path) -> GgufLayout:
    """Where the metadata ends and each tensor's data lies in a GGUF file (GgufError as
    ``_read_gguf``)."""
    return _parse_checked(path, (), True)[1]


def _parse_gguf(path: Path, wanted: tuple[str, ...], tensors: bool, scalars: bool
                ) -> tuple[dict[str, object], GgufLayout]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            raise GgufError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise GgufError(f"{path}: GGUF version {version} is too old (need 2 or later)")
        pos = 24
        out: dict[str, object] = {}

        def string(at: int) -> tuple[bytes, int]:
            (n,) = struct.unpack_from("<Q", buf, at)
            return buf[at + 8: at + 8 + n], at + 8 + n

        def value(kind: int, at: int, keep: bool) -> tuple[object, int]:
            if kind in _SCALARS:
                fmt = "<" + _SCALARS[kind]
                return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
            if kind == 8:
                raw, at = string(at)
                return raw, at
            if kind == _ARRAY:
                item, n = struct.unpack_from("<IQ", buf, at)
                at += 12
                if item in _NUMPY:
                    size = np.dtype(_NUMPY[item]).itemsize * n
                    arr = np.frombuffer(buf[at: at + size], _NUMPY[item]) if keep else None
                    return arr, at + size
                if item == 8:
                    return _strings(buf, at, n, keep)
                items = []
                for _ in range(n):
                    v, at = value(item, at, keep)
                    if keep:
                        items.append(v)
                return items, at
            raise GgufError(f"{path}: unknown GGUF value type {kind}")

        alignment = 32  # GGUF's default
        for _ in range(n_kv):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", buf, pos)
            name = key.decode("utf-8", "replace")
            keep = name in wanted or name == "general.alignment"
            val, pos = value(kind, pos + 4, keep)
            if name == "general.alignment" and isinstance(val, int) and val > 0:
                alignment = val
            if name in wanted or (scalars and kind != _ARRAY):
                out[name] = val
        infos: dict[str, tuple[tuple[int, ...], int, int]] = {}
        info_start = data_start = pos
        if tensors:
            for _ in range(n_tensors):
                raw_name, pos = string(pos)
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
                pos += 4 + 8 * n_dims
                kind, offset = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                infos[raw_name.decode("utf-8", "replace")] = (tuple(dims), kind, offset)
            data_start = -(-pos // alignment) * alignment
            infos = {k: (d, t, data_start + o) for k, (d, t, o) in infos.items()}
        return out, GgufLayout(info_start, data_start, alignment, infos)


_LENGTH = struct.Struct("<Q").unpack_from


def _strings(buf: mmap.mmap, at: int, n: int, keep: bool) -> tuple[list[bytes] | None, int]:
    """An array of ``n`` GGUF strings from ``at`` (each a length, then its bytes), as a list
    of bytes when ``keep``; the position after it. One loop, not a call per string: a
    vocabulary has 262,144 of them, read (or stepped over) by every worker process."""
    if not keep:
        for _ in range(n):
            at += 8 + _LENGTH(buf, at)[0]
        return None, at
    items = []
    for _ in range(n):
        size = _LENGTH(buf, at)[0]
        at += 8
        items.append(buf[at:at + size])
        at += size
    return items, at


@dataclass(frozen=True)
class OutputMatrix:
    """Where a GGUF model's output projection (the ``lm_head``) lies: the rows that turn
    the last hidden state into one logit per token."""

    name: str  # "output.weight", or "token_embd.weight" when the two are tied
    ggml_type: int
    n_embd: int
    n_vocab: int
    offset: int  # of row 0 in the file
    architecture: str
    # Gemma 2 style tanh capping of the logits (0: none), from the metadata
    final_logit_softcapping: float


def output_matrix(model_path: str) -> OutputMatrix:
    """The output projection of a GGUF model: ``output.weight``, else the token embeddings
    (llama.cpp ties them when the file has no output tensor)."""
    path = Path(model_path)
    # One read: the softcap's key names the architecture, which the same metadata holds
    # (a second read stepped over the 262,144 token strings again: 70 ms per worker).
    meta, tensors = _read_gguf(path, (), tensors=True, scalars=True)
    arch = meta.get("general.architecture", b"")
    arch = arch.decode() if isinstance(arch, bytes) else str(arch)
    softcap_key = f"{arch}.final_logit_softcapping"
    for name in ("output.weight", "token_embd.weight"):
        if name in tensors:
            dims, kind, offset = tensors[name]
            if len(dims) != 2:
                raise GgufError(f"{model_path}: {name} has {len(dims)} dimensions, not 2")
            softcap = meta.get(softcap_key, 0.0)
            return OutputMatrix(name, kind, int(dims[0]), int(dims[1]), offset, arch,
                                float(softcap) if isinstance(softcap, float | int) else 0.0)
    raise GgufError(f"{model_path}: neither output.weight nor token_embd.weight in the file")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


#: EOG_TEXTS as a token's bytes in the file (a token whose bytes are not UTF-8 decodes to
#: text with U+FFFD, which is none of them).
_EOG_BYTES = frozenset(text.encode() for text in EOG_TEXTS)


def _spm_answer_text(allowed: set[bytes]) -> Callable[[bytes], re.Match | None]:
    """A test of a SentencePiece token's bytes: whether its piece can consist of ``allowed``
    bytes alone (each such byte, or U+2581 where a space is allowed: ``_piece`` renders it
    as one). Byte tokens (``<0xXX>``) are not covered: their text is not their piece."""
    singles = sorted(b[0] for b in allowed if len(b) == 1)
    units = [re.escape(bytes([b])) for b in singles]
    if b" " in allowed:
        units.append(re.escape("\u2581".encode()))
    if not units:
        return lambda raw: None
    return re.compile(b"(?:" + b"|".join(units) + b")+").fullmatch


def _piece(text: str, kind: int, model: str, gpt2: dict[str, int]) -> bytes:
    if model == "gpt2":
        try:
            return bytes(gpt2[c] for c in text)
        except KeyError:
            return text.encode("utf-8")
    if kind == _TYPE_BYTE and len(text) == 6 and text.startswith("<0x"):
        return bytes([int(text[3:5], 16)])
    return text.replace("\u2581", " ").encode("utf-8")


def tensor_data_end(tensors: dict[str, tuple[tuple[int, ...], int, int]]) -> int:
    """The byte where the last tensor's data ends (0 when no tensor's size is known): a
    file shorter than this is cut short."""
    end = 0
    for dims, kind, offset in tensors.values():
        block = GGML_BLOCKS.get(kind)
        if block is None:
            continue
        values = int(np.prod(dims, dtype=np.float64)) if dims else 1
        end = max(end, offset + values // block[0] * block[1])
    return end


@functools.lru_cache(maxsize=4)
def answer_vocab(model_path: str, alphabet: frozenset[str]) -> AnswerVocab:
    """End-of-generation ids and every token whose text is drawn from ``alphabet``;
    GgufError for a file that is no model or is cut short (what a planned round reads
    first: it says so before anything loads the weights)."""
    path = Path(model_path)
    meta, tensors = _read_gguf(path, _WANTED, tensors=True)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise GgufError(f"{path}: cannot read it ({exc.strerror})") from None
    end = tensor_data_end(tensors)
    if end > size:
        raise GgufError(f"{path}: the file is cut short: its tensors need {end:,} bytes, it "
                        f"has {size:,} (an interrupted download or copy?)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GgufError(f"{model_path}: no tokenizer.ggml.tokens in the GGUF metadata")
    model = meta.get("tokenizer.ggml.model", b"llama")
    model = model.decode() if isinstance(model, bytes) else str(model)
    types = meta.get("tokenizer.ggml.token_type")
    kinds = types.tolist() if isinstance(types, np.ndarray) else [1] * len(tokens)
    gpt2 = _gpt2_byte_decoder() if model == "gpt2" else {}
    allowed = {c.encode() for c in alphabet}
    eog: set[int] = set()
    for key in _WANTED[3:]:
        tid = meta.get(key)
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            eog.add(tid)
    pieces: dict[int, str] = {}
    may_answer = None if gpt2 else _spm_answer_text(allowed)
    for tid, raw in enumerate(tokens):
        if raw in _EOG_BYTES:
            eog.add(tid)
            continue
        # Most of a vocabulary cannot render as answer text: stepped over without decoding
        # (what ``_piece`` would give for them has a byte outside ``allowed``).
        if may_answer is not None and kinds[tid] != _TYPE_BYTE and not may_answer(raw):
            continue
        text = raw.decode("utf-8", "replace")
        piece = _piece(text, kinds[tid], model, gpt2)
        if piece and all(bytes([b]) in allowed for b in piece):
            pieces[tid] = piece.decode("ascii")
    return AnswerVocab(len(tokens), frozenset(eog), pieces)
