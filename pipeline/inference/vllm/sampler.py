"""vLLM's token sampling under structured output, as probabilities instead of a draw.

What vLLM's V1 engine does for one token (``vllm/v1/sample/sampler.py``, the structured-output
bitmask applied in ``vllm/v1/worker/gpu_model_runner.py`` before the sampler):

1. every token the grammar rejects is set to -inf (the bitmask: no rejection and resample,
   unlike llama.cpp's sampler, ``simpipe.inference.llamacpp.sampler``);
2. temperature (0: greedy, the argmax);
3. min_p: drop tokens below ``min_p`` x the top token's probability (an argmax-invariant
   logits processor, after temperature);
4. top_k, then top_p over what top_k kept (``apply_top_k_top_p``);
5. draw from the softmax of what is left.

So the answer distribution is that chain over the valid tokens alone. The inputs are what
vLLM's ``logprobs`` give with its default ``--logprobs-mode raw_logprobs``: the top ``n``
log-probabilities of the model's raw logits (before the mask, temperature and truncation).
Unlisted tokens have a log-probability at most the smallest listed one (``floor``). The
functions return, beside the probabilities, a bound on the total-variation error the
unlisted valid tokens can cause, or None when they could change the answer by more than
that: the shape of ``simpipe.inference.llamacpp.sampler.next_token``.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from simpipe.inference.types import ChainSettings, NextToken, TopLogprobs


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def next_token(top: TopLogprobs, valid: Collection[int], n_unseen_valid: int,
               settings: ChainSettings) -> NextToken | None:
    """The distribution of the token vLLM's structured-output sampler returns.

    ``valid``: the token ids the grammar accepts next; ``n_unseen_valid``: how many of them
    are not in ``top`` (each at most ``top.floor``). None when the listed tokens do not
    determine it (see the module docstring).
    """
    valid_set = set(valid)
    pairs = [(lp, t) for t, lp in zip(top.ids, top.logprobs, strict=True) if t in valid_set]
    if not pairs:
        return None
    pairs.sort(key=lambda p: (-p[0], p[1]))
    ids = np.array([t for _, t in pairs], dtype=np.int64)
    logits = np.array([lp for lp, _ in pairs], dtype=np.float64)
    floor = top.floor if n_unseen_valid else -math.inf
    s = settings
    if s.temperature <= 0.0:
        if logits[0] <= floor:
            return None  # an unseen valid token could be the argmax
        return NextToken({int(ids[0]): 1.0}, 0.0)
    z = logits / s.temperature
    unseen_z = floor / s.temperature  # -inf when every valid token is listed
    unseen_in = unseen_z > -math.inf  # unseen valid tokens may still be candidates
    if s.min_p > 0.0:
        threshold = z[0] + math.log(s.min_p)
        keep = z >= threshold
        ids, z = ids[keep], z[keep]
        if unseen_z < threshold:
            unseen_in = False
    if s.top_k > 0:
        if unseen_in and s.top_k > ids.size:
            pass  # some unseen valid tokens may be among the k kept: counted in the bound
        else:
            unseen_in = unseen_in and s.top_k > ids.size
        ids, z = ids[: s.top_k], z[: s.top_k]
    # The weight of the unseen valid tokens relative to the listed ones left: at most this.
    w = n_unseen_valid * math.exp(unseen_z - z[0]) / float(np.exp(z - z[0]).sum()) \
        if unseen_in else 0.0
    if s.top_p < 1.0:
        probs = _softmax(z)
        cut = _nucleus(probs, s.top_p)
        if w and _nucleus(probs / (1.0 + w), s.top_p) != cut:
            return None  # the unseen weight could move where the nucleus ends
        ids, z = ids[:cut], z[:cut]
        if w:
            w = n_unseen_valid * math.exp(unseen_z - z[0]) / float(np.exp(z - z[0]).sum())
    probs = _softmax(z)
    return NextToken(dict(zip(ids.tolist(), probs.tolist(), strict=True)), min(1.0, w))


def _nucleus(probs: np.ndarray, top_p: float) -> int:
    """How many of the sorted ``probs`` top_p keeps (at least one)."""
    cum = np.cumsum(probs)
    hit = np.nonzero(cum >= top_p)[0]
    return int(hit[0]) + 1 if hit.size else probs.size
