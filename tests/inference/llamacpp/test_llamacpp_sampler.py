"""The grammar-constrained sampling distribution, checked against a literal re-enactment of
llama.cpp's ``common_sampler_sample`` (draw from the chain; if the grammar rejects the token,
mask and draw again) on synthetic vocabularies where every logit is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from simpipe.inference.llamacpp.sampler import next_token
from simpipe.inference.types import ChainSettings, TopLogprobs

from llamacpp_reference import chain_probs as _chain_probs
from llamacpp_reference import grammar_sampling as _exact

VOCAB = 5000


def _vocab(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A vocabulary whose top 200 tokens hold about 92% of the mass, shuffled ids."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.5, VOCAB)
    logprobs = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    return rng.permutation(VOCAB), logprobs


def _top(ids: np.ndarray, logprobs: np.ndarray, n: int) -> TopLogprobs:
    order = np.argsort(-logprobs, kind="stable")[:n]
    return TopLogprobs(tuple(ids[order].tolist()), tuple(logprobs[order].tolist()))


SETTINGS = [
    ChainSettings(1.0),
    ChainSettings(0.7),
    ChainSettings(1.6),
    ChainSettings(1.0, top_p=0.9),
    ChainSettings(0.7, top_p=0.9),
    ChainSettings(0.8, top_p=0.95, top_k=40, min_p=0.05),  # llama.cpp server defaults
    ChainSettings(1.0, min_p=0.1),
    ChainSettings(0.0),
    ChainSettings(0.0, top_k=5),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=repr)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_the_full_vocabulary_computation(settings: ChainSettings, seed: int) -> None:
    ids, logprobs = _vocab(seed)
    rng = np.random.default_rng(seed + 100)
    # Valid tokens: a few likely ones and a few from the tail, like digits after a prompt.
    ranked = np.argsort(-logprobs)
    valid_pos = np.concatenate([rng.choice(ranked[:60], 6, replace=False), ranked[[80, 150]]])
    valid = np.zeros(VOCAB, bool)
    valid[valid_pos] = True
    truth = _exact(logprobs, valid, settings)

    top = _top(ids, logprobs, 200)
    seen = set(top.ids)
    valid_ids = ids[valid]
    unseen_valid = sum(int(t) not in seen for t in valid_ids)
    got = next_token(top, valid_ids.tolist(), unseen_valid, settings)
    assert got is not None
    expected = {int(ids[i]): truth[i] for i in np.nonzero(truth > 0)[0]}
    err = sum(abs(got.probs.get(t, 0.0) - p) for t, p in expected.items()) / 2
    err += sum(p for t, p in got.probs.items() if t not in expected) / 2
    assert err <= got.error_bound + 1e-9
    assert err < 1e-9  # every valid token was among the top 200
    assert sum(got.probs.values()) == pytest.approx(1.0)


def test_unseen_valid_tokens_are_bounded_not_ignored() -> None:
    ids, logprobs = _vocab(7)
    ranked = np.argsort(-logprobs)
    valid = np.zeros(VOCAB, bool)
    valid[ranked[[0, 3, 900, 1500]]] = True  # two of them far below the top 100
    top = _top(ids, logprobs, 100)
    valid_ids = ids[valid].tolist()
    unseen = sum(t not in set(top.ids) for t in valid_ids)
    assert unseen == 2
    got = next_token(top, valid_ids, unseen, ChainSettings(1.0))
    truth = _exact(logprobs, valid, ChainSettings(1.0))
    err = sum(abs(got.probs.get(int(ids[i]), 0.0) - truth[i]) for i in np.nonzero(valid)[0]) / 2
    assert 0 < err <= got.error_bound
    assert got.error_bound < 1e-2


def test_refuses_when_the_truncation_reaches_past_the_listed_tokens() -> None:
    ids, logprobs = _vocab(5)
    top = _top(ids, logprobs, 20)
    listed_mass = float(np.exp(np.asarray(top.logprobs)).sum())
    assert listed_mass < 0.99
    valid = [top.ids[0], top.ids[5]]
    assert next_token(top, valid, 0, ChainSettings(1.0, top_p=0.999)) is None
    assert next_token(top, valid, 0, ChainSettings(1.0, top_k=50)) is None
    # A nucleus that closes inside the listed tokens is exact.
    assert next_token(top, valid, 0, ChainSettings(1.0, top_p=listed_mass * 0.9)) is not None


def test_no_valid_token_seen_gives_none() -> None:
    ids, logprobs = _vocab(9)
    top = _top(ids, logprobs, 10)
    unlisted = int(ids[np.argsort(-logprobs)[500]])
    assert next_token(top, [unlisted], 1, ChainSettings(1.0)) is None


@pytest.mark.parametrize("settings", [ChainSettings(1.0), ChainSettings(0.7, top_p=0.9),
                                      ChainSettings(1.0, top_k=8)], ids=repr)
def test_the_formula_is_what_rejection_sampling_draws(settings: ChainSettings) -> None:
    """Re-enact the two-stage draw 40,000 times (fixed seed) and compare with the formula."""
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 2.0, 40)
    logprobs = logits - np.log(np.exp(logits).sum())
    valid = np.zeros(40, bool)
    valid[[1, 4, 9, 17, 30]] = True
    c = _chain_probs(logprobs, settings)
    m = _chain_probs(np.where(valid, logprobs, -np.inf), settings)
    n = 40_000
    first = rng.choice(40, size=n, p=c)
    second = rng.choice(40, size=n, p=m)
    drawn = np.where(valid[first], first, second)
    observed = np.bincount(drawn, minlength=40)[valid]
    got = next_token(TopLogprobs(tuple(range(40)), tuple(logprobs.tolist()), complete=True),
                     np.nonzero(valid)[0].tolist(), 0, settings)
    expected = np.array([got.probs.get(int(t), 0.0) for t in np.nonzero(valid)[0]]) * n
    keep = expected > 0
    assert observed[~keep].sum() == 0
    p = stats.chisquare(observed[keep], expected[keep]).pvalue
    assert p >= 0.01
