"""The distribution of a constrained answer, computed once per distinct prompt.

Agents whose prompts are identical are exchangeable: drawing each one's answer from the
model's answer distribution for that prompt is, in distribution, the same as one sampled
call per agent. For a short constrained answer (an integer in ``[low, high]``, written token
by token under the grammar) that distribution is a small tree: each node is an answer
prefix, its children the tokens the grammar allows next, weighted by what llama.cpp's
grammar-constrained sampler would return there
(``simpipe.inference.llamacpp.sampler.next_token``). A leaf is an answer: the prefix at
which an end-of-generation token is chosen, or the prefix reached at ``max_tokens`` (the
answer is cut there, as a sampled call would be).

The model is asked once per node for its raw top-``n`` next-token log-probabilities
(``probe``). Two things cost probability mass the computation does not see, and both are
counted in ``unseen_mass``, an upper bound on the total-variation distance between the
computed and the true answer distribution: valid tokens outside the top ``n`` (bounded per
node, see ``next_token``), and prefixes reached with probability below ``prune_below``,
which are not expanded.

Nodes are visited one at a time in a fixed order, so a deterministic probe (one sequence per
model call; see ``LlamaCppBackend.next_token_logprobs``) gives a bit-identical result on
every run.

``LazyTree`` is the same tree probed only where agents' draws go (``simpipe.answers.tree``): each
node is asked once, when the first walk reaches it, so one agent costs ~3 probes and many
agents converge on the full tree. Agents draw from a full ``AnswerDistribution`` with the
same walk (``AnswerDistribution.walk``), so both give the same answer for the same node
distributions and uniforms.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from simpipe.answers.tree import Path, TreeShape, draw_answers
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.llamacpp.sampler import next_token
from simpipe.inference.types import AnswerVocab, ChainSettings, NextToken, Probe, TopLogprobs

#: sampler(top, valid, n_unseen_valid, settings) -> NextToken | None: a server's sampler model
Sampler = Callable[[TopLogprobs, frozenset[int] | set[int], int, ChainSettings],
                   NextToken | None]

DEFAULT_TOP_N = 256  # measured: 24 ms per call against 22 ms for 64 (Gemma 3 270M, cached)
RETRY_TOP_N = 4096  # asked again at the prefixes whose first top n leave too much unseen
# Measured per call (Gemma 3 270M, 2 threads, prompt cached): top 256: 25 ms, 1024: 32 ms,
# 4096: 55 ms. The root admits a space and the ten digits. After an answer cue the space
# takes nearly all the mass, so the digits sit below the top 256 and bound 2-3e-4 of the
# answer mass as unseen, over the allowance, on every prompt measured (12 round-3 prompts
# of the paper's population); the top 1024 bound 2-3e-5. Asking the root for 1024 at once
# costs one call of 32 ms instead of two (25 + 55 ms): docs/measurements.md.
ROOT_TOP_N = 1024


def first_top_n(path: tuple[int, ...]) -> int:
    """How many tokens a prefix is asked for first."""
    return DEFAULT_TOP_N if path else ROOT_TOP_N


PRUNE_BELOW = 1e-7
MAX_PASSES = 4


@dataclass(frozen=True)
class AnswerDistribution:
    """Answer texts (sorted) and their probabilities, with what computing them cost, and
    the tree's node distributions that agents walk (``walk``)."""

    texts: tuple[str, ...]
    probs: np.ndarray
    unseen_mass: float
    calls: int
    tokens_in: int
    tokens_out: int
    shape: TreeShape | None = None
    nodes: Mapping[Path, NextToken] = field(default_factory=dict)
    # The answer mass under prefixes left unprobed as too unlikely (``prune_below``): an
    # agent whose walk goes there is not answered by this tree (a lazy walk of its own on the
    # embedded engine, else a call of its own).
    pruned_mass: float = 0.0

    def walk(self, uniforms: np.ndarray) -> list[str | None]:
        """Each agent's answer for its row of per-step uniforms (``simpipe.answers.tree``), the
        same draw as a ``LazyTree`` of the same prompt; None for an agent whose walk
        reaches a prefix too unlikely to have been probed (below ``PRUNE_BELOW``)."""
        if self.shape is None:
            raise ValueError("this distribution has no tree to walk")
        return draw_answers(lambda path, text, reach: self.nodes.get(path), self.shape,
                            uniforms)

    def answers_for(self, agent_ids: np.ndarray, uniforms: np.ndarray) -> list[str | None]:
        """What a partition's agents on this prompt answer: each walks the tree with its
        own uniforms (``walk``); the ids are not needed (``WalkedAnswers`` needs them)."""
        return self.walk(uniforms)


