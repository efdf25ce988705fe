"""The round plan's stages as Dask tasks (``simpipe.answers.round_plan`` decides what is
planned): stage 1 renders a partition's distinct prompts on its worker, stage 2 computes a
chunk's distributions with the worker's policy, stage 3 plays a partition with them. They
live in the run, not in ``simpipe.answers``, because they read a partition's files, render
its agents' prompts (``simpipe.agents.llm``) and play it (``simpipe.run.round_task``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from distributed import Client, Future

from simpipe.agents.llm import agent_seeds, distinct_prompts
from simpipe.agents.progress import PLAN, TaskReporter, reporting
from simpipe.agents.registry import get_policy
from simpipe.answers.capabilities import backend_walks_lazily, prompt_style
from simpipe.answers.planner import answer_costs
from simpipe.answers.round_plan import (
    EMPTY_HASHES,
    Layout,
    PartitionPrompts,
    PlannedChunk,
    layout,
    planned_for,
    prompt_tally,
    tally_of,
    texts_of,
    walkers_of,
)
from simpipe.answers.shared import Lookup, prompt_key, step_uniforms
from simpipe.answers.tree import TreeShape
from simpipe.config.model import AgentsConfig, Config
from simpipe.games.answer_format import IntegerAnswers
from simpipe.games.base import Game
from simpipe.games.registry import game_for
from simpipe.inference.types import ChainSettings, ProbeError
from simpipe.run.round_task import (
    PartitionJob,
    PartitionOutcome,
    partition_turn,
    play_partition,
)


def partition_prompts(job: PartitionJob, feedback: np.ndarray) -> PartitionPrompts:
    """Stage 1 (a worker task): render this partition's distinct prompts, as its play will."""
    paths = job.paths
    played = not paths.round_part(job.round_index, job.partition).exists()
    agents = pd.read_parquet(paths.population_part(job.partition))
    turn = partition_turn(job, feedback, len(agents), needs_own_answers=True)
    codes, prompts = distinct_prompts(agents, turn, prompt_style(job.agents))
    return prompt_tally(job.partition, played, codes, [prompt_key(p) for p in prompts],
                        agents["agent_id"].to_numpy())


@dataclass(frozen=True)
class ChunkProgress:
    """Where a stage-2 task reports each prompt it is done with (``simpipe.agents.progress``,
    stage ``PLAN``): the run's topic, the round, the chunk's index among the round's
    stage-2 tasks (``Layout.chunk_work``'s order). A task of 256 prompts takes a while; the
    plan's progress then moves with its prompts, not only when it ends."""

    topic: str
    round_index: int
    chunk: int


def _prompt_done(reporter: TaskReporter | None, calls: int) -> None:
    if reporter is not None:  # thread-safe: trees side by side report from their threads
        reporter.add(0, distinct=1, calls=calls)


def plan_chunk(settings: AgentsConfig, game: Game, hashes: np.ndarray, agents: np.ndarray,
               *texts_by_part: dict[int, str],
               progress: ChunkProgress | None = None) -> PlannedChunk:
    """Stage 2 (a worker task): the distributions of one chunk's prompts, in its order;
    ``settings``: the agents' (their back-end's), not the whole config (pickled into every
    chunk's task); ``agents``: the round's agents on each (how much of a tree is worth
    probing); ``progress``: where to report each prompt done."""
    p = progress or ChunkProgress("", 0, 0)
    with reporting(p.topic, p.round_index, p.chunk, stage=PLAN) as reporter:
        return _plan_chunk(settings, game, hashes, agents, texts_by_part, reporter)


