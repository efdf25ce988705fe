"""Several prompts' exact answer-logit probes evaluated together in fixed batches
(``llamacpp_batch``), with the real Gemma model: the same bits run after run, the serial
chain's distributions within the measured tolerance, a list of one prompt bit for bit as the
chain, and the round plan's trees and the partitions' lazy walks computed that way."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from simpipe.answers.distribution import AnswerDistribution, LazyTree, answer_distribution
from simpipe.answers.shared import SharedAnswers, step_uniforms
from simpipe.answers.tree import TreeShape
from simpipe.bench.invariance import round3_prompts
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.base import GenerationRequest
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.batch import (
    GROUP,
    IN_FLIGHT,
    LONG_WALK,
    PREFIX_BLOCK,
    SHORT_WALK_IN_FLIGHT,
    BatchEngine,
    _Entry,
    _Group,
    _Pipeline,
    _PrefixStates,
    likely_first,
    shared_prefix,
)
from simpipe.inference.settings import LlamaCppSettings
from simpipe.inference.types import ChainSettings, ProbeError

from support import total_variation

LANG = IntegerAnswers(0, 100)
PLAIN = ChainSettings(1.0)
MAX_TOKENS = 6
#: How far (total variation) a tree computed in the batches may be from the serial chain's.
#: Measured on 16 round-3 prompts: 0.017-0.039, as far as the chain's own trees are from
#: the same prompts' trees each computed alone (0-0.036: a chain's numbers depend on the
#: prompt before, the batches' on the batch; docs/measurements.md, "Batched exact probes").
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=2, threads=2))
    yield b
    asyncio.run(b.aclose())


def _tree(vocab):
    return lambda i, probe: answer_distribution(probe, LANG, vocab, PLAIN, MAX_TOKENS)


def _batched(backend, prompts):
    vocab = backend.answer_vocab(LANG.alphabet)
    return backend.probe_each(prompts, _tree(vocab), vocab, PLAIN)


def _chained(backend, prompts):
    vocab = backend.answer_vocab(LANG.alphabet)
    with backend.logprob_chain(vocab, PLAIN) as probe_for:
        return [_tree(vocab)(i, probe_for(p)) for i, p in enumerate(prompts)]


def _same(a: AnswerDistribution, b: AnswerDistribution) -> bool:
    return a.texts == b.texts and np.array_equal(a.probs, b.probs)


def test_the_groups_depend_on_the_prompts_and_sizes_only():
    """Groups of ``n_seq`` prompts in list order, each with the cells it may hold (its
    trie, its probes' room, a prefix carried); one that would not fit the pool is halved
    until it does."""
    short, long = [1, 2, 3], list(range(100, 160))
    engine = SimpleNamespace(n_seq=4, n_ctx=300)
    # 4 x [1, 2, 3]: a trie of 3 cells, 4 x 32 of room, 3 carried.
    assert BatchEngine.groups(engine, [short] * 10) == [(0, 4, 134), (4, 8, 134),
                                                        (8, 10, 70)]
    mixed = [short, long, [7, *long], [8, *long], short]
    # The first four: a trie of 185 cells, 4 x 32 of room, 61 carried: over 300, halved.
    assert BatchEngine.groups(engine, mixed) == [(0, 2, 63 + 64 + 60),
                                                 (2, 4, 122 + 64 + 61), (4, 5, 3 + 32 + 3)]


@pytest.mark.llm
def test_batched_trees_repeat_bit_for_bit_and_match_the_chain(backend):
    prompts = round3_prompts(GROUP + 2)  # a full group, then one of two with a carried prefix
    before = backend.counters()["llamacpp"]["tokens_in"]
    batched = _batched(backend, prompts)
    spent = backend.counters()["llamacpp"]["tokens_in"] - before
    again = _batched(backend, prompts)
    chained = _chained(backend, prompts)
    assert all(_same(a, b) for a, b in zip(batched, again, strict=True))
    gaps = [total_variation(a, c) for a, c in zip(batched, chained, strict=True)]
    assert max(gaps) <= TOLERANCE, gaps
    # The batches evaluate what the chain does: each prompt's tokens not shared with the
    # one before it (a group's trie, the prefix carried between groups), then the probes.
    assert sum(t.tokens_in for t in batched) == sum(t.tokens_in for t in chained) == spent
    assert [t.calls for t in batched] == [t.calls for t in chained]


def _walker(backend, prompts, agents=3, stall=None):
    """Lazy walks of ``agents`` agents per prompt, as a partition's or the plan's; ``stall``:
    a pause before each probe (another timing of the works' threads)."""
    vocab = backend.answer_vocab(LANG.alphabet)
    shape = TreeShape(LANG, vocab, MAX_TOKENS)
    uniforms = step_uniforms(np.arange(agents * len(prompts)), MAX_TOKENS).reshape(
        len(prompts), agents, MAX_TOKENS)

    def work(i, probe):
        def slow(path, top_n):
            if stall is not None:
                time.sleep(stall())
            return probe(path, top_n)
        return LazyTree(slow, shape, PLAIN).walk(uniforms[i])

    return work, vocab


@pytest.fixture
def engines(backend):
    """A batched engine with one group in the pool at a time and one with the default
    pipeline, on the backend's model; the answer logits and the tokenizer."""
    vocab = backend.answer_vocab(LANG.alphabet)
    logits_of = backend.exact_answer_logits(vocab, PLAIN)
    hidden = backend._hidden
    made = [BatchEngine(hidden, GROUP, 4096, 1, in_flight=1), BatchEngine(hidden, GROUP, 4096, 1)]
    yield made, logits_of, hidden.tokenize
    for engine in made:
        engine.close()


def _counting(engine, fail_at=None):
    """The decodes ``engine`` makes from now on: each one's entries; the ``fail_at``-th
    (from 1) fails as a llama.cpp decode does (the pool emptied)."""
    seen: list[list[_Entry]] = []
    decode = engine.decode

    def counted(entries):
        seen.append(list(entries))
        if len(seen) == fail_at:
            engine.reset()
            raise ProbeError("llama_decode of a batch failed (code 1, 0 of 1 hidden states)")
        return decode(entries)

    engine.decode = counted
    return seen


def _seqs(entries) -> set[int]:
    """The sequence ids a decode's entries hold."""
    return {s for e in entries for s in e.seqs}


@pytest.mark.llm
def test_later_groups_prompts_share_decodes_with_earlier_groups_probes(backend, engines):
    """Several groups in the pool: a group's prompts are decoded together with the probes of
    the groups before it (a probe is then a token of a big decode, not a decode of a few
    tokens), and the answers are the same on every run whatever the works' timing."""
    (alone, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(3 * GROUP)]
    work, _ = _walker(backend, prompts)
    one_by_one = _counting(alone)
    alone.run(prompts, work, logits_of)
    together = _counting(piped)
    first = piped.run(prompts, work, logits_of)
    groups = [{s // GROUP for s in _seqs(d) if s < piped.carry} for d in together]
    assert max(len(g) for g in groups) >= 2
    assert all(len({s // GROUP for s in _seqs(d)}) == 1 for d in one_by_one)
    assert len(together) < len(one_by_one)
    rng = random.Random(3)
    stalled, _ = _walker(backend, prompts, stall=lambda: rng.random() * 0.003)
    assert piped.run(prompts, stalled, logits_of) == first
    assert piped.run(prompts, work, logits_of) == first
    assert all(t.strip().isdigit() for answers in first for t in answers)


def test_the_lookahead_is_the_first_token_most_prompts_probed():
    """Over half of the prompts that probed a first answer token must have probed it; a
    full tree probes every first token, and then the lowest id is taken."""
    assert likely_first(Counter(), 0) is None
    assert likely_first(Counter({7: 3, 5: 1}), 4) == 7  # a walk: most take a space first
    assert likely_first(Counter({7: 2, 5: 2}), 4) is None
    assert likely_first(Counter({7: 4, 5: 4, 9: 4}), 4) == 5  # full trees
    assert likely_first(Counter({7: 2}), 5) is None


@pytest.mark.llm
def test_the_answers_first_token_is_decoded_with_its_prompt(backend, engines, monkeypatch):
    """After the first group, each prompt's trie also decodes the first answer token that
    most prompts before probed (the space before a number), in the same decode: that probe
    is answered without a decode of its own, the list takes fewer decodes, and a wrong guess
    costs one token, nothing else."""
    (_, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(6 * GROUP)]
    space, four, two = tokenize(" 42")[1:]
    seven = tokenize("7")[-1]
    # Each prompt's probes as a walk of one agent makes them: the root, the space, a digit,
    # a second digit; every fifth prompt after the first group answers "7" (no space).
    odd = {i for i in range(GROUP, len(prompts)) if i % 5 == 0}

    def work(i, probe):
        paths = [(), (seven,)] if i in odd else [(), (space,), (space, four), (space, four, two)]
        return [probe(path, 4)[0] for path in paths]

    tries: dict[int, tuple[int | None, list[_Entry]]] = {}  # by a group's first prompt
    decoded: list[tuple[int, tuple[int, ...]]] = []  # the probes that took a decode
    prefill, step_entries = _Group.prefill, _Group.step_entries

    def spied_prefill(group, source, holds, lookahead=None):
        prefill(group, source, holds, lookahead)
        tries[group.first] = (lookahead, list(group.entries))

    def spied_steps(group):
        decoded.extend((group.first + i, tokens[len(group.prompts[i]):])
                       for i, tokens in group.waiting.items())
        return step_entries(group)

    piped.run(prompts, work, logits_of)  # the rules' state kept: neither run below decodes it
    monkeypatch.setattr(_Group, "prefill", spied_prefill)
    monkeypatch.setattr(_Group, "step_entries", spied_steps)
    seen = _counting(piped)
    answers = piped.run(prompts, work, logits_of)
    del piped.decode

    assert tries[0][0] is None  # nothing probed yet
    assert {(i, path) for i, path in decoded if i < GROUP and len(path) == 1} == {
        (i, (space,)) for i in range(GROUP)}
    for first in range(GROUP, len(prompts), GROUP):
        lookahead, entries = tries[first]
        assert lookahead == space
        ahead = sorted(e.pos for e in entries if e.token == space and e.output)
        assert ahead == sorted(len(prompts[i]) for i in range(first, first + GROUP))
    assert not [i for i, path in decoded if i >= GROUP and path == (space,)]

    monkeypatch.setattr(_Pipeline, "lookahead", lambda self: None)
    without = _counting(piped)
    alone = piped.run(prompts, work, logits_of)
    del piped.decode
    assert len(seen) < len(without)
    assert sum(map(len, seen)) == sum(map(len, without)) + len(odd)
    # Other bits (another batch), the same distributions within the batches' tolerance.
    gaps = [_probe_tv(a, b) for got, ref in zip(answers, alone, strict=True)
            for a, b in zip(got, ref, strict=True)]
    assert 0 < max(gaps) <= TOLERANCE, max(gaps)


def _probe_tv(a, b) -> float:
    """Total variation between two probes' answer-token distributions."""
    def probs(top):
        logits = np.array(top.logprobs)
        p = np.exp(logits - logits.max())
        return dict(zip(top.ids, p / p.sum(), strict=True))
    pa, pb = probs(a), probs(b)
    return 0.5 * sum(abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in set(pa) | set(pb))


@pytest.mark.llm
def test_the_pool_takes_more_groups_only_while_its_walks_are_long(backend, engines):
    """Groups whose walks end after a probe or two (prompts of a few agents) share the pool
    two at a time: more would make every token's attention step over their cells. Groups
    that walk a long path (prompts of hundreds of agents) fill it, so that their probes
    share decodes."""
    (_, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(6 * GROUP)]
    path = tuple(tokenize("12345678901234"))

    def walking(steps):
        def work(i, probe):
            return [probe(path[:k], 4) for k in range(steps)]
        return work

    def groups_per_decode(steps):
        seen = _counting(piped)
        piped.run(prompts, walking(steps), logits_of)
        del piped.decode
        return [len({s // GROUP for s in _seqs(d) if s < piped.carry}) for d in seen]

    assert max(groups_per_decode(2)) == SHORT_WALK_IN_FLIGHT
    assert max(groups_per_decode(2 * LONG_WALK)) == IN_FLIGHT > SHORT_WALK_IN_FLIGHT


@pytest.mark.llm
def test_a_failed_decode_costs_the_prompts_in_it_not_the_batch(backend, engines):
    """A decode that fails (llama.cpp empties the pool) fails the prompts it held (the
    probes of the groups in the pool, the prompts of the group entering); the groups after
    it are answered, and the next run is as a clean one."""
    (_, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(4 * GROUP)]
    walk, _ = _walker(backend, prompts)

    def work(i, probe):
        try:
            return walk(i, probe)
        except ProbeError as exc:
            return str(exc)

    clean = piped.run(prompts, work, logits_of)
    _counting(piped, fail_at=2)  # the first group's probes, the second group's prompts
    got = piped.run(prompts, work, logits_of)
    failed = [i for i, g in enumerate(got) if isinstance(g, str)]
    assert failed == list(range(2 * GROUP))
    assert all("llama_decode of a batch failed" in got[i] for i in failed)
    assert all(t.strip().isdigit() for i, g in enumerate(got) if i not in failed for t in g)
    del piped.decode
    assert piped.run(prompts, work, logits_of) == clean


def test_the_shared_prefix_is_what_every_usable_prompt_starts_with_in_whole_blocks():
    rules = list(range(1000, 1000 + 2 * PREFIX_BLOCK + 5))  # 2 blocks and 5 tokens
    a, b = [*rules, 1, 2, 3], [*rules, 1, 7]
    assert shared_prefix([a, b], None, 1000) == tuple(rules[:2 * PREFIX_BLOCK])
    # Short of every prompt's last token: that one's hidden state answers the prompt.
    assert shared_prefix([rules[:PREFIX_BLOCK], [*rules[:PREFIX_BLOCK], 9]], None, 1000) == ()
    assert shared_prefix([a], None, 1000) == ()  # one prompt shares nothing with another
    stranger = [5, *rules]
    assert shared_prefix([a, stranger, b], None, 1000) == ()
    # Refused, empty and too long prompts are evaluated by nobody: they do not count.
    assert shared_prefix([a, stranger, b], [None, "refused", None], 1000) == shared_prefix(
        [a, b], None, 1000)
    assert shared_prefix([a, [], b, [5] * 2000], None, 1000) == shared_prefix([a, b], None, 1000)


def test_kept_prefix_states_drop_the_least_recently_used_past_their_bytes():
    states = _PrefixStates(max_bytes=300)
    states.put((1,), np.zeros(100, np.uint8))
    states.put((2,), np.zeros(100, np.uint8))
    states.put((3,), np.zeros(100, np.uint8))
    assert states.get((1,)) is not None  # now the most recently used
    states.put((4,), np.zeros(100, np.uint8))
    assert states.get((2,)) is None and len(states) == 3
    states.put((5,), np.zeros(1000, np.uint8))  # over the bound alone: kept, the rest dropped
    assert len(states) == 1 and states.get((5,)) is not None


@pytest.mark.llm
def test_a_later_list_restores_the_kept_rules_with_the_same_bits(backend):
    """Two lists with the same rules in one process: the second restores the rules' state
    instead of decoding them again, and its answers are those it gets from an engine that
    decodes them (the order of the walk tasks on a worker changes no answer)."""
    vocab = backend.answer_vocab(LANG.alphabet)
    logits_of = backend.exact_answer_logits(vocab, PLAIN)
    hidden = backend._hidden
    first, second = ([hidden.tokenize(p) for p in round3_prompts(2 * GROUP, seed=seed)]
                     for seed in (7, 8))
    prefix = shared_prefix(second, None, 4096)
    assert len(prefix) >= 4 * PREFIX_BLOCK and prefix == shared_prefix(first, None, 4096)

    def evaluated(engine, prompts):
        work, _ = _walker(backend, prompts)
        tokens = []
        got = engine.run(prompts, work, logits_of, on_probe=lambda n, _s: tokens.append(n))
        return got, sum(tokens)

    warm, cold = BatchEngine(hidden, GROUP, 4096, 1), BatchEngine(hidden, GROUP, 4096, 1)
    try:
        evaluated(warm, first)
        restored, warm_tokens = evaluated(warm, second)
        decoded, cold_tokens = evaluated(cold, second)
        assert restored == decoded
        assert all(t.strip().isdigit() for answers in restored for t in answers)
        assert cold_tokens - warm_tokens == len(prefix)
        assert len(warm.prefixes) == len(cold.prefixes) == 1
    finally:
        warm.close()
        cold.close()


@pytest.mark.llm
def test_a_prefix_that_cannot_be_kept_is_decoded_with_the_first_group(backend, engines):
    """The rules' decode fails (llama.cpp empties the pool): no prompt is lost, the first
    group decodes the rules with its prompts, and the answers are the same bits."""
    (_, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(2 * GROUP)]
    work, _ = _walker(backend, prompts)
    clean = piped.run(prompts, work, logits_of)
    piped.prefixes = type(piped.prefixes)(piped.prefixes.max_bytes)  # nothing kept
    _counting(piped, fail_at=1)  # the rules' own decode
    assert piped.run(prompts, work, logits_of) == clean
    del piped.decode


class _WatchedApi:
    """llama.cpp's calls as ``real`` makes them, the pool's clears recorded (``data`` of
    each) and, while ``poison`` is set, every hidden state a decode gives turned to NaN (a
    model whose output overflows): ``states(engine)`` lists the arrays holding them."""

    def __init__(self, real, engine, states):
        self.real, self.engine, self.states = real, engine, states
        self.clears, self.poison = [], False

    def __getattr__(self, name):
        return getattr(self.real, name)

    def llama_memory_clear(self, memory, data):
        self.clears.append(bool(data))
        return self.real.llama_memory_clear(memory, data)

    def llama_decode(self, ctx, batch):
        rc = self.real.llama_decode(ctx, batch)
        if self.poison:
            for rows in self.states(self.engine):
                rows[:] = np.nan
        return rc


@pytest.mark.llm
def test_the_pool_is_zeroed_only_after_a_decode_gave_a_non_finite_state(backend, engines):
    """A list ends with its cells freed, not zeroed (a free cell is masked); after a decode
    whose hidden states were not finite (NaN weighed by 0 is no 0) the next clear zeroes the
    pool, and the next list gets the answers it gets on a clean pool."""
    (_, piped), logits_of, tokenize = engines
    prompts = [tokenize(p) for p in round3_prompts(GROUP + 2)]
    work, _ = _walker(backend, prompts)
    clean = piped.run(prompts, work, logits_of)
    api = piped.api = _WatchedApi(piped.api, piped, lambda engine: engine._rows)
    try:
        assert piped.run(prompts, work, logits_of) == clean
        assert api.clears and not any(api.clears)
        api.clears.clear()
        api.poison = True
        [row] = piped.decode([_Entry(t, pos, [0], pos == len(prompts[0]) - 1)
                              for pos, t in enumerate(prompts[0])])
        api.poison = False
        assert np.isnan(row).all()
        piped.reset()
        piped.reset()
        assert api.clears == [True, False]
        assert piped.run(prompts, work, logits_of) == clean
    finally:
        piped.api = api.real


@pytest.mark.llm
def test_the_chains_cache_is_zeroed_only_after_a_non_finite_state(backend):
    """The serial chain's engine clears its cache the same way as the batches'."""
    hidden = backend._hidden
    tokens = hidden.tokenize(round3_prompts(1)[0])
    state, _ = hidden.hidden_after(tokens)
    api = hidden.api = _WatchedApi(hidden.api, hidden,
                                   lambda engine: [engine._hidden] if engine._hidden is not None
                                   else [])
    try:
        hidden.reset()
        api.poison = True
        poisoned, _ = hidden.hidden_after(tokens)
        api.poison = False
        assert np.isnan(poisoned).all()
        hidden.reset()
        hidden.reset()
        assert api.clears == [False, True, False]
        again, _ = hidden.hidden_after(tokens)
        assert np.array_equal(again, state)
    finally:
        hidden.api = api.real
        hidden.reset()


@pytest.mark.llm
def test_a_list_of_one_prompt_gives_the_chains_bits(backend):
    prompt = round3_prompts(3)[1]
    [alone] = _batched(backend, [prompt])
    [chained] = _chained(backend, [prompt])
    assert _same(alone, chained)


@pytest.mark.llm
def test_the_round_plans_trees_and_lazy_walks_are_computed_in_batches(backend):
    """``SharedAnswers.compute_chain`` (the round plan's chunks) gives the batches' trees,
    and lazy walks (a partition's distinct prompts) give the same answers run after run."""
    prompts = round3_prompts(4)
    planned = SharedAnswers(backend).compute_chain(prompts, PLAIN, MAX_TOKENS, (0.0, 100.0),
                                                   1e-4)
    assert all(_same(p.distribution, b) for p, b in zip(planned, _batched(backend, prompts),
                                                         strict=True))
    vocab = backend.answer_vocab(LANG.alphabet)
    shape = TreeShape(LANG, vocab, MAX_TOKENS)
    uniforms = step_uniforms(np.arange(3 * len(prompts)), MAX_TOKENS).reshape(
        len(prompts), 3, MAX_TOKENS)  # three agents on each prompt

    def walks():
        return backend.probe_each(
            prompts, lambda i, probe: LazyTree(probe, shape, PLAIN).walk(uniforms[i]),
            vocab, PLAIN)

    first = walks()
    assert first == walks()
    assert all(isinstance(t, str) and t.strip().isdigit() for answers in first for t in answers)


@pytest.mark.llm
def test_a_prompt_too_long_for_the_pool_is_refused_alone(backend):
    """Its probes raise ProbeError (its agents then get calls of their own); the others in
    its group are answered."""
    vocab = backend.answer_vocab(LANG.alphabet)
    logits_of = backend.exact_answer_logits(vocab, PLAIN)
    hidden = backend._hidden
    engine = BatchEngine(hidden, 2, 256, 1)
    try:
        short = hidden.tokenize("Guess a number: ")
        long = hidden.tokenize("one two three " * 80 + "Guess a number: ")

        def root(i, probe):
            try:
                return probe((), 1)[0].ids[0]
            except ProbeError as exc:
                return str(exc)

        got = engine.run([short, long], root, logits_of)
        assert isinstance(got[0], int) and "does not fit the context of 256" in got[1]
    finally:
        engine.close()


@pytest.mark.llm
def test_planned_answers_never_start_the_server_and_a_closed_backend_answers_errors():
    # A planned round's answers come from the exact answer logits alone: the server (a
    # second copy of the model in memory) starts only with the first sampled call. After
    # aclose, a call is one error per request, not an exception from the shut-down pool.
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=2, threads=1))
    try:
        trees = _batched(b, round3_prompts(2))
        assert len(trees) == 2 and all(t.texts for t in trees)
        assert b._server is None
        [first] = asyncio.run(b.generate([GenerationRequest(prompt="My number:", max_tokens=2)]))
        assert first.status != "error" and b._server is not None
    finally:
        asyncio.run(b.aclose())
    [closed] = asyncio.run(b.generate([GenerationRequest(prompt="My number:", max_tokens=2)]))
    assert closed.status == "error" and "closed" in closed.error
