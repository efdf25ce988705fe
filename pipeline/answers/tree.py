"""Drawing one answer token by token from an answer tree: the one draw every shared answer
uses, whether the tree was probed in full or is probed lazily as agents walk it.

An answer tree's node is an answer prefix (token ids and their text); its children are the
tokens the grammar allows next, weighted as llama.cpp's grammar-constrained sampler would
return them (``simpipe.inference.llamacpp.sampler.next_token``). An agent's answer is a
walk from the root: at step ``s`` it takes the child that its ``s``-th uniform picks
(inverse CDF over the children in token-id order) until an end-of-generation token is
picked, nothing but one can follow, or ``max_tokens`` tokens are reached (the answer is cut
there, as a sampled call would be). With the same node distributions and the same
uniforms the walk gives the same answer whichever way the nodes were obtained, so a tree
probed in full and one probed only where walks go are interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.types import AnswerVocab, NextToken

Path = tuple[int, ...]
#: node(path, text, reach) -> the next-token distribution there, or None when it is unknown
#: (a pruned prefix of a full tree): the walk then gives no answer.
NodeSource = Callable[[Path, str, float], NextToken | None]


@dataclass(frozen=True)
class TreeShape:
    """What the grammar and the token limit say about a tree, without the model."""

    language: IntegerAnswers
    vocab: AnswerVocab
    max_tokens: int
    _valid: dict[str, frozenset[int]] = field(default_factory=dict, compare=False,
                                              repr=False)

    def valid(self, text: str) -> frozenset[int]:
        """The token ids the grammar accepts after ``text`` (end-of-generation included
        where the answer may end there)."""
        got = self._valid.get(text)
        if got is None:
            ids = {tid for tid, piece in self.vocab.pieces.items()
                   if self.language.is_prefix(text + piece)}
            if self.language.is_complete(text):
                ids |= self.vocab.eog_ids
            got = self._valid[text] = frozenset(ids)
        return got

    def ends_at(self, path: Path, text: str) -> bool:
        """Whether the answer ends at this prefix whatever the model says: the token
        limit is reached, or nothing but end-of-generation can follow."""
        return len(path) >= self.max_tokens or self.valid(text) <= self.vocab.eog_ids


def pick(result: NextToken, u: float) -> tuple[int, float]:
    """(token id, its probability) that uniform ``u`` in [0, 1) picks among the children:
    inverse CDF over the tokens with positive probability, in token-id order."""
    ids, cdf = _children(result)
    i = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(ids) - 1)
    return ids[i], float((cdf[i] - (cdf[i - 1] if i else 0.0)) / cdf[-1])


def _children(result: NextToken) -> tuple[list[int], np.ndarray]:
    ids = sorted(t for t, q in result.probs.items() if q > 0.0)
    return ids, np.cumsum(np.fromiter((result.probs[t] for t in ids), np.float64, len(ids)))


def draw_answer(node: NodeSource, shape: TreeShape, uniforms: np.ndarray) -> str | None:
    """One agent's answer: the walk its uniforms (one per step, at least ``max_tokens``)
    take through the tree; None when it reaches a prefix ``node`` does not know."""
    path: Path = ()
    text = ""
    reach = 1.0
    eog = shape.vocab.eog_ids
    for step in range(shape.max_tokens):
        if shape.ends_at(path, text):
            return text
        result = node(path, text, reach)
        if result is None:
            return None
        tid, q = pick(result, float(uniforms[step]))
        if tid in eog:
            return text
        path, text, reach = path + (tid,), text + shape.vocab.pieces[tid], reach * q
    return text  # cut at the token limit


def draw_answers(node: NodeSource, shape: TreeShape, uniforms: np.ndarray) -> list[str | None]:
    """``draw_answer`` for each row of ``uniforms`` (agents x steps), in row order."""
    return [draw_answer(node, shape, row) for row in uniforms]
