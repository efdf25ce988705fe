"""The answer tree against a brute-force enumeration on a synthetic model whose every
logit is known: same answers, same probabilities, and the unseen mass really bounds the
difference."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import pytest

from simpipe.answers.distribution import (
    PRUNE_BELOW,
    RETRY_TOP_N,
    TooMuchUnseen,
    answer_distribution,
)
from simpipe.answers.shared import (
    MAX_PRUNE,
    OWN_CALL_S,
    PROBE_S,
    prune_below,
    step_uniforms,
)
from simpipe.games.answer_format import IntegerAnswers
from simpipe.inference.types import AnswerVocab, ChainSettings, TopLogprobs

from llamacpp_reference import grammar_sampling

N_VOCAB = 2000
EOG = (0, 1)
# The answer pieces a real vocabulary has: a space, digits, the same as byte tokens, a
# double space and a minus (never valid for 0..100).
PIECES = {2: " ", **{3 + d: str(d) for d in range(10)}, 13: " ",
          **{14 + d: str(d) for d in range(10)}, 24: "  ", 25: "-"}
VOCAB = AnswerVocab(N_VOCAB, frozenset(EOG), PIECES)


def _logprobs(path: tuple[int, ...], seed: int) -> np.ndarray:
    """A deterministic next-token distribution: noise, with answer tokens made likely."""
    digest = hashlib.blake2b(repr((seed, path)).encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    logits = rng.normal(-4.0, 2.5, N_VOCAB)
    logits[list(PIECES)[:11]] += rng.normal(4.0, 1.5, 11)  # space and digits
    logits[14:24] -= 12.0  # byte tokens: valid but very unlikely, as in a real model
    logits[list(EOG)] += 1.0 + 2.0 * len(path)  # ending gets likelier as the answer grows
    return logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


def _probe(seed: int, calls: list):
    def probe(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
        calls.append((path, top_n))
        lp = _logprobs(path, seed)
        order = np.argsort(-lp, kind="stable")[:top_n]
        return TopLogprobs(tuple(order.tolist()), tuple(lp[order].tolist()),
                           complete=top_n >= N_VOCAB), 1, 1
    return probe


def _truth(seed: int, language: IntegerAnswers, settings: ChainSettings,
           max_tokens: int) -> dict[str, float]:
    answers: dict[str, float] = defaultdict(float)
    stack = [((), "", 1.0)]
    while stack:
        path, text, reach = stack.pop()
        if len(path) >= max_tokens:
            answers[text] += reach
            continue
        valid = np.zeros(N_VOCAB, bool)
        for tid, piece in PIECES.items():
            valid[tid] = language.is_prefix(text + piece)
        if language.is_complete(text):
            valid[list(EOG)] = True
        probs = grammar_sampling(_logprobs(path, seed), valid, settings)
        for tid in np.nonzero(probs > 0)[0].tolist():
            if tid in EOG:
                answers[text] += reach * probs[tid]
            else:
                stack.append((path + (tid,), text + PIECES[tid], reach * probs[tid]))
    return answers


@pytest.mark.parametrize("settings", [ChainSettings(1.0), ChainSettings(0.7, top_p=0.9),
                                      ChainSettings(1.3, top_k=50, min_p=0.02),
                                      ChainSettings(0.0)], ids=repr)
@pytest.mark.parametrize("bounds,max_tokens", [((0, 100), 6), ((0, 100), 2), ((10, 20), 5)])
def test_tree_matches_brute_force(settings: ChainSettings, bounds: tuple[int, int],
                                  max_tokens: int) -> None:
    language = IntegerAnswers(*bounds)
    truth = _truth(3, language, settings, max_tokens)
    calls: list = []
    dist = answer_distribution(_probe(3, calls), language, VOCAB, settings, max_tokens)
    got = dict(zip(dist.texts, dist.probs.tolist(), strict=True))
    keys = set(truth) | set(got)
    tv = sum(abs(truth.get(k, 0.0) - got.get(k, 0.0)) for k in keys) / 2
    assert tv <= dist.unseen_mass + 1e-12
    assert dist.unseen_mass <= 1e-4
    assert dist.calls == len(calls)
    assert abs(dist.probs.sum() - 1.0) <= dist.unseen_mass + 1e-12
    assert dist.texts == tuple(sorted(dist.texts))


def test_same_probe_same_distribution_and_draws() -> None:
    language = IntegerAnswers(0, 100)
    a = answer_distribution(_probe(5, []), language, VOCAB, ChainSettings(1.0), 6)
    b = answer_distribution(_probe(5, []), language, VOCAB, ChainSettings(1.0), 6)
    assert a.texts == b.texts and np.array_equal(a.probs, b.probs)
    u = step_uniforms(np.arange(1000), 6)
    assert a.walk(u) == b.walk(u)


def test_prefixes_are_asked_again_with_more_tokens_only_when_needed() -> None:
    calls: list = []
    answer_distribution(_probe(3, calls), IntegerAnswers(0, 100), VOCAB,
                        ChainSettings(1.0), 6, max_unseen=1e-6)
    wide = [c for c in calls if c[1] == RETRY_TOP_N]
    assert wide and len(wide) < len(calls) / 2


def test_too_much_unseen_is_refused_with_its_cost() -> None:
    def shallow(path: tuple[int, ...], top_n: int) -> tuple[TopLogprobs, int, int]:
        lp = _logprobs(path, 4)
        order = np.argsort(-lp, kind="stable")[:3]  # a server that returns only 3 tokens
        return TopLogprobs(tuple(order.tolist()), tuple(lp[order].tolist())), 7, 1
    with pytest.raises(TooMuchUnseen) as err:
        answer_distribution(shallow, IntegerAnswers(0, 100), VOCAB, ChainSettings(1.0), 6)
    assert err.value.cost.calls >= 1 and err.value.cost.tokens_in == 7 * err.value.cost.calls


def test_a_pruned_tree_skips_unlikely_prefixes_and_its_walks_there_get_calls() -> None:
    language = IntegerAnswers(0, 100)
    full_calls: list = []
    full = answer_distribution(_probe(4, full_calls), language, VOCAB, ChainSettings(1.0), 6)
    calls: list = []
    pruned = answer_distribution(_probe(4, calls), language, VOCAB, ChainSettings(1.0), 6,
                                 prune_below=1e-2)
    assert len(calls) < len(full_calls)
    # The pruned mass is no error: the answers kept have their exact probabilities, and
    # kept + pruned is the whole distribution (within the unseen allowance).
    whole = dict(zip(full.texts, full.probs.tolist(), strict=True))
    for text, p in zip(pruned.texts, pruned.probs.tolist(), strict=True):
        assert abs(p - whole[text]) <= full.unseen_mass + pruned.unseen_mass
    assert 0 < pruned.pruned_mass <= 0.2
    assert abs(pruned.probs.sum() + pruned.pruned_mass - 1.0) <= pruned.unseen_mass + 1e-9
    # Walks that reach a pruned prefix give None (a call of their own), at its rate.
    walked = pruned.walk(step_uniforms(np.arange(20_000), 6))
    missing = sum(t is None for t in walked) / len(walked)
    assert abs(missing - pruned.pruned_mass) < 4 * np.sqrt(pruned.pruned_mass / len(walked))
    # Walks that stay in the kept prefixes give the answers the full tree gives them.
    same = full.walk(step_uniforms(np.arange(20_000), 6))
    assert all(a == b for a, b in zip(walked, same, strict=True) if a is not None)


def test_pruning_follows_the_round_s_agents_on_a_prompt() -> None:
    # More agents on a prompt: more of its walks would reach a rare prefix, so less is cut.
    assert prune_below(1) == MAX_PRUNE
    assert prune_below(1000) < prune_below(100) < prune_below(10) <= MAX_PRUNE
    assert prune_below(10**9) == PRUNE_BELOW
    assert prune_below(1000) == pytest.approx(PROBE_S / (1000 * OWN_CALL_S))
