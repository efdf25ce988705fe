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


#: Below this many agents the rows are walked one by one (numpy's per-call cost would exceed
#: the work); from it on, together (``draw_answers``): the same answers either way.
TOGETHER_FROM = 16


def draw_answers(node: NodeSource, shape: TreeShape, uniforms: np.ndarray) -> list[str | None]:
    """``draw_answer`` for each row of ``uniforms`` (agents x steps): the same answers, and
    ``node`` asked for the same prefixes in the same order, as walking the rows one by one.

    Walked one by one in Python, a million agents cost about 30 s of one core (a node's
    children sorted and summed again at every step of every agent). Here each node's
    children are summed once, and the agents move together, one step at a time, the
    agents at one node picking their children with one ``searchsorted``. Order matters
    for a lazy tree only where ``node`` is asked about a prefix for the first time (a
    probe, whose bits depend on what the chain evaluated before): so all agents are moved
    through the prefixes already asked; the first row, in row order, that needs one not
    asked yet is then walked alone, asking ``node`` as the one-by-one walk would at that
    row; and the rows still waiting move on again. A row's answer depends only on the
    nodes on its path, which never change once asked, so the order of the rows that need
    no new prefix is free."""
    if len(uniforms) < TOGETHER_FROM:
        return [draw_answer(node, shape, row) for row in uniforms]
    table = _Nodes(node, shape)
    out: list[str | None] = [None] * len(uniforms)
    waiting = np.arange(len(uniforms))
    while waiting.size:
        ended = table.move_known(uniforms, waiting)
        done = ended != _WAITS  # each row is told its answer once, in the pass it ends
        for row, end in zip(waiting[done].tolist(), ended[done].tolist(), strict=True):
            out[row] = table.answer(end)
        waiting = waiting[~done]
        if waiting.size:  # the first row that needs a prefix not asked yet, as one by one
            out[int(waiting[0])] = draw_answer(table.ask, shape, uniforms[waiting[0]])
            waiting = waiting[1:]
    return out


_WAITS = -1  # a row stopped at a prefix not asked yet
_NONE = -2  # a row whose walk reached a prefix ``node`` does not know: no answer


class _Nodes:
    """The prefixes the walks of one ``draw_answers`` reached, by index: each one's path and
    text, and, once ``node`` was asked about it, its children's token ids and cumulative
    weights (``pick``'s), so that each is sorted and summed once."""

    def __init__(self, node: NodeSource, shape: TreeShape) -> None:
        self.node, self.shape = node, shape
        self.paths: list[Path] = [()]
        self.texts: list[str] = [""]
        self.asked: dict[Path, tuple[np.ndarray, np.ndarray] | None] = {}
        self.index: dict[Path, int] = {(): 0}

    def ask(self, path: Path, text: str, reach: float) -> NextToken | None:
        """``node``, remembering its children for the walks that move together."""
        result = self.node(path, text, reach)
        if path not in self.asked:
            if result is None:
                self.asked[path] = None
            else:
                ids, cdf = _children(result)
                self.asked[path] = (np.array(ids, np.int64), cdf)
        return result

    def answer(self, end: int) -> str | None:
        return None if end == _NONE else self.texts[end]

    def _child(self, parent: int, tid: int) -> int:
        path = self.paths[parent] + (tid,)
        at = self.index.get(path)
        if at is None:
            at = self.index[path] = len(self.paths)
            self.paths.append(path)
            self.texts.append(self.texts[parent] + self.shape.vocab.pieces[tid])
        return at

    def move_known(self, uniforms: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Walk ``rows`` as far as the prefixes already asked take them: per row, the node
        its answer ends at (``_NONE``: no answer; ``_WAITS``: it stopped at a prefix not
        asked yet)."""
        shape, eog = self.shape, self.shape.vocab.eog_ids
        at = np.zeros(rows.size, np.int64)
        ended = np.full(rows.size, _WAITS, np.int64)
        moving = np.arange(rows.size)
        for step in range(shape.max_tokens):
            if not moving.size:
                break
            nodes, groups = np.unique(at[moving], return_inverse=True)
            still: list[np.ndarray] = []
            for k, n in enumerate(nodes.tolist()):
                members = moving[groups == k]
                path, text = self.paths[n], self.texts[n]
                if shape.ends_at(path, text):
                    ended[members] = n
                    continue
                if path not in self.asked:
                    continue  # waits for the row walked alone
                children = self.asked[path]
                if children is None:
                    ended[members] = _NONE
                    continue
                ids, cdf = children
                # pick()'s inverse CDF, for all of them at once
                u = uniforms[rows[members], step] * cdf[-1]
                picked = np.minimum(np.searchsorted(cdf, u, side="right"), len(ids) - 1)
                for i in np.unique(picked).tolist():
                    chosen = members[picked == i]
                    tid = int(ids[i])
                    if tid in eog:
                        ended[chosen] = n
                        continue
                    at[chosen] = self._child(n, tid)
                    still.append(chosen)
            moving = np.concatenate(still) if still else moving[:0]
        ended[moving] = at[moving]  # cut at the token limit
        return ended