def _plan_chunk(settings: AgentsConfig, game: Game, hashes: np.ndarray, agents: np.ndarray,
                texts_by_part: Sequence[dict[int, str]],
                reporter: TaskReporter | None) -> PlannedChunk:
    wanted = hashes.tolist()
    texts = _texts(wanted, texts_by_part)
    policy = get_policy(settings)
    shared = policy.shared  # type: ignore[attr-defined]
    s = settings
    chain = ChainSettings(s.temperature, s.top_p, s.top_k, s.min_p)
    bounds = game.answer().bounds
    # The chunk's prompts in text order, one chain: neighbours share the rules and often the
    # persona, so each costs its distinct suffix. The chunk (layout order, fixed size) and this
    # order depend only on the prompts, so the numbers are the same on any worker.
    order = sorted(range(len(wanted)), key=lambda i: texts[wanted[i]])
    counts = agents.tolist()
    chained = shared.compute_chain([texts[wanted[i]] for i in order], chain, s.max_tokens,
                                   bounds, s.share_max_unseen, [counts[i] for i in order],
                                   on_result=lambda _, found: _prompt_done(reporter,
                                                                           found.calls))
    lookups: list[Lookup] = [None] * len(wanted)  # type: ignore[list-item]
    for i, found in zip(order, chained, strict=True):
        lookups[i] = found
    return PlannedChunk([texts[h] for h in wanted], wanted, lookups)


def plan_walk_chunk(settings: AgentsConfig, game: Game, seed: int, round_index: int,
                    hashes: np.ndarray, texts_by_part: list[dict[int, str]],
                    walkers_by_part: list[dict[int, np.ndarray]],
                    progress: ChunkProgress | None = None) -> PlannedChunk:
    """Stage 2 on the embedded engine (a worker task): each prompt's agents of
    the whole round (all partitions, by id) walked lazily through its tree once, with the
    uniforms their partitions would draw (``agent_seeds`` of the run's seed and round), so
    a partition takes their answers instead of evaluating the prompt again. The chunk's
    prompts in text order, as one chain (``SharedAnswers.walk_chain``): the list depends
    only on the prompts and their agents, so the answers are the same on any worker.
    ``progress``: where to report each prompt walked."""
    p = progress or ChunkProgress("", round_index, 0)
    with reporting(p.topic, p.round_index, p.chunk, stage=PLAN) as reporter:
        return _plan_walk_chunk(settings, game, seed, round_index, hashes, texts_by_part,
                                walkers_by_part, reporter)


def _plan_walk_chunk(settings: AgentsConfig, game: Game, seed: int, round_index: int,
                     hashes: np.ndarray, texts_by_part: list[dict[int, str]],
                     walkers_by_part: list[dict[int, np.ndarray]],
                     reporter: TaskReporter | None) -> PlannedChunk:
    wanted = hashes.tolist()
    texts = _texts(wanted, texts_by_part)
    walkers = {h: np.sort(np.concatenate([part[h] for part in walkers_by_part if h in part]))
               for h in wanted}
    shared = get_policy(settings).shared  # type: ignore[attr-defined]
    s = settings
    chain = ChainSettings(s.temperature, s.top_p, s.top_k, s.min_p)
    language = IntegerAnswers(*game.answer().bounds)
    order = sorted(range(len(wanted)), key=lambda i: texts[wanted[i]])
    ids = [walkers[wanted[i]] for i in order]
    lookups: list[Lookup] = [None] * len(wanted)  # type: ignore[list-item]
    try:
        shape = TreeShape(language, shared.backend.answer_vocab(language.alphabet),
                          s.max_tokens)
        walked = shared.walk_chain(
            [texts[wanted[i]] for i in order],
            [step_uniforms(agent_seeds(seed, round_index, a), s.max_tokens) for a in ids],
            shape, chain, s.share_max_unseen,
            on_result=lambda _, w: _prompt_done(reporter, w.cost.calls))
    except ProbeError as exc:
        # No vocabulary, or the chain did not open: the partitions walk these prompts.
        return PlannedChunk([texts[h] for h in wanted], wanted,
                            [Lookup(None, True, 0, 0, 0, str(exc)) for _ in wanted])
    for i, agents, w in zip(order, ids, walked, strict=True):
        c = w.cost
        lookups[i] = Lookup(w.answers(agents), True, c.calls, c.tokens_in, c.tokens_out,
                            w.problem)
    return PlannedChunk([texts[h] for h in wanted], wanted, lookups)