@dataclass(frozen=True)
class WalkedAnswers:
    """A prompt's agents of the whole round, walked lazily once by the round plan (a
    ``LazyTree`` probed only where their draws went): each agent's answer by its id (None:
    its walk reached a prefix the tree could not pin down) and what the walks cost. The
    same answers as walking the prompt in each partition, at one evaluation of the prompt
    instead of one per partition that holds it."""

    agent_ids: np.ndarray  # sorted
    texts: tuple[str | None, ...]  # per id
    unseen_mass: float
    calls: int
    tokens_in: int
    tokens_out: int

    def answers_for(self, agent_ids: np.ndarray, uniforms: np.ndarray) -> list[str | None]:
        """The answers of ``agent_ids`` (all walked by the plan; one that was not, which a
        correct plan never asks for, gets None: a call of its own)."""
        at = np.searchsorted(self.agent_ids, agent_ids)
        at = np.minimum(at, max(self.agent_ids.size - 1, 0))
        return [self.texts[i] if self.agent_ids.size and self.agent_ids[i] == a else None
                for i, a in zip(at.tolist(), agent_ids.tolist(), strict=True)]


class TooMuchUnseen(RuntimeError):
    """The listed tokens do not pin the distribution down to the allowed error."""

    def __init__(self, message: str, cost: Cost) -> None:
        super().__init__(message)
        self.cost = cost


