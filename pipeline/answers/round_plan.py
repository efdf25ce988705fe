"""A round's distinct prompts planned once for the whole population, their work spread.

Without a plan each worker process computes the answer distribution of every prompt its
partitions need and caches it: a prompt held by agents of every partition is computed once
per worker, so a second worker only repeats the first one's work. Where LLM agents share
answers (``simpipe.answers.shared.sharing_refusal`` is None) a round is therefore
played in three stages:

1. one task per partition renders its distinct prompts (``partition_prompts``) and keeps
   them on its worker (``prompt_tally``); the client gathers only their 64-bit hashes,
   group hashes (``prompt_group``: the text before the agent's own line and the cue) and
   agent counts;
2. the client merges them into the round's distinct prompts, each with its agents in all
   partitions; those worth a distribution (``worth_a_distribution`` on that count) are
   ordered by group, then hash, and cut into chunks of ``chunk_size`` in that order (a
   chunk's prompts then share all but their last lines), and each chunk is one task
   computing its prompts' distributions (``plan_chunk``), reading the prompt texts from the
   stage-1 results (only the planned ones travel: ``texts_of``); the results stay on the
   workers. On the embedded engine (``lazy_walks``) every prompt is planned as a walk
   instead: in chunks of ``walk_chunk_size``, each prompt's agents of all partitions (their
   ids: ``walkers_of``) are walked lazily through its tree once (``plan_walk_chunk``), so a
   prompt held in five partitions is evaluated once, not five times, and its agents probe
   only the nodes their draws reach, never more than its full tree would;
3. each partition task gets the chunks as arguments (``play_planned_partition``): an agent
   whose prompt is planned draws from its distribution with its own seed, or takes the
   answer the plan's walk gave it; the others are answered as without a plan.

The chunks depend only on the prompts and their counts, never on the number of workers, and
each distribution is computed as one lone sequence (``SharedAnswers``), so the same seed
gives the same guesses on any number of workers. A distribution's cost (model calls,
tokens) is charged to the agents of the lowest-numbered partition played that holds the
prompt, so a round's token columns still sum to what the model spent.

This module decides (what is planned, in which chunks, charged to whom); the stages' tasks,
which read a partition, render its agents' prompts, compute a chunk with the worker's
policy and play a partition, are ``simpipe.run.planned_round``: they need the agents and
the run, two layers above the answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from simpipe.answers.capabilities import backend_supports_distributions, prompt_style
from simpipe.answers.distribution import AnswerDistribution
from simpipe.answers.planner import LAZY_METHODS, METHODS, AnswerCosts, methods_record
from simpipe.answers.shared import (
    FRESH_PROMPT_S,
    FULL_TREE_PROBES,
    PROBE_S,
    Lookup,
    prompt_hash,
    sharing_refusal,
    worth_a_distribution,
)
from simpipe.config.model import Config
from simpipe.config.population_mix import mix_attribute
from simpipe.inference.cost_model import approx_tokens

#: Most prompts per stage-2 task: a distribution is ~22 one-token calls (~0.5 s on 2 cores),
#: so a chunk is seconds of work, and a round of ~1,000 prompts is ~130 tasks to spread.
CHUNK_PROMPTS = 8
#: Fewer prompts are cut into at least this many chunks, so that round 1's few shared
#: prompts spread over the workers (the quickstart's 8 were one chunk: one worker computed
#: them while the other waited). A smaller chunk costs its first prompt evaluated afresh
#: (the rules, ~90 tokens), so more chunks than a laptop has cores cost time there: on two
#: cores the quickstart's 10 round-1 prompts as 2 chunks of 5 rather than 3, 3, 3 and 1 made
#: the whole run 4 % faster (median of 5 pairs, 2026-12-03); a cluster of more workers
#: gets round 1's trees on two of them, a few seconds once per run.
MIN_CHUNKS = 2


def chunk_size(n_prompts: int) -> int:
    """Prompts per chunk for a round that plans ``n_prompts``: a function of the prompts
    alone, never of the workers, so that the chunks (and the bits) are the same on any
    cluster."""
    return max(1, min(CHUNK_PROMPTS, -(-n_prompts // MIN_CHUNKS)))

#: Most prompts per planned walk task: a walked prompt costs ~0.09 s of one core (its last
#: line and ~2 probes), and a task's first prompt is evaluated whole (~0.5 s: every task
#: starts from an empty key/value pool, so that its bits depend on its prompts alone), so a
#: task of 256 is ~23 s. Measured on 256 distinct prompts of the 1,000-agent quickstart's
#: round 5 on one core (2026-12-03): as 4 tasks of 64, 5,393 tokens evaluated in 23.7 s; as
#: one of 256, 4,922 tokens in 21.9 s. The price: a round of ~1,000 distinct prompts is 4
#: tasks, so a cluster of more than 4 workers has idle ones in it (a function of the prompts
#: alone, as the answers must be).
WALK_CHUNK_PROMPTS = 256
#: Fewer walked prompts are cut into at least this many chunks: a small round's walks
#: (the quickstart's ~90) then cost two whole first prompts, as two partitions' chains did.
MIN_WALK_CHUNKS = 2


def walk_chunk_size(n_prompts: int) -> int:
    """Prompts per planned walk task for a round that walks ``n_prompts``: a function of
    the prompts alone, as ``chunk_size``. The fewest tasks of at most ``WALK_CHUNK_PROMPTS``
    (``MIN_WALK_CHUNKS`` at least), all of about one size: the workers wait for a round's
    last task, and 948 prompts as 256, 256, 256 and 180 kept one of two workers idle for
    4 s of the round, where 4 x 237 keeps both busy to its end."""
    chunks = max(MIN_WALK_CHUNKS, -(-n_prompts // WALK_CHUNK_PROMPTS))
    return max(1, -(-n_prompts // chunks))

#: Expected seconds of one core per planned prompt, by method: what the plan's ETA weighs
#: its tasks by (``Layout.chunk_work``). A full tree as the sharing rule prices it
#: (``full_tree_pays``: ~0.5 s); a walked prompt as measured above.
TREE_PROMPT_S = FRESH_PROMPT_S + FULL_TREE_PROBES * PROBE_S
WALK_PROMPT_S = 0.09

#: No prompts (a partition that carries no planned prompt's cost).
EMPTY_HASHES = np.empty(0, np.uint64)


def plans_rounds(config: Config) -> bool:
    """Whether this run's rounds are planned: LLM agents that share answers. A mixed
    population's groups are answered by their own policies, each sharing per partition
    (the plan renders one agents config's prompts)."""
    agents = config.agents
    if not agents.plugin.is_llm or mix_attribute(agents) is not None:
        return False
    return sharing_refusal(agents.share_answers, config.game, agents.backend,
                           backend_supports_distributions(agents),
                           prompt_style(agents)) is None


@dataclass(frozen=True)
class PromptTally:
    """A partition's distinct prompts as the client sees them: hashes (sorted) and how many
    of its agents hold each. ``played``: False when its part file exists (a resumed run):
    its prompts count for the rule, but need no distribution for it."""

    partition: int
    played: bool
    hashes: np.ndarray  # uint64
    counts: np.ndarray  # int64
    # Per prompt, the hash of its text before the last two lines (``prompt_group``); None:
    # each prompt a group of its own.
    groups: np.ndarray | None = None
    # Per prompt, its tokens and those of its last two lines (``approx_tokens``): what the
    # plan prices (``simpipe.answers.planner``); None: unknown (priced as 1 and 1).
    tokens: np.ndarray | None = None
    own_tokens: np.ndarray | None = None


@dataclass(frozen=True)
class PartitionPrompts:
    """Stage 1's result, kept on the worker: the tally, the prompt texts (by hash), and
    which agents hold each prompt (``codes`` indexes ``code_hashes``, one per agent of
    ``agent_ids``): a planned walk needs its agents' ids (``walkers_of``)."""

    tally: PromptTally
    texts: dict[int, str]
    agent_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    codes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    code_hashes: np.ndarray = field(default_factory=lambda: EMPTY_HASHES)


def prompt_tally(partition: int, played: bool, codes: np.ndarray, keys: Sequence[str],
                 agent_ids: np.ndarray | None = None) -> PartitionPrompts:
    """Stage 1's result from a partition's distinct prompts: ``keys`` (``prompt_key`` of
    each), ``codes`` (which of them each agent holds), ``agent_ids`` (the agents, in the
    order of ``codes``); ``played``: see ``PromptTally``."""
    hashes = np.fromiter((prompt_hash(k) for k in keys), np.uint64, len(keys))
    counts = np.bincount(codes, minlength=len(keys)).astype(np.int64)
    groups = np.fromiter((prompt_group(k) for k in keys), np.uint64, len(keys))
    tokens = np.fromiter((approx_tokens(len(k)) for k in keys), np.int64, len(keys))
    own = np.fromiter((approx_tokens(len(k) - len(k.rsplit("\n", 2)[0])) for k in keys),
                      np.int64, len(keys))
    order = np.argsort(hashes, kind="stable")
    tally = PromptTally(partition, played, hashes[order], counts[order], groups[order],
                        tokens[order], own[order])
    texts = {int(h): k for h, k in zip(hashes.tolist(), keys, strict=True)}
    if agent_ids is None:
        return PartitionPrompts(tally, texts)
    return PartitionPrompts(tally, texts, np.asarray(agent_ids, np.int64),
                            np.asarray(codes, np.int64), hashes)


def prompt_group(prompt_key: str) -> int:
    """The hash of a prompt's text before its last two lines: a prompt ends with the agent's
    own line (its numbers, or its last round) and the answer cue, so prompts that share
    everything else (rules, persona, announced numbers) share this key. Planned chunks are
    cut from prompts ordered by it, so that a chunk's chain costs each prompt its last lines
    rather than its persona and history too."""
    return prompt_hash(prompt_key.rsplit("\n", 2)[0])


def tally_of(found: PartitionPrompts) -> PromptTally:
    """The small part of a stage-1 result the client needs (a task, so texts stay put)."""
    return found.tally


@dataclass(frozen=True)
class Layout:
    """The client's plan of a round: which prompts each chunk computes, and which planned
    prompts each partition carries the cost of."""

    distinct: int  # the round's distinct prompts
    chunks: list[np.ndarray]  # hashes by (group, hash), chunk_size(all of them) per chunk
    owned: dict[int, np.ndarray]  # partition -> hashes whose cost its agents carry
    # Per chunk, the round's agents on each of its prompts (a tree's pruning follows it).
    agents: list[np.ndarray]
    # How the round's distinct prompts are answered (run.json's ``answer_methods``:
    # ``simpipe.answers.planner.methods_record``).
    methods: dict = field(default_factory=dict)
    # The prompts whose agents are walked lazily once for the round (every prompt on the
    # embedded engine), by (group, hash), walk_chunk_size(all of them) per chunk.
    walk_chunks: list[np.ndarray] = field(default_factory=list)

    @property
    def planned(self) -> int:
        """Prompts the plan answers: full trees and walks."""
        return sum(c.size for c in self.chunks) + sum(c.size for c in self.walk_chunks)

    def chunk_work(self) -> list[float]:
        """The expected work of each stage-2 task, tree chunks then walk chunks (the order
        they are submitted in), in seconds of one core."""
        return ([c.size * TREE_PROMPT_S for c in self.chunks]
                + [c.size * WALK_PROMPT_S for c in self.walk_chunks])

    def chunk_prompts(self) -> list[int]:
        """The prompts of each stage-2 task, in ``chunk_work``'s order."""
        return [c.size for c in self.chunks + self.walk_chunks]


def layout(tallies: Sequence[PromptTally], min_agents: int,
           chunk_prompts: int | None = None, lazy_walks: bool = False,
           costs: AnswerCosts | None = None) -> Layout:
    """Merge the partitions' tallies: the round's distinct prompts with their agents, the
    ones worth a distribution (held by a partition still to be played) in chunks of
    ``chunk_prompts`` (by default ``chunk_size`` of their number). Worth one: none on the
    embedded engine (``lazy_walks``: every prompt is walked, in ``walk_chunks``), else the
    cheapest of the back-end's ways to answer a prompt (``costs``:
    ``simpipe.answers.planner``), else held by ``min_agents``; all on the round's counts."""
    tallies = sorted(tallies, key=lambda t: t.partition)
    if not tallies:
        return Layout(0, [], {}, [])
    hashes = np.concatenate([t.hashes for t in tallies] + [EMPTY_HASHES])
    groups = np.concatenate([t.hashes if t.groups is None else t.groups for t in tallies]
                            + [EMPTY_HASHES])
    counts = np.concatenate([t.counts for t in tallies] + [np.empty(0, np.int64)])
    parts = np.concatenate([np.full(t.hashes.size, t.partition, np.int64) for t in tallies]
                           + [np.empty(0, np.int64)])
    played = np.concatenate([np.full(t.hashes.size, t.played) for t in tallies]
                            + [np.empty(0, bool)])
    uniq, first_row, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    total = np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)
    needed = np.bincount(inverse, weights=played, minlength=uniq.size) > 0
    if lazy_walks:
        # A prompt's agents walked together probe the nodes of its tree that their draws
        # reach, a subset of what its full tree probes, and with the same uniforms draw
        # the same answers from the same nodes: here, where a prompt is answered once for
        # the round, a walk never costs more than its tree (docs/shared-answers.md:
        # 10,000 agents x 2 rounds 0.65 of the time, a million 0.62).
        worth = np.zeros(total.size, bool)
        methods = methods_record(worth.astype(np.int64), LAZY_METHODS, total)
    elif costs is not None:
        worth, methods = _priced(tallies, costs, first_row, inverse, counts, total)
    else:
        worth = np.fromiter((worth_a_distribution(int(n), min_agents)
                             for n in total.tolist()), bool, total.size)
        methods = methods_record(worth.astype(np.int64), ("calls", "tree"), total)
    pick = worth & needed
    # By group, then hash: prompts that differ only in their last lines go to one chunk.
    order = np.lexsort((uniq[pick], groups[first_row][pick]))
    chosen = uniq[pick][order]
    on_chosen = total[pick][order]
    size = chunk_prompts or chunk_size(int(chosen.size))
    chunks = [chosen[i:i + size] for i in range(0, chosen.size, size)]
    agents = [on_chosen[i:i + size] for i in range(0, chosen.size, size)]
    walk_chunks: list[np.ndarray] = []
    if lazy_walks:
        # The rest are walked once for the round, not once per partition that holds them.
        walk = ~worth & needed
        walked = uniq[walk][np.lexsort((uniq[walk], groups[first_row][walk]))]
        size = chunk_prompts or walk_chunk_size(int(walked.size))
        walk_chunks = [walked[i:i + size] for i in range(0, walked.size, size)]
        chosen = np.concatenate([chosen, walked])
    # Each planned prompt's cost goes to the lowest-numbered played partition holding it.
    rows = np.nonzero(played & np.isin(hashes, chosen))[0]
    first = {}
    for h, k in zip(hashes[rows].tolist(), parts[rows].tolist(), strict=True):
        first.setdefault(h, k)  # rows are in partition order
    owned: dict[int, list[int]] = {}
    for h, k in first.items():
        owned.setdefault(k, []).append(h)
    return Layout(int(uniq.size), chunks,
                  {k: np.array(sorted(v), np.uint64) for k, v in owned.items()}, agents,
                  methods, walk_chunks)


