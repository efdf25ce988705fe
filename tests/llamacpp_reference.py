"""A literal re-enactment of llama.cpp's sampling, for tests: every logit known.

``chain_probs`` is the sampler chain (top_k, top_p, min_p, temperature, then the draw) over
one candidate array; ``grammar_sampling`` is ``common_sampler_sample``'s
rejection-and-resample under a grammar. Written from llama.cpp's ``src/llama-sampler.cpp``
and ``common/sampling.cpp``, independently of ``simpipe.inference.llamacpp.sampler``.
"""

from __future__ import annotations

import math

import numpy as np

from simpipe.inference.types import ChainSettings


def chain_probs(logits: np.ndarray, s: ChainSettings) -> np.ndarray:
    """llama.cpp's chain over one candidate array (-inf = masked): top_k, top_p, min_p, temp."""
    n = logits.size
    order = np.argsort(-logits, kind="stable")
    keep = np.zeros(n, bool)
    keep[order[: s.top_k if s.top_k > 0 else n]] = True
    if s.top_p < 1.0:
        cand = order[keep[order]]
        p = np.exp(logits[cand] - logits[cand].max())
        p /= p.sum()
        last = int(np.nonzero(np.cumsum(p) >= s.top_p)[0][0]) + 1
        keep[:] = False
        keep[cand[:last]] = True
    if s.min_p > 0.0:
        threshold = logits[keep].max() + math.log(s.min_p)
        keep &= logits >= threshold
    out = np.where(keep, logits, -np.inf)
    if s.temperature <= 0.0:
        best = int(np.argmax(out))
        probs = np.zeros(n)
        probs[best] = 1.0
        return probs
    z = np.exp((out - out[keep].max()) / s.temperature)
    return z / z.sum()


def grammar_sampling(logprobs: np.ndarray, valid: np.ndarray, s: ChainSettings) -> np.ndarray:
    """P(return t) for every token, all logits known: C(t)[t valid] + R * M(t) (the
    two-stage draw in closed form; test_llamacpp_sampler re-enacts the draw itself)."""
    c = chain_probs(logprobs, s)
    m = chain_probs(np.where(valid, logprobs, -np.inf), s)
    rejected = c[~valid].sum()
    return np.where(valid, c, 0.0) + rejected * m
