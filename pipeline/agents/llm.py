"""LLM agents: prompts with memory, one batched call per partition, numbers parsed.

The back-end gets the whole partition at once and overlaps the calls itself; the answer
is constrained to a number in range where the server supports it, and parsed tolerantly
either way, so every agent ends with a guess or a status saying why not.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simpipe.agents.base import (
    AgentPolicy,
    Decisions,
    DecisionStats,
    Turn,
    decisions_frame,
    stored_raw,
)
from simpipe.agents.progress import TaskReporter, current_reporter, report_agents
from simpipe.answers.shared import (
    Lookup,
    SharedAnswers,
    Walked,
    prompt_hash,
    prompt_key,
    sharing_refusal,
    split_evenly,
    step_uniforms,
    worth_a_distribution,
)
from simpipe.answers.tree import TreeShape
from simpipe.core.aio import run_async
from simpipe.core.seeds import GOLDEN, splitmix64
from simpipe.games.answer_format import IntegerAnswers
from simpipe.games.base import Game
from simpipe.games.config import AnyGameConfig
from simpipe.games.prompts import PromptBuilder
from simpipe.inference.base import (
    AnswerColumns,
    Backend,
    GenerationRequest,
    OutputConstraint,
    listening,
)
from simpipe.inference.settings import SamplingSettings
from simpipe.inference.types import ChainSettings, ProbeError

if TYPE_CHECKING:
    from simpipe.config.model import AgentsConfig


def agent_seeds(seed: int, round_index: int, agent_ids: np.ndarray) -> np.ndarray:
    """A per-agent, per-round request seed (splitmix64 of the triple), in [0, 2**31)."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * GOLDEN + np.uint64(round_index) * np.uint64(0xBF58476D1CE4E5B9)
             + agent_ids.astype(np.uint64))
    return (splitmix64(x) >> np.uint64(33)).astype(np.int64)


@functools.lru_cache(maxsize=64)
def prompting(game: Game, style: str) -> tuple[PromptBuilder, OutputConstraint]:
    """The prompt builder and answer constraint of a game (built once per process and
    table: games built from equal tables are equal)."""
    answer = game.answer()
    constraint = OutputConstraint(gbnf=answer.grammar(), regex=answer.regex(),
                                  json_schema=answer.json_schema(), lark=answer.lark(),
                                  ends=answer.ends())
    return PromptBuilder(game.config, style), constraint


def render_prompts(agents: pd.DataFrame, turn: Turn, style: str) -> list:
    """Each agent's prompt for this turn: rules, persona, own history (str or chat messages)."""
    codes, distinct = distinct_prompts(agents, turn, style)
    return [distinct[c] for c in codes.tolist()]


def distinct_prompts(agents: pd.DataFrame, turn: Turn, style: str) -> tuple[np.ndarray, list]:
    """``(codes, prompts)``: agent ``i``'s prompt is ``prompts[codes[i]]``; each distinct
    prompt is rendered once, numbered in order of first appearance.

    Agents with the same persona and the same history (own answers, what their group was
    told) get the same prompt: in round 1 without personas that is every agent, and later
    rounds repeat a lot, so rendering per agent would mostly redo the same text.
    """
    builder, _ = prompting(turn.game, style)
    n = len(agents)
    personas = agents["persona"].to_numpy(dtype=object) if "persona" in agents else None
    key = np.zeros((n, 1))
    if personas is not None:
        key[:, 0] = pd.factorize(personas, use_na_sentinel=False)[0]
    past = turn.past_answers is not None and turn.past_feedback.shape[1] > 0
    if past:
        # One NaN bit pattern: invalid answers and unannounced rounds compare equal.
        history = np.column_stack([turn.past_answers, turn.past_feedback]).astype(np.float64)
        key = np.column_stack([key, np.where(np.isnan(history), np.nan, history)])
    codes, first = _row_codes(key)
    rendered = builder.render_many(
        [None] * first.size if personas is None else personas[first].tolist(),
        (turn.game.histories(turn.past_answers[first], turn.past_feedback[first])
         if past else None),
        turn.round_index,
    )
    # Two keys can still render alike (-0.0 and 0.0 both read "0"): number the texts.
    text_codes, _ = pd.factorize(pd.Series([prompt_key(p) for p in rendered], dtype=object))
    _, firsts = np.unique(text_codes, return_index=True)
    return text_codes[codes], [rendered[i] for i in firsts.tolist()]