def _priced(tallies: Sequence[PromptTally], costs: AnswerCosts, first_row: np.ndarray,
            inverse: np.ndarray, counts: np.ndarray,
            total: np.ndarray) -> tuple[np.ndarray, dict]:
    """Per distinct prompt, whether its cheapest method is a tree, and the round's
    ``answer_methods`` with the predicted cost (``samples`` as the partitions send them:
    one request per partition and ``cap`` agents)."""
    ones = [np.ones(t.hashes.size, np.int64) for t in tallies]
    tokens = np.concatenate([o if t.tokens is None else t.tokens
                             for t, o in zip(tallies, ones, strict=True)])[first_row]
    own = np.concatenate([o if t.own_tokens is None else t.own_tokens
                          for t, o in zip(tallies, ones, strict=True)])[first_row]
    chosen = costs.choose(total, tokens, own)
    requests = np.bincount(inverse, weights=np.ceil(counts / costs.samples_cap),
                           minlength=total.size)
    prices = costs.prices(total, tokens, own, requests)
    predicted = float(prices[chosen, np.arange(total.size)].sum()) if total.size else 0.0
    return (chosen == METHODS.index("tree"),
            methods_record(chosen, METHODS, total, predicted, costs.model.source))


@dataclass(frozen=True)
class PlannedChunk:
    """Stage 2's result: each prompt's text and what computing its distribution gave."""

    texts: list[str]
    hashes: list[int]
    lookups: list[Lookup]