@dataclass
class Cost:
    """Model calls and tokens spent, failed attempts included."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0


class _Walk:
    """One prompt's tree, probed through a memo so that a second pass re-asks only the
    prefixes it asks for with more tokens."""

    def __init__(self, probe: Probe, shape: TreeShape, settings: ChainSettings,
                 prune_below: float, sampler: Sampler = next_token) -> None:
        self.probe, self.shape, self.sampler = probe, shape, sampler
        self.settings, self.prune_below = settings, prune_below
        self.cost = Cost()
        self.pruned_mass = 0.0  # of the last run
        self._memo: dict[tuple[tuple[int, ...], int], TopLogprobs] = {}

    def _top(self, path: tuple[int, ...], top_n: int) -> TopLogprobs:
        key = (path, top_n)
        top = self._memo.get(key)
        if top is None:
            top, evaluated, generated = self.probe(path, top_n)
            self.cost.calls += 1
            self.cost.tokens_in += evaluated
            self.cost.tokens_out += generated
            self._memo[key] = top
        return top

    def node(self, path: Path, text: str, top_n: int) -> tuple[NextToken, int]:
        """(the next-token distribution after ``path``, how many tokens decided it): from
        its top ``top_n`` tokens, or ``RETRY_TOP_N`` when fewer do not decide it."""
        valid = self.shape.valid(text)
        for n in sorted({top_n, RETRY_TOP_N}):
            top = self._top(path, n)
            seen = set(top.ids)
            result = self.sampler(top, valid, sum(t not in seen for t in valid),
                                  self.settings)
            if result is not None:
                return result, n
        raise TooMuchUnseen(f"prefix {text!r}: even the top {RETRY_TOP_N} tokens "
                            "do not decide the next token", self.cost)

    def run(self, wide: frozenset[tuple[int, ...]]
            ) -> tuple[dict[str, float], float, dict[tuple[int, ...], float],
                       dict[Path, NextToken]]:
        """(answers, unseen mass, each probed prefix's share of the unseen mass, each
        probed prefix's next-token distribution); the prefixes in ``wide`` are asked for
        ``RETRY_TOP_N`` tokens, the others fewer. Prefixes reached with less than
        ``prune_below`` are left out (``pruned_mass``): no error, walks there get calls."""
        answers: dict[str, float] = defaultdict(float)
        unseen = pruned = 0.0
        shares: dict[tuple[int, ...], float] = {}
        nodes: dict[Path, NextToken] = {}
        vocab = self.shape.vocab
        # Breadth first, children in token-id order: a fixed visiting order.
        frontier: list[tuple[tuple[int, ...], str, float]] = [((), "", 1.0)]
        while frontier:
            next_frontier = []
            for path, text, reach in frontier:
                if self.shape.ends_at(path, text):
                    answers[text] += reach  # cut at the token limit, or nothing can follow
                    continue
                if reach < self.prune_below:
                    pruned += reach
                    continue
                result, _ = self.node(path, text,
                                      RETRY_TOP_N if path in wide else first_top_n(path))
                nodes[path] = result
                shares[path] = reach * result.error_bound
                unseen += shares[path]
                for tid, q in sorted(result.probs.items()):
                    if q <= 0.0:
                        continue
                    if tid in vocab.eog_ids:
                        answers[text] += reach * q
                    else:
                        next_frontier.append((path + (tid,), text + vocab.pieces[tid],
                                              reach * q))
            frontier = next_frontier
        self.pruned_mass = pruned
        return answers, unseen, shares, nodes


class LazyTree:
    """One prompt's answer tree, each node probed when the first draw reaches it.

    A node whose unseen tokens could move more than half of ``max_unseen`` of the answer
    mass through it (its reach times its error bound) is asked again with ``RETRY_TOP_N``
    tokens; one that even those do not decide raises TooMuchUnseen (with the cost spent).
    ``unseen_mass`` sums reach times error over the nodes probed: the error of the draws
    made, at most.
    """

    def __init__(self, probe: Probe, shape: TreeShape, settings: ChainSettings,
                 max_unseen: float = 1e-4, sampler: Sampler = next_token) -> None:
        self.shape = shape
        self.max_unseen = max_unseen
        self.nodes: dict[Path, NextToken] = {}
        self.unseen_mass = 0.0
        self._walk = _Walk(probe, shape, settings, 0.0, sampler)

    @property
    def cost(self) -> Cost:
        return self._walk.cost

    def node(self, path: Path, text: str, reach: float) -> NextToken:
        got = self.nodes.get(path)
        if got is None:
            got, n = self._walk.node(path, text, first_top_n(path))
            if reach * got.error_bound > self.max_unseen / 2 and n < RETRY_TOP_N:
                got, n = self._walk.node(path, text, RETRY_TOP_N)
            if reach * got.error_bound > self.max_unseen:
                raise TooMuchUnseen(f"prefix {text!r}: {reach * got.error_bound:.2g} of the "
                                    f"answer mass stays unseen (allowed: {self.max_unseen:g})",
                                    self.cost)
            self.nodes[path] = got
            self.unseen_mass += reach * got.error_bound
        return got

    def walk(self, uniforms: np.ndarray) -> list[str]:
        """Each agent's answer for its row of per-step uniforms, probing as needed."""
        return draw_answers(self.node, self.shape, uniforms)  # type: ignore[return-value]


def answer_distribution(probe: Probe, language: IntegerAnswers, vocab: AnswerVocab,
                        settings: ChainSettings, max_tokens: int, *,
                        max_unseen: float = 1e-4,
                        prune_below: float = PRUNE_BELOW,
                        sampler: Sampler = next_token) -> AnswerDistribution:
    """The answer distribution of one prompt; raises TooMuchUnseen (with the cost spent)
    when more than ``max_unseen`` of it cannot be pinned down. Prefixes reached with less
    than ``prune_below`` are not probed (``AnswerDistribution.pruned_mass``).

    First every prefix is asked for its top ``DEFAULT_TOP_N`` tokens; while that leaves too
    much unseen, the prefixes that contribute most are asked again for ``RETRY_TOP_N``
    (until the rest would fit in half the allowance) and the tree is walked again.
    """
    shape = TreeShape(language, vocab, max_tokens)
    walk = _Walk(probe, shape, settings, prune_below, sampler)
    wide: set[tuple[int, ...]] = set()
    answers, unseen, shares, nodes = walk.run(frozenset())
    # Widening a prefix can reveal children that were unseen before, so repeat (a few
    # passes; each re-asks only prefixes not asked before).
    for _ in range(MAX_PASSES - 1):
        if unseen <= max_unseen:
            break
        left = unseen
        added = False
        for path, share in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])):
            if left <= max_unseen / 2:
                break
            if path not in wide:
                wide.add(path)
                added = True
            left -= share
        if not added:
            break
        answers, unseen, shares, nodes = walk.run(frozenset(wide))
    if unseen > max_unseen:
        raise TooMuchUnseen(f"{unseen:.2g} of the answer distribution stays unseen "
                            f"(allowed: {max_unseen:g})", walk.cost)
    texts = tuple(sorted(answers))
    c = walk.cost
    return AnswerDistribution(texts, np.array([answers[t] for t in texts]), unseen, c.calls,
                              c.tokens_in, c.tokens_out, shape, nodes, walk.pruned_mass)