def _row_codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, first)``: which distinct row of ``key`` each row is, numbered in order of
    first appearance, and the index of each distinct row's first appearance."""
    if key.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.ascontiguousarray(key).view(np.dtype((np.void, key.dtype.itemsize * key.shape[1])))
    _, first, inverse = np.unique(rows.ravel(), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.ravel()], first[order]


def requests_for(prompts: list, seeds: np.ndarray, game: Game,
                 sampling: SamplingSettings) -> list[GenerationRequest]:
    """One request per prompt, with its seed, the sampling settings and the answer
    constraint."""
    _, constraint = prompting(game, "completion")
    free_text = game.config.free_text_answer
    common = {
        "max_tokens": sampling.cot_max_tokens if free_text else sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "constraint": constraint,
    }
    return [
        GenerationRequest(prompt=p, seed=seed, **common) if isinstance(p, str)
        else GenerationRequest(messages=p, seed=seed, **common)
        for p, seed in zip(prompts, seeds.tolist(), strict=True)
    ]


def build_requests(agents: pd.DataFrame, turn: Turn, style: str,
                   sampling: SamplingSettings) -> list[GenerationRequest]:
    """One request per agent: its prompt (rules, persona, own history), seed and limits."""
    seeds = agent_seeds(turn.seed, turn.round_index, agents["agent_id"].to_numpy())
    return requests_for(render_prompts(agents, turn, style), seeds, turn.game, sampling)


