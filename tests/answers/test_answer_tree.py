"""Answers walked lazily through an answer tree against the full tree on a synthetic model
whose every logit is known: the same draw function gives the same answers with the same
uniforms, a lone agent costs a few probes, and many agents' draws follow the distribution."""

from __future__ import annotations

import numpy as np
from scipy import stats
from test_answer_distribution import VOCAB, _probe

from simpipe.answers.distribution import LazyTree, answer_distribution
from simpipe.answers.shared import full_tree_pays, step_uniforms
from simpipe.answers.tree import TOGETHER_FROM, TreeShape, draw_answer
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.types import ChainSettings

LANGUAGE = IntegerAnswers(0, 100)
MAX_TOKENS = 6
SETTINGS = ChainSettings(1.0)


def _lazy(seed: int, calls: list, settings: ChainSettings = SETTINGS) -> LazyTree:
    return LazyTree(_probe(seed, calls), TreeShape(LANGUAGE, VOCAB, MAX_TOKENS), settings)


def test_lazy_and_full_trees_give_the_same_answers_with_the_same_uniforms() -> None:
    for settings in (ChainSettings(1.0), ChainSettings(0.7, top_p=0.9)):
        full = answer_distribution(_probe(3, []), LANGUAGE, VOCAB, settings, MAX_TOKENS)
        lazy = _lazy(3, [], settings)
        u = step_uniforms(np.arange(3000), MAX_TOKENS)
        walked = lazy.walk(u)
        assert full.walk(u) == walked


def test_agents_walked_together_answer_and_probe_as_walked_one_by_one() -> None:
    # Many agents move through a tree together (a million in seconds); a lazy tree must
    # still be probed at the same prefixes, in the same order, with the same reach (the
    # bits of a chain's probe depend on what it evaluated before), and every agent must
    # get the answer its own walk gives.
    for seed, settings, agents in ((3, ChainSettings(1.0), 3000),
                                   (5, ChainSettings(0.7, top_p=0.9), 500),
                                   (8, ChainSettings(1.5, top_k=5), TOGETHER_FROM)):
        u = step_uniforms(np.arange(agents) * 7 + seed, MAX_TOKENS)
        together_calls: list = []
        together = _lazy(seed, together_calls, settings)
        alone_calls: list = []
        alone = _lazy(seed, alone_calls, settings)
        one_by_one = [draw_answer(alone.node, alone.shape, row) for row in u]
        assert together.walk(u) == one_by_one
        assert together_calls == alone_calls and len(alone_calls) > 3
        assert together.unseen_mass == alone.unseen_mass
        assert together.nodes.keys() == alone.nodes.keys()
    # A full tree's pruned prefixes give no answer (None), together as one by one.
    full = answer_distribution(_probe(4, []), LANGUAGE, VOCAB, SETTINGS, MAX_TOKENS,
                               prune_below=0.02)
    u = step_uniforms(np.arange(4000), MAX_TOKENS)
    walked = full.walk(u)
    assert walked == [draw_answer(lambda p, t, r: full.nodes.get(p), full.shape, row)
                      for row in u]
    assert 0 < walked.count(None) < len(walked)


def test_one_agent_costs_a_few_probes_and_many_converge_on_the_full_tree() -> None:
    calls: list = []
    _lazy(5, calls).walk(step_uniforms(np.array([7]), MAX_TOKENS))
    assert 1 <= len(calls) <= 4
    full_calls: list = []
    answer_distribution(_probe(5, []), LANGUAGE, VOCAB, ChainSettings(1.0), MAX_TOKENS)
    answer_distribution(_probe(5, full_calls), LANGUAGE, VOCAB, ChainSettings(1.0),
                        MAX_TOKENS)
    many: list = []
    _lazy(5, many).walk(step_uniforms(np.arange(5_000), MAX_TOKENS))
    assert len(calls) < len(many) <= len(full_calls)


def test_walked_answers_follow_the_full_distribution() -> None:
    """Chi-square of 5,000 walked answers against the full tree's probabilities (fixed
    seeds: a fixed p-value)."""
    full = answer_distribution(_probe(8, []), LANGUAGE, VOCAB, ChainSettings(1.0), MAX_TOKENS)
    walked = _lazy(8, []).walk(step_uniforms(np.arange(5_000), MAX_TOKENS))
    index = {t: i for i, t in enumerate(full.texts)}
    counts = np.bincount([index[t] for t in walked], minlength=len(full.texts))
    expected = full.probs / full.probs.sum() * len(walked)
    keep = expected >= 5  # merge the rare answers into one cell
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    p = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
    assert keep.sum() >= 5 and p >= 0.01


def test_same_seeds_same_uniforms_and_steps_differ() -> None:
    a = step_uniforms(np.array([1, 2, 3]), 6)
    assert np.array_equal(a, step_uniforms(np.array([1, 2, 3]), 6))
    assert a.shape == (3, 6) and ((a >= 0) & (a < 1)).all()
    assert len(np.unique(a)) == a.size


def test_a_full_tree_pays_only_for_prompts_many_agents_share() -> None:
    assert not full_tree_pays(1) and not full_tree_pays(7)
    assert full_tree_pays(8) and full_tree_pays(1000)