def walkers_of(found: PartitionPrompts, walked: np.ndarray) -> dict[int, np.ndarray]:
    """The ids of a partition's agents on each of the planned walks' prompts it holds (a
    task, as ``texts_of``)."""
    mine = np.isin(found.code_hashes, walked)
    agents = mine[found.codes]
    order = np.argsort(found.codes[agents], kind="stable")
    codes = found.codes[agents][order]
    ids = found.agent_ids[agents][order]
    cut = np.flatnonzero(np.diff(codes)) + 1
    return {int(found.code_hashes[group[0]]): members
            for group, members in zip(np.split(codes, cut), np.split(ids, cut), strict=True)
            if group.size}


def texts_of(found: PartitionPrompts, planned: np.ndarray) -> dict[int, str]:
    """The texts of a partition's prompts that are planned (a task: a partition's texts can
    be a hundred megabytes in later rounds; the planned ones are a few)."""
    return {h: found.texts[h] for h in planned.tolist() if h in found.texts}


def planned_for(chunks: Sequence[PlannedChunk],
                owned: np.ndarray) -> dict[str, AnswerDistribution]:
    """``Turn.planned`` of one partition: every pinned-down distribution, charged with its
    cost where this partition carries it and free elsewhere. A prompt whose distribution
    could not be pinned down is left out: its agents are answered as without a plan."""
    mine = set(owned.tolist())
    planned: dict[str, AnswerDistribution] = {}
    for chunk in chunks:
        for text, h, found in zip(chunk.texts, chunk.hashes, chunk.lookups, strict=True):
            dist = found.distribution
            if dist is None:
                continue
            paid = h in mine and found.computed
            planned[text] = replace(dist, calls=found.calls if paid else 0,
                                    tokens_in=found.tokens_in if paid else 0,
                                    tokens_out=found.tokens_out if paid else 0)
    return planned