class LLMAgents(AgentPolicy):
    """Agents answered by an LLM back-end: from one shared answer distribution per distinct
    prompt where that is possible (``simpipe.answers.shared``), else one call each."""

    def __init__(self, backend: Backend, agents: AgentsConfig) -> None:
        self.backend = backend
        self.sampling = agents
        self.shared = (SharedAnswers(backend, lone_sessions=agents.reproducible)
                       if backend.supports_answer_distributions else None)

    def needs_own_answers(self, game: Game) -> bool:
        return True  # each prompt shows the agent its own earlier answers

    def sharing_refusal(self, game: AnyGameConfig) -> str | None:
        """Why this partition's agents get one call each; None when they share answers."""
        return sharing_refusal(self.sampling.share_answers, game, self.sampling.backend,
                               self.backend.supports_answer_distributions,
                               self.backend.prompt_style)

    def decide(self, agents: pd.DataFrame, turn: Turn) -> Decisions:
        game = turn.game
        n = len(agents)
        codes, prompts = distinct_prompts(agents, turn, self.backend.prompt_style)
        agent_ids = agents["agent_id"].to_numpy()
        seeds = agent_seeds(turn.seed, turn.round_index, agent_ids)
        uniques = [prompt_key(p) for p in prompts]
        stats = DecisionStats(prompt_ids=np.unique(np.fromiter(
            (prompt_hash(u) for u in uniques), np.uint64, len(uniques))))
        out = _Answers(n)
        sharing = self.shared is not None and self.sharing_refusal(game.config) is None
        if sharing:
            self._draw_shared(out, codes, list(uniques), agent_ids, seeds, turn, stats)
        todo = np.nonzero(~out.shared)[0]
        if todo.size:
            # One request per distinct prompt; each agent's differs only by its seed.
            distinct = requests_for(prompts, np.zeros(len(prompts), np.int64), game,
                                    self.sampling)
            # Agents are reported as their answers arrive (a chain of thought takes seconds
            # each): the round's progress moves before the partition ends.
            report_agents(0, distinct=np.unique(codes[todo]).size)
            told = _AnswerTally(current_reporter())
            # Beside shared answers (reproducible by construction) the remaining calls are
            # made reproducible too, so that a whole run is.
            answers = run_async(listening(self.backend.generate_many(
                distinct, codes[todo], seeds[todo],
                reproducible=sharing or self.sampling.reproducible), told))
            out.fill(todo, answers)
            stats.model_calls += int(todo.size)
            stats.prompt_tokens += sum(answers.tokens_in)
            rest = int(todo.size) - told.done  # those a back-end did not tell of one by one
            if rest > 0:
                report_agents(rest, calls=rest)
        limit = (self.sampling.cot_max_tokens if game.config.free_text_answer
                 else self.sampling.max_tokens)
        guesses, statuses = game.answer().parse_many(out.texts, out.cut(limit))
        statuses[out.failed] = "error"
        guesses[out.failed] = np.nan
        stats.shared_agents = int(out.shared.sum())
        raw, raw_truncated = stored_raw(out.texts.tolist(), self.sampling.max_raw_chars)
        frame = decisions_frame(guesses, statuses, raw=raw, raw_truncated=raw_truncated,
                                tokens_in=out.tokens_in, tokens_out=out.tokens_out,
                                latency_s=out.latency_s, error=out.errors, shared=out.shared)
        return Decisions(frame, stats)

    def _draw_shared(self, out: _Answers, codes: np.ndarray, uniques: list[str],
                     agent_ids: np.ndarray, seeds: np.ndarray, turn: Turn,
                     stats: DecisionStats) -> None:
        """Each agent's answer walked through its prompt's answer tree with its own
        uniforms: a tree planned for the round, or the answers the round plan's walk gave
        it (``WalkedAnswers``), the process's canonical full tree (a prompt many agents
        share), or a tree probed lazily in this partition's chain (a round not planned, or
        a planned walk that failed)."""
        s = self.sampling
        settings = ChainSettings(s.temperature, s.top_p, s.top_k, s.min_p)
        answer = turn.game.answer()
        uniforms = step_uniforms(seeds, s.max_tokens)
        chained = self.backend.chains_probes
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(uniques)))])
        lazy: list[tuple[str, np.ndarray]] = []
        partly: set[str] = set()  # prompts some of whose agents drew from a tree already
        for k, prompt in enumerate(uniques):
            members = order[bounds[k]:bounds[k + 1]]
            planned = turn.planned.get(prompt)
            if planned is not None:  # the round plan computed it (simpipe.answers.round_plan)
                found = Lookup(planned, planned.calls > 0, planned.calls, planned.tokens_in,
                               planned.tokens_out)
            elif chained and not worth_a_distribution(members.size, s.share_min_agents, True):
                lazy.append((prompt, members))
                continue
            elif (turn.plan_decides and not chained) or not worth_a_distribution(
                    members.size, s.share_min_agents):
                # cheaper as calls of their own (the round plan priced them so, or too few
                # agents share it here)
                continue
            else:
                found = self.shared.lookup(prompt, settings, s.max_tokens, answer.bounds,
                                           s.share_max_unseen)
            stats.model_calls += found.calls
            stats.probes += found.calls
            if found.computed:
                stats.prompt_tokens += found.tokens_in
                out.tokens_in[members] += split_evenly(found.tokens_in, members.size)
                out.tokens_out[members] += split_evenly(found.tokens_out, members.size)
            dist = found.distribution
            if dist is None:
                stats.fallback_prompts += 1
                stats.problem = stats.problem or found.problem
                continue
            off_tree = self._take(out, members, dist.answers_for(agent_ids[members],
                                                                 uniforms[members]),
                                  dist.unseen_mass, stats, calls=found.calls)
            if off_tree.size and chained:
                # Walks into a prefix the tree left out: walked on in this partition's chain
                # (the prompt's suffix and a few probes), not one sampled call each, which
                # on the embedded engine would first start its server (a second model
                # load, ~3 s) for a handful of agents.
                lazy.append((prompt, off_tree))
                partly.add(prompt)
        if lazy:
            language = IntegerAnswers(*answer.bounds)
            try:
                vocab = self.backend.answer_vocab(language.alphabet)
                self._walk_chain(out, lazy, uniforms, TreeShape(language, vocab, s.max_tokens),
                                 settings, stats, partly)
            except ProbeError as exc:
                # No vocabulary, or the chain did not open (a prompt's own probes fail inside
                # ``_walk_chain``, for that prompt alone): none of these prompts was walked,
                # so their agents get calls of their own.
                stats.fallback_prompts += len(lazy)
                stats.problem = stats.problem or str(exc)

    def _walk_chain(self, out: _Answers, lazy: list[tuple[str, np.ndarray]],
                    uniforms: np.ndarray, shape: TreeShape, settings: ChainSettings,
                    stats: DecisionStats, counted: set[str]) -> None:
        """The lazily walked prompts in sorted order (``SharedAnswers.walk_chain``): each
        costs its distinct suffix, and the chain depends only on this partition.
        ``counted``: prompts already reported to the progress as distinct."""
        lazy.sort(key=lambda item: item[0])

        def tally(i: int, walked: Walked) -> None:
            members = lazy[i][1]
            c = walked.cost
            stats.model_calls += c.calls
            stats.probes += c.calls
            stats.prompt_tokens += c.tokens_in
            out.tokens_in[members] += split_evenly(c.tokens_in, members.size)
            out.tokens_out[members] += split_evenly(c.tokens_out, members.size)
            if walked.texts is None:
                # One sampled call each for this prompt's agents instead.
                stats.fallback_prompts += 1
                stats.problem = stats.problem or walked.problem
                return
            self._take(out, members, walked.texts, walked.unseen_mass, stats, calls=c.calls,
                       distinct=int(lazy[i][0] not in counted))

        self.shared.walk_chain([prompt for prompt, _ in lazy],
                               [uniforms[members] for _, members in lazy], shape, settings,
                               self.sampling.share_max_unseen, on_result=tally)

    @staticmethod
    def _take(out: _Answers, members: np.ndarray, texts: list[str | None], unseen: float,
              stats: DecisionStats, calls: int, distinct: int = 1) -> np.ndarray:
        """Answers drawn for ``members``; the members left without one (a None: a walk
        into a prefix too unlikely to have been probed), for a lazy walk or a call of
        their own."""
        got = np.fromiter((t is not None for t in texts), bool, len(texts))
        idx = members[got]
        out.texts[idx] = np.asarray([t for t in texts if t is not None], dtype=object)
        out.shared[idx] = True
        stats.unseen_mass_max = max(stats.unseen_mass_max, unseen)
        report_agents(idx.size, distinct=distinct, calls=calls)
        return members[~got]

    def counters(self) -> dict[str, dict]:
        return self.backend.counters()


