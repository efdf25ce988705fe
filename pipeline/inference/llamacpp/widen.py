"""A GGUF model's Q5_0 weights rewritten as Q8_0: the same numbers, a faster kernel.

Gemma 3 270M's rows are 640 values long, not a multiple of the 256 that k-quants need, so
its "Q4_K_M" file stores most matrices (attention q/k/v, the feed-forward gate and up:
63 M of the ~100 M weights a token passes through) as Q5_0. On CPUs with AVX2, llama.cpp
multiplies Q5_0 and Q8_0 matrices with the same kernel (llamafile's ``tinyBLAS_Q0_AVX``),
which unpacks each 32-value block to 32 signed bytes and multiplies them with the
activations, themselves quantised to Q8_0 either way; a Q8_0 block is already those bytes.

A Q5_0 block is a float16 scale ``d`` and 32 five-bit values ``q - 16`` (``-16..15``); a Q8_0
block is a float16 scale and 32 signed bytes. Writing the same ``d`` and the same values
as bytes represents every weight exactly, and the kernel then computes the same products
in the same order: the engine's hidden states are bit-identical
(``tests/inference/llamacpp/test_widen.py``), so are a run's guesses, and the model work
takes less time (docs/benchmarks.md, "Q5_0 weights read as Q8_0"). The price is disk and
memory: 277 MB instead of 253 MB for the default model.

Only the shipped default model is widened (``backend.engine_model_path``), into a file of
its own beside it whose hash is pinned here; a model named in ``agents.llamacpp.model_path``
is loaded as given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simpipe.inference.llamacpp.gguf_vocab import GGML_BLOCKS, GgufError, tensor_layout

Q5_0, Q8_0 = 6, 8  # ggml.h's enum ggml_type
_Q5_0_BLOCK = 22  # float16 d, 4 bytes of high bits, 16 bytes of low nibbles
_Q8_0_BLOCK = 34  # float16 d, 32 signed bytes


def q5_0_as_q8_0(raw: bytes | memoryview) -> bytes:
    """Q5_0 blocks rewritten as Q8_0 blocks of the same values (ggml's
    ``dequantize_row_q5_0``: value ``j`` of 0..15 is the low nibble of byte ``j`` with bit
    ``j`` of ``qh`` as its fifth bit, value ``j + 16`` the high nibble with bit ``j + 16``,
    each less 16)."""
    blocks = np.frombuffer(raw, np.uint8)
    if blocks.size % _Q5_0_BLOCK:
        raise ValueError(f"{blocks.size} bytes are not whole Q5_0 blocks of {_Q5_0_BLOCK}")
    blocks = blocks.reshape(-1, _Q5_0_BLOCK)
    qh = blocks[:, 2:6].copy().view("<u4")[:, 0].astype(np.uint32)
    low = blocks[:, 6:22]
    j = np.arange(16, dtype=np.uint32)
    high_lo = (((qh[:, None] >> j) & 1) << 4).astype(np.int16)
    high_hi = (((qh[:, None] >> (j + 16)) & 1) << 4).astype(np.int16)
    first = (low & 0x0F).astype(np.int16) | high_lo
    second = (low >> 4).astype(np.int16) | high_hi
    values = (np.concatenate([first, second], axis=1) - 16).astype(np.int8)
    out = np.empty((blocks.shape[0], _Q8_0_BLOCK), np.uint8)
    out[:, :2] = blocks[:, :2]  # the same float16 scale
    out[:, 2:] = values.view(np.uint8)
    return out.tobytes()


def widen_q5_0(src: Path, dst: Path) -> int:
    """Write ``src`` to ``dst`` with every Q5_0 tensor stored as Q8_0 (metadata and every
    other tensor byte for byte); the number of tensors rewritten (the caller makes the
    write atomic: ``backend._made_once``). GgufError, before ``dst`` is opened, for a file
    that is no GGUF model or is cut short."""
    layout = tensor_layout(src)
    order = sorted(layout.tensors.items(), key=lambda item: item[1][2])
    size = src.stat().st_size
    align = layout.alignment
    plan: list[tuple[str, tuple[int, ...], int, int, int]] = []  # name, dims, type, at, n
    for k, (name, (dims, kind, offset)) in enumerate(order):
        # A tensor's bytes run to the next tensor (alignment padding included) or the end.
        stop = order[k + 1][1][2] if k + 1 < len(order) else size
        if kind == Q5_0:
            values = int(np.prod(dims, dtype=np.int64))
            if dims[0] % GGML_BLOCKS[Q5_0][0]:
                raise GgufError(f"{src}: Q5_0 tensor {name} has rows of {dims[0]} values, "
                                "not whole blocks of 32")
            stop = offset + values // 32 * _Q5_0_BLOCK
        if stop > size or stop < offset:
            raise GgufError(f"{src}: the file is cut short in tensor {name}")
        plan.append((name, dims, kind, offset, stop - offset))
    # New offsets in data order; the tensor list keeps the source's order.
    new_offset: dict[str, int] = {}
    at = 0
    for name, _, kind, _, length in plan:
        at = -(-at // align) * align
        new_offset[name] = at
        at += length // _Q5_0_BLOCK * _Q8_0_BLOCK if kind == Q5_0 else length
    infos = bytearray()
    for name, (dims, kind, _) in layout.tensors.items():
        key = name.encode("utf-8")
        infos += len(key).to_bytes(8, "little") + key + len(dims).to_bytes(4, "little")
        infos += b"".join(int(d).to_bytes(8, "little") for d in dims)
        infos += (Q8_0 if kind == Q5_0 else kind).to_bytes(4, "little")
        infos += new_offset[name].to_bytes(8, "little")
    widened = 0
    with src.open("rb") as f, dst.open("wb") as out:
        out.write(f.read(layout.info_start))  # header and metadata, unchanged
        out.write(infos)
        out.write(b"\0" * (-out.tell() % align))
        base = out.tell()
        for name, _, kind, offset, length in plan:
            out.write(b"\0" * (base + new_offset[name] - out.tell()))
            f.seek(offset)
            data = f.read(length)
            if kind == Q5_0:
                data = q5_0_as_q8_0(data)
                widened += 1
            out.write(data)
    return widened
