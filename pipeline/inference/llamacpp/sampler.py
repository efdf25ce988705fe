"""llama.cpp's token sampling under a grammar, as probabilities instead of a draw.

What ``common_sampler_sample`` (llama.cpp ``common/sampling.cpp``) does for one token, with
the server's default sampler order (top_k -> typical_p -> top_p -> min_p -> xtc ->
temperature -> dist; typical_p, xtc, penalties and DRY off):

1. apply the chain to the full vocabulary and draw a token;
2. if the grammar accepts that token, return it;
3. otherwise set every token the grammar rejects to -inf, apply the chain again to that
   masked vocabulary and draw again ("rejection and resample").

So the probability of a valid token ``t`` is ``C(t) + R * M(t)``: ``C`` the chain's
distribution over the full vocabulary, ``R`` the mass ``C`` gives to tokens the grammar
rejects, ``M`` the chain's distribution over the valid tokens only. Without truncation (no
top_k, top_p = 1, min_p = 0) this is exactly ``M`` for any temperature: ``C(t) = q_t / Z``
and ``R = 1 - sum_valid(q) / Z`` with ``q = p ** (1 / T)``, so ``C(t) + R * M(t) =
q_t / sum_valid(q)``.

The inputs are what a server gives out: the top ``n`` raw log-probabilities (the softmax of
the model's logits at temperature 1, before any sampler), not the whole vocabulary. Every
token not among them has a log-probability at most the smallest one given (``floor``).
Each function returns, beside the probabilities, a bound on the total-variation error that
the unseen tokens can cause, or ``None`` when the unseen tokens could change the answer
by more than that (the caller asks for more tokens or falls back to sampling).

Numbers: the server computes in float32, this module in float64; only a truncation boundary
(top_p, min_p) that falls within float32 rounding of a token could decide differently.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from simpipe.inference.types import ChainSettings, NextToken, TopLogprobs


def _softmax(logits: np.ndarray) -> np.ndarray:
    if logits.size == 0:
        return logits
    z = np.exp(logits - logits.max())
    return z / z.sum()


def _chain(ids: np.ndarray, logits: np.ndarray, s: ChainSettings,
           unseen_max: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The chain (top_k, top_p, min_p, temperature) over candidates sorted by logit.

    ``unseen_max``: the largest logit an unlisted candidate may have (-inf: none exists).
    Returns (ids, probabilities) of the tokens the chain keeps, or None when an unlisted
    candidate could be kept (the result would depend on what was not seen).
    """
    n = ids.size
    unseen = unseen_max > -math.inf
    if s.top_k > 0:
        if s.top_k > n and unseen:
            return None  # the k kept tokens would include unseen ones
        ids, logits, unseen = ids[: s.top_k], logits[: s.top_k], False
    if s.top_p < 1.0:
        # Softmax over the current candidates. With unseen ones still among them these are
        # all tokens, and the log-probabilities already are that softmax.
        probs = _softmax(logits) if not unseen else np.exp(logits)
        cum = np.cumsum(probs)
        hit = np.nonzero(cum >= s.top_p)[0]
        if hit.size:
            keep = int(hit[0]) + 1
            ids, logits, unseen = ids[:keep], logits[:keep], False
        elif unseen:
            return None
    if s.min_p > 0.0 and logits.size:
        threshold = logits.max() + math.log(s.min_p)
        keep_mask = logits >= threshold
        ids, logits = ids[keep_mask], logits[keep_mask]
        if unseen and unseen_max < threshold:
            unseen = False
    if unseen:
        return None
    if logits.size == 0:
        return ids, logits
    if s.temperature <= 0.0:
        best = int(np.argmax(logits))  # llama.cpp keeps the first maximum
        return ids[best:best + 1], np.ones(1)
    return ids, _softmax(logits / s.temperature)


def next_token(top: TopLogprobs, valid: Collection[int], n_unseen_valid: int,
               settings: ChainSettings) -> NextToken | None:
    """The distribution of the token llama.cpp's grammar-constrained sampler returns.

    ``valid``: the token ids the grammar accepts next (end-of-generation included where the
    answer may end). ``n_unseen_valid``: how many of them are not in ``top`` (their
    log-probabilities are unknown, at most ``top.floor``). None when the listed tokens do not
    determine the answer well enough (see the module docstring).
    """
    ids = np.asarray(top.ids, dtype=np.int64)
    logits = np.asarray(top.logprobs, dtype=np.float64)
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]
    valid_set = set(valid)
    is_valid = np.fromiter((int(t) in valid_set for t in ids), bool, ids.size)
    floor = top.floor
    if not settings.truncates:
        return _masked(ids[is_valid], logits[is_valid], n_unseen_valid, floor, settings)
    full = _chain(ids, logits, settings, floor)
    if full is None:
        return None
    kept_ids, kept_p = full
    probs: dict[int, float] = {}
    rejected = 0.0
    for t, p in zip(kept_ids.tolist(), kept_p.tolist(), strict=True):
        if t in valid_set:
            probs[t] = p
        else:
            rejected += p
    error = 0.0
    if rejected > 0.0:
        masked = _masked(ids[is_valid], logits[is_valid], n_unseen_valid, floor, settings)
        if masked is None:
            return None
        for t, p in masked.probs.items():
            probs[t] = probs.get(t, 0.0) + rejected * p
        error = rejected * masked.error_bound
    return NextToken(probs, error)


def _masked(ids: np.ndarray, logits: np.ndarray, n_unseen: int, floor: float,
            s: ChainSettings) -> NextToken | None:
    """The chain over the valid tokens only (the resample after a rejection)."""
    if ids.size == 0:
        return None  # no valid token seen: nothing to go on
    unseen_max = floor if n_unseen else -math.inf
    if s.temperature <= 0.0:
        # Greedy: an unseen valid token cannot beat a seen one above the floor.
        if logits.max() <= unseen_max:
            return None
        best = int(np.argmax(logits))
        return NextToken({int(ids[best]): 1.0}, 0.0)
    # Unseen valid tokens are left out; their weight relative to the kept ones bounds the
    # error (truncation can only remove them, so this bound holds with it too). A softmax
    # over the valid tokens cannot use the full-vocabulary trick, so top_p here needs them
    # all: treat them as absent and count them in the bound.
    kept = _chain(ids, logits, s, -math.inf)
    if kept is None or kept[0].size == 0:
        return None
    kept_ids, kept_p = kept
    error = 0.0
    if n_unseen and unseen_max > -math.inf:
        kept_logits = logits[np.isin(ids, kept_ids)]
        weight = n_unseen * math.exp((unseen_max - kept_logits.max()) / s.temperature)
        total = float(np.exp((kept_logits - kept_logits.max()) / s.temperature).sum())
        error = min(1.0, weight / total)
    return NextToken(dict(zip(kept_ids.tolist(), kept_p.tolist(), strict=True)), error)
