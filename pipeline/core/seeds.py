"""splitmix64's output mix, vectorised: the one hash behind every per-agent seed and draw
(request seeds in ``simpipe.agents.llm``, shared-answer draws in
``simpipe.answers.shared``), so a run's answers depend on (seed, round, agent) alone."""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (2**64 / golden ratio)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's mix of each uint64 of ``x`` (a new array; wraps modulo 2**64): equal
    inputs give equal outputs, neighbouring inputs unrelated ones."""
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64)  # a copy: the caller's array stays as it was
        x ^= x >> np.uint64(30)
        x *= _MUL1
        x ^= x >> np.uint64(27)
        x *= _MUL2
        x ^= x >> np.uint64(31)
    return x
