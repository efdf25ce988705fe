"""Answers drawn from one distribution per distinct prompt, instead of one call per agent.

When sharing applies (``sharing_refusal`` returns None), a partition groups its agents by
their exact prompt; each distinct prompt's answer distribution comes from this worker
process's cache, or is computed once (``simpipe.answers.distribution``) and cached
for every partition this process plays; each agent then draws its own answer with its own
seed. Two partitions needing the same prompt at the same time compute it once. Where the
round is planned (``simpipe.answers.round_plan``) the distributions come with the turn
(``Turn.planned``), computed once for the round, and this rule applies to the round's count.

Cost accounting: the tokens a computation spent are split (whole tokens, largest
remainder) over the agents of the partition that computed it; agents that reused a
distribution already in the cache show 0. Column sums per round are the tokens really spent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from simpipe.answers.distribution import (
    PRUNE_BELOW,
    AnswerDistribution,
    Cost,
    LazyTree,
    TooMuchUnseen,
    WalkedAnswers,
    answer_distribution,
)
from simpipe.answers.tree import TreeShape
from simpipe.config.backends import BACKENDS
from simpipe.core.seeds import GOLDEN, splitmix64
from simpipe.games.answer_format import IntegerAnswers
from simpipe.games.config import AnyGameConfig
from simpipe.inference.base import Backend
from simpipe.inference.types import ChainSettings, Probe, ProbeError

_DRAW_STREAM = np.uint64(0xD1B54A32D192ED03)
_STEP_STREAM = np.uint64(0x94D049BB133111EB)


def sharing_refusal(share_answers: str, game: AnyGameConfig, backend_name: str,
                    backend_can: bool, prompt_style: str) -> str | None:
    """Why agents cannot draw from shared answer distributions; None when they can."""
    if share_answers == "off":
        return 'agents.share_answers = "off"'
    if game.prompt == "cot":
        return 'chain-of-thought answers are free text (game.prompt = "cot")'
    if game.free_text_answer:
        return "the answers are free text ending in the number (game.predict_others)"
    if not backend_can:
        # Why: each back-end's ``share_limit`` (docs/shared-answers.md, "What each back-end
        # can expose").
        return f"the {backend_name} back-end cannot: " + BACKENDS[backend_name].share_limit
    if prompt_style != "completion":
        return "chat prompts are templated by the server, so their tokens are unknown here"
    return None


# What deciding a prompt costs on the embedded engine, measured on 2 cores (Gemma 3 270M,
# xllamacpp, threads = 2; docs/measurements.md): a fresh prompt evaluation ~200 ms; a one-token
# probe on a cached prefix ~14 ms (exact answer logits; 9 ms on one thread, 27-35 ms through
# the server's top-n); a full answer tree ~22 probes; a lazy walk ~3 probes for its first
# agent.
FRESH_PROMPT_S = 0.200
PROBE_S = 0.014
FULL_TREE_PROBES = 22
FIRST_WALK_PROBES = 3


def full_tree_pays(agents_on_prompt: int) -> bool:
    """Whether a prompt with this many agents of a partition is answered from a canonical
    full tree (the process's cache, which the worker's other partitions reuse) instead of
    a lazy walk in the partition's chain: where rounds are not planned (a population mixed
    by model). A planned round walks every prompt once for the whole round
    (``simpipe.answers.round_plan.layout``).

    A canonical tree costs a fresh evaluation plus every node (FRESH_PROMPT_S +
    FULL_TREE_PROBES * PROBE_S, ~0.5 s) once, and is then free for every agent that has the
    prompt; a lazy walk costs the prompt's distinct suffix plus the nodes its agents visit.
    Once a prompt's agents would visit about the whole tree anyway (FIRST_WALK_PROBES each,
    up to FULL_TREE_PROBES), the walk saves only the fresh evaluation: the full tree is then
    cheaper. Depends on counts only, so which way a prompt goes, and hence its answers, does
    not depend on what ran before or beside.
    """
    return agents_on_prompt * FIRST_WALK_PROBES >= FULL_TREE_PROBES


# What a walk into a pruned prefix costs instead: over HTTP one sampled call of its own for
# that agent (its prompt evaluated on top of its predecessor's in a serial batch, then ~4
# decodes); on the embedded engine a lazy walk in its partition's chain, about the same (its
# prompt's suffix, often all of it, and ~3 probes).
OWN_CALL_S = 0.3
# Never prune where more than this share of a prompt's agents would expect calls of their own.
MAX_PRUNE = 1e-3


def prune_below(agents_on_prompt: int) -> float:
    """The reach below which a planned tree leaves a prefix unprobed, for a prompt that
    ``agents_on_prompt`` agents of the round draw from.

    Pruning a prefix reached with probability r saves at least one probe (PROBE_S) and
    costs an expected ``agents * r`` calls of their own (OWN_CALL_S each), so it pays for
    ``r < PROBE_S / (agents * OWN_CALL_S)``. It pays on prompts with few agents (the
    quickstart's round 1, ~10 agents per prompt: 178 probes instead of 242); with a thousand
    agents on a prompt little is left out (million-shared round 2: 21.3 probes per prompt
    instead of 23.0; the answers written without a leading space are reached with 1e-4 to
    1e-3 each, so some of those agents would need calls of their own). Depends on the
    round's count only, so the tree, and hence the answers, are the same on every run and
    cluster.
    """
    scaled = PROBE_S / (max(agents_on_prompt, 1) * OWN_CALL_S)
    return max(PRUNE_BELOW, min(MAX_PRUNE, scaled))


def worth_a_distribution(n_agents: int, min_agents: int, lazy_walks: bool = False) -> bool:
    """Whether a prompt held by ``n_agents`` agents gets a full shared distribution: the one
    rule, applied to a round's count where the round is planned without prices
    (``simpipe.answers.round_plan``) and to a partition's otherwise. ``lazy_walks``: the
    back-end can walk a prompt's tree lazily (the embedded engine, in a partition's chain),
    so the measured cost decides (``full_tree_pays``); else a prompt with fewer than
    ``min_agents`` agents gets one call per agent."""
    if lazy_walks:
        return full_tree_pays(n_agents)
    return n_agents >= min_agents


def step_uniforms(seeds: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` uniforms in [0, 1) per agent seed (agents x steps), one per token of an
    answer walked through its tree (``simpipe.answers.tree``): splitmix64 of the
    seed's stream and the step, 53 bits each."""
    with np.errstate(over="ignore"):
        base = (seeds.astype(np.uint64) ^ _DRAW_STREAM) * GOLDEN
        x = base[:, None] + np.arange(1, steps + 1, dtype=np.uint64)[None, :] * _STEP_STREAM
    return (splitmix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def prompt_key(prompt: object) -> str:
    """The text that identifies a prompt, a completion's text or a chat's messages (as
    sorted JSON): equal keys, equal prompts; what ``prompt_hash`` hashes and the round plan
    and the cache key prompts by."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def prompt_hash(prompt: str) -> int:
    """A stable 64-bit id of a prompt (Python's hash() differs between processes)."""
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "little")


def split_evenly(total: int, n: int) -> np.ndarray:
    """``total`` whole tokens over ``n`` agents: every share floor or ceil, sum exact."""
    shares = np.full(n, total // n, dtype=np.int64)
    shares[: total % n] += 1
    return shares


@dataclass(frozen=True)
class Lookup:
    """A prompt's distribution (None: it could not be pinned down) and whether this call
    computed it, with what that cost."""

    distribution: AnswerDistribution | None
    computed: bool
    calls: int
    tokens_in: int
    tokens_out: int
    problem: str | None = None


@dataclass(frozen=True)
class Walked:
    """One prompt's agents walked lazily through its answer tree (``SharedAnswers.walk_chain``):
    their answers in their order (None for an agent whose walk reached a prefix too
    unlikely to probe; ``texts`` None: the tree could not be pinned down, ``problem`` says
    why, and its agents get calls of their own), the probes' cost and the draws' error."""

    texts: list[str | None] | None
    cost: Cost
    unseen_mass: float
    problem: str | None = None

    def answers(self, agent_ids: np.ndarray) -> WalkedAnswers | None:
        """The walks as the round plan hands them to the partitions, by agent id (sorted,
        as walked); None where the tree could not be pinned down."""
        if self.texts is None:
            return None
        c = self.cost
        return WalkedAnswers(agent_ids, tuple(self.texts), self.unseen_mass, c.calls,
                             c.tokens_in, c.tokens_out)


class SharedAnswers:
    """The per-process cache of answer distributions of one back-end."""

    def __init__(self, backend: Backend, max_entries: int = 20_000,
                 lone_sessions: bool = True) -> None:
        self.backend = backend
        self.max_entries = max_entries
        # Trees computed through sessions (a server's probes) run one after the other, each
        # lone (the same bits on every run), or, where False (``agents.reproducible`` off),
        # up to the back-end's ``session_concurrency`` side by side.
        self.lone_sessions = lone_sessions
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, Lookup] = OrderedDict()
        self._pending: dict[tuple, threading.Event] = {}

    def lookup(self, prompt: str, settings: ChainSettings, max_tokens: int,
               language_bounds: tuple[float, float], max_unseen: float) -> Lookup:
        key = (prompt, settings, max_tokens, language_bounds, max_unseen)
        while True:
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return Lookup(hit.distribution, False, 0, 0, 0, hit.problem)
                event = self._pending.get(key)
                if event is None:
                    event = self._pending[key] = threading.Event()
                    break
            event.wait()  # another partition is computing it; then read the cache
        try:
            found = self._compute(prompt, settings, max_tokens, language_bounds, max_unseen)
            with self._lock:
                self._cache[key] = found
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            return found
        finally:
            with self._lock:
                del self._pending[key]
            event.set()

    def _compute(self, prompt: str, settings: ChainSettings, max_tokens: int,
                 bounds: tuple[float, float], max_unseen: float) -> Lookup:
        return self._trees([prompt], [PRUNE_BELOW], settings, max_tokens, bounds,
                           max_unseen)[0]

    def compute_chain(self, prompts: list[str], settings: ChainSettings, max_tokens: int,
                      bounds: tuple[float, float], max_unseen: float,
                      agents: Sequence[int] | None = None,
                      on_result: Callable[[int, Lookup], None] | None = None) -> list[Lookup]:
        """Full distributions of ``prompts``, in this order, as one chain of probes where the
        back-end has one (``logprob_chain``): each prompt is evaluated on top of the prefix
        its predecessor left, so it costs its distinct suffix; where it evaluates prompts
        in batches (``batched_evaluation``), the list's prompts and probes together in
        batches fixed by the list. The numbers then depend on the list (its order and
        contents), so they are never cached: the caller (the round plan) makes the list the
        same on every run. ``agents``: how many agents of the
        round draw from each prompt; its tree leaves out what ``prune_below`` says.
        ``on_result(i, lookup)`` as each prompt is done (from any thread)."""
        prunes = ([prune_below(k) for k in agents] if agents is not None
                  else [PRUNE_BELOW] * len(prompts))
        return self._trees(prompts, prunes, settings, max_tokens, bounds, max_unseen,
                           on_result)

    def walk_chain(self, prompts: Sequence[str], uniforms: Sequence[np.ndarray],
                   shape: TreeShape, settings: ChainSettings, max_unseen: float,
                   on_result: Callable[[int, Walked], None] | None = None) -> list[Walked]:
        """Prompt ``i``'s agents walked lazily through its tree with their rows of
        ``uniforms[i]`` (``LazyTree``), the prompts in this order as one chain of probes on
        the lone slot (each evaluated on top of the prefix its predecessor left, so it costs
        its distinct suffix), or, where the back-end evaluates prompts in batches
        (``batched_evaluation``), in its batches fixed by this list. Either way the numbers
        depend only on the list, so the caller (a partition, or the round plan) makes it
        the same on every run. ``on_result(i, walked)`` as each prompt is done. A probe that
        fails (``ProbeError``) costs its prompt its walks; the chain not opening raises."""
        backend = self.backend

        def walk(i: int, probe: Probe) -> Walked:
            tree = LazyTree(probe, shape, settings, max_unseen, backend.answer_sampler)
            try:
                return Walked(list(tree.walk(uniforms[i])), tree.cost, tree.unseen_mass)
            except (TooMuchUnseen, ProbeError) as exc:
                return Walked(None, tree.cost, tree.unseen_mass, str(exc))

        if backend.batched_evaluation:
            return backend.probe_each(list(prompts), walk, shape.vocab, settings,
                                      on_result=on_result)
        walked = []
        with backend.logprob_chain(shape.vocab, settings) as probe_for:
            for i, prompt in enumerate(prompts):
                walked.append(walk(i, probe_for(prompt)))
                if on_result is not None:
                    on_result(i, walked[-1])
        return walked

    def _trees(self, prompts: list[str], prunes: list[float], settings: ChainSettings,
               max_tokens: int, bounds: tuple[float, float], max_unseen: float,
               on_result: Callable[[int, Lookup], None] | None = None) -> list[Lookup]:
        """The trees of ``prompts`` in one chain where the back-end has one (the embedded
        engine: exact answer logits where the settings allow), else one session each (lone
        and one after the other, or side by side: ``lone_sessions``).

        A ``ProbeError`` (a server that does not answer, or answers values the checks refuse:
        ``answer_checks.probe_*``) costs the prompts it concerns their distributions (a
        Lookup without one, with the reason): their agents are answered by calls of their
        own. Asking the vocabulary or opening the chain concerns them all, opening one
        prompt's session (vLLM tokenizes the prompt there) that prompt."""
        pairs = zip(prompts, prunes, strict=True)
        if self.backend.batched_evaluation:  # the list's trees in fixed batches
            try:
                vocab = self.backend.answer_vocab(
                    IntegerAnswers(*bounds).alphabet)
                return self.backend.probe_each(
                    prompts, lambda i, probe: self._walk_tree(
                        probe, settings, max_tokens, bounds, max_unseen, prunes[i]),
                    vocab, settings, on_result=on_result)
            except ProbeError as exc:
                return [Lookup(None, True, 0, 0, 0, str(exc)) for _ in prompts]
        if self.backend.chains_probes:
            try:
                vocab = self.backend.answer_vocab(
                    IntegerAnswers(*bounds).alphabet)
                trees: list[Lookup] = []
                with self.backend.logprob_chain(vocab, settings) as probe_for:
                    for p, prune in pairs:
                        trees.append(self._walk_tree(probe_for(p), settings, max_tokens,
                                                     bounds, max_unseen, prune))
                        if on_result is not None:
                            on_result(len(trees) - 1, trees[-1])
                return trees
            except ProbeError as exc:
                return [Lookup(None, True, 0, 0, 0, str(exc)) for _ in prompts]
        lone = self.lone_sessions
        side_by_side = 1 if lone else min(self.backend.session_concurrency, len(prompts))

        def session_tree(i: int) -> Lookup:
            try:
                with self.backend.logprob_session(prompts[i], lone) as probe:
                    tree = self._walk_tree(probe, settings, max_tokens, bounds, max_unseen,
                                           prunes[i])
            except ProbeError as exc:
                tree = Lookup(None, True, 0, 0, 0, str(exc))
            if on_result is not None:
                on_result(i, tree)
            return tree

        if side_by_side <= 1:
            return [session_tree(i) for i in range(len(prompts))]
        # Each tree's probes follow one another (each depends on the answers before it);
        # several trees' probes go to the server at once and share its decodes. Each thread
        # takes a run of neighbouring prompts of the list (which the caller sorts): a
        # llama.cpp server gives a request the idle slot whose prompt shares the most with
        # it, which for a session's next probe is its own slot and for a run's next tree
        # the slot its predecessor left, not another run's slot that it would take away.
        cuts = np.linspace(0, len(prompts), side_by_side + 1).astype(int).tolist()
        found: list[Lookup] = [None] * len(prompts)  # type: ignore[list-item]

        def run(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                found[i] = session_tree(i)

        with ThreadPoolExecutor(side_by_side, thread_name_prefix="answer-tree") as pool:
            for done in [pool.submit(run, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]:
                done.result()
        return found

    def _walk_tree(self, probe: Probe, settings: ChainSettings, max_tokens: int,
                   bounds: tuple[float, float], max_unseen: float,
                   prune: float = PRUNE_BELOW) -> Lookup:
        language = IntegerAnswers(*bounds)
        backend = self.backend
        try:
            vocab = backend.answer_vocab(language.alphabet)
            dist = answer_distribution(probe, language, vocab, settings, max_tokens,
                                       max_unseen=max_unseen, prune_below=prune,
                                       sampler=backend.answer_sampler)
        except TooMuchUnseen as exc:
            c = exc.cost
            return Lookup(None, True, c.calls, c.tokens_in, c.tokens_out, str(exc))
        except ProbeError as exc:
            return Lookup(None, True, 0, 0, 0, str(exc))
        return Lookup(dist, True, dist.calls, dist.tokens_in, dist.tokens_out)