def _texts(wanted: list[int], texts_by_part: Sequence[dict[int, str]]) -> dict[int, str]:
    """The texts of the ``wanted`` hashes, from the partitions' ``texts_of``."""
    texts: dict[int, str] = {}
    for part in texts_by_part:
        for h in wanted:
            if h not in texts and h in part:
                texts[h] = part[h]
    return texts


def play_planned_partition(job: PartitionJob, feedback: np.ndarray, owned: np.ndarray,
                           chunks: list[PlannedChunk]) -> PartitionOutcome:
    """Stage 3 (a worker task): the partition played with the round's planned distributions."""
    return play_partition(job, feedback, planned_for(chunks, owned))


#: Waits for the futures (progress, cancel) with a label for the progress bar and, for the
#: ETA, each future's expected work (equal when None) and prompts (None: it reports none).
Await = Callable[[list[Future], str, Sequence[float] | None, Sequence[int] | None], None]


@dataclass
class RoundPlan:
    """What stage 3 needs: the chunks (futures on the workers) and each partition's share."""

    layout: Layout
    chunks: list[Future]

    def submit_partition(self, client: Client, job: PartitionJob, feedback: Future,
                         key: str) -> Future:
        owned = self.layout.owned.get(job.partition, EMPTY_HASHES)
        return client.submit(play_planned_partition, job, feedback, owned, self.chunks,
                             key=key, pure=False)


def plan_round(client: Client, config: Config, jobs: Sequence[PartitionJob], feedback: Future,
               key: str, wait: Await) -> RoundPlan:
    """Stages 1 and 2 of a round: the planned distributions, computed on the workers."""
    found = [client.submit(partition_prompts, job, feedback, key=f"prompts-{key}-part-{k}",
                           pure=False) for k, job in enumerate(jobs)]
    tallies_f = [client.submit(tally_of, f, key=f"tally-{key}-part-{k}", pure=False)
                 for k, f in enumerate(found)]
    wait(tallies_f, "prompts", None, None)
    plan = layout(client.gather(tallies_f), config.agents.share_min_agents,
                  lazy_walks=backend_walks_lazily(config.agents), costs=answer_costs(config))
    if not plan.chunks and not plan.walk_chunks:
        return RoundPlan(plan, [])
    chosen = np.concatenate(plan.chunks + plan.walk_chunks)
    texts = [client.submit(texts_of, f, chosen, key=f"texts-{key}-part-{k}", pure=False)
             for k, f in enumerate(found)]
    game = game_for(config.game)  # the one object of this process: each task pickles it
    round_index, topic = jobs[0].round_index, jobs[0].progress_topic
    chunks = [client.submit(plan_chunk, config.agents, game, hashes, agents, *texts,
                            progress=ChunkProgress(topic, round_index, i),
                            key=f"plan-{key}-chunk-{i}", pure=False)
              for i, (hashes, agents) in enumerate(zip(plan.chunks, plan.agents, strict=True))]
    if plan.walk_chunks:
        walked = np.concatenate(plan.walk_chunks)
        walkers = [client.submit(walkers_of, f, walked, key=f"walkers-{key}-part-{k}",
                                 pure=False) for k, f in enumerate(found)]
        trees = len(chunks)
        chunks += [client.submit(plan_walk_chunk, config.agents, game, config.run.seed,
                                 round_index, hashes, texts, walkers,
                                 progress=ChunkProgress(topic, round_index, trees + i),
                                 key=f"walk-{key}-chunk-{i}", pure=False)
                   for i, hashes in enumerate(plan.walk_chunks)]
    wait(chunks, "distributions", plan.chunk_work(), plan.chunk_prompts())
    return RoundPlan(plan, chunks)
