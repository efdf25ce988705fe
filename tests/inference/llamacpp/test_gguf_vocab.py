"""The answer vocabulary read from the GGUF file: the fast path (a byte-level test before
any token is decoded, the vocabulary's strings read in one loop) keeps exactly the tokens
the plain rule keeps, decoding and rendering every one of the 262,144, for any alphabet."""

from __future__ import annotations

import pytest

from simpipe.inference.llamacpp.gguf_vocab import (
    _TYPE_BYTE,
    _WANTED,
    _piece,
    _read_gguf,
    answer_vocab,
)
from simpipe.inference.llamacpp.model_files import default_model_path
from simpipe.inference.types import EOG_TEXTS


def _plain_rule(tokens: list[bytes], kinds: list[int], alphabet: str) -> tuple[dict, set]:
    """Every token decoded and rendered as llama.cpp renders a SentencePiece piece."""
    allowed = {c.encode() for c in alphabet}
    pieces, eog = {}, set()
    for tid, raw in enumerate(tokens):
        text = raw.decode("utf-8", "replace")
        if text in EOG_TEXTS:
            eog.add(tid)
            continue
        piece = _piece(text, kinds[tid], "llama", {})
        if piece and all(bytes([b]) in allowed for b in piece):
            pieces[tid] = piece.decode("ascii")
    return pieces, eog


@pytest.fixture(scope="module")
def vocabulary() -> tuple[list[bytes], list[int]]:
    meta, _ = _read_gguf(default_model_path(), _WANTED)
    assert meta["tokenizer.ggml.model"] == b"llama"  # Gemma's SentencePiece vocabulary
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"].tolist()
    assert len(tokens) == 262_144 and kinds.count(_TYPE_BYTE) == 256
    return tokens, kinds


@pytest.mark.parametrize("alphabet", ["0123456789", " 0123456789", " -.0123456789",
                                      " +,-.0123456789eE", "abc xyz", "<>x0", "é1 ", ""])
def test_the_fast_path_keeps_what_the_plain_rule_keeps(vocabulary, alphabet: str) -> None:
    tokens, kinds = vocabulary
    want_pieces, eog_by_text = _plain_rule(tokens, kinds, alphabet)
    got = answer_vocab.__wrapped__(str(default_model_path()), frozenset(alphabet))
    assert got.n_tokens == len(tokens)
    assert got.pieces == want_pieces
    assert eog_by_text <= got.eog_ids  # and the ids the metadata names
    if "0" in alphabet:  # a digit comes as its own token and as a byte token (<0x30>)
        assert sum(p == "0" for p in got.pieces.values()) == 2