class _AnswerTally:
    """A back-end's answers as they arrive (``simpipe.inference.base.listening``): each is
    an agent answered and a model call made, reported to the partition's task (on any
    thread: the reporter is thread-safe)."""

    def __init__(self, reporter: TaskReporter | None) -> None:
        self.reporter = reporter
        self.done = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
        if self.reporter is not None:
            self.reporter.add(n, calls=n)


class _Answers:
    """Per-agent answer columns, filled by shared draws and by calls."""

    def __init__(self, n: int) -> None:
        self.texts = np.full(n, None, dtype=object)
        self.shared = np.zeros(n, bool)
        self.failed = np.zeros(n, bool)
        self.tokens_in = np.zeros(n, np.int64)
        self.tokens_out = np.zeros(n, np.int64)
        self.latency_s = np.zeros(n, np.float64)
        self.errors = np.full(n, None, dtype=object)
        self.finish = np.full(n, None, dtype=object)

    def cut(self, max_tokens: int) -> np.ndarray:
        """Which answers the back-end stopped at ``max_tokens``: its finish reason says
        "length", or, where it gave none, the answer used the whole budget. Shared answers
        are whole answers of the answer language, never cut: the config refuses a
        ``max_tokens`` below the longest answer's characters
        (``simpipe.config.population_mix.check_answer_room``), so no walk reaches it."""
        called = ~self.shared
        length = np.fromiter((f == "length" for f in self.finish), bool, len(self.finish))
        unknown = np.fromiter((f is None for f in self.finish), bool, len(self.finish))
        return called & (length | (unknown & (self.tokens_out >= max_tokens)))

    def fill(self, idx: np.ndarray, answers: AnswerColumns) -> None:
        n = len(answers)
        self.texts[idx] = np.fromiter(answers.text, object, n)
        self.failed[idx] = np.fromiter((e is not None for e in answers.error), bool, n)
        self.tokens_in[idx] += np.fromiter(answers.tokens_in, np.int64, n)
        self.tokens_out[idx] += np.fromiter(answers.tokens_out, np.int64, n)
        self.latency_s[idx] = np.fromiter(answers.latency_s, np.float64, n)
        self.errors[idx] = np.fromiter(answers.error, object, n)
        self.finish[idx] = np.fromiter(answers.finish, object, n)
