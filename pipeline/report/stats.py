"""The comparison report's statistics: bootstrap intervals and tests between two samples.

Pure numpy and scipy on arrays of valid answers. The bootstrap draws from fixed seeds, so a
report made twice from the same files shows the same intervals. It resamples the counts of
each distinct value (a multinomial draw) rather than the values themselves: the same
distribution of resamples, but a million two-decimal guesses have at most 10,001 distinct
values, so the cost follows those, not the number of agents.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

BOOTSTRAP_SEED = 20_240_717  # fixed: the same data gives the same intervals
N_BOOTSTRAP = 2000
CONFIDENCE = 0.95
_CELLS_PER_CHUNK = 2_000_000  # resamples x distinct values held at once


def bootstrap_intervals(values: np.ndarray, key: Sequence[int] = (),
                        n_boot: int = N_BOOTSTRAP,
                        confidence: float = CONFIDENCE) -> dict[str, float]:
    """Mean and median of ``values`` with percentile bootstrap intervals (``confidence``),
    from the seed ``(BOOTSTRAP_SEED, *key)``; NaN for an empty sample. Keys: ``mean``,
    ``mean_ci_low``, ``mean_ci_high``, ``median``, ``median_ci_low``, ``median_ci_high``."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return dict.fromkeys(("mean", "mean_ci_low", "mean_ci_high", "median",
                              "median_ci_low", "median_ci_high"), float("nan"))
    rng = np.random.default_rng([BOOTSTRAP_SEED, *map(int, key)])
    means, medians = _resample(values, n_boot, rng)
    tail = (1 - confidence) / 2
    mean_ci = np.quantile(means, [tail, 1 - tail])
    median_ci = np.quantile(medians, [tail, 1 - tail])
    return {"mean": float(values.mean()), "mean_ci_low": float(mean_ci[0]),
            "mean_ci_high": float(mean_ci[1]), "median": float(np.median(values)),
            "median_ci_low": float(median_ci[0]), "median_ci_high": float(median_ci[1])}


def _resample(values: np.ndarray, n_boot: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Means and medians of ``n_boot`` resamples (with replacement, of the sample's size)."""
    distinct, counts = np.unique(values, return_counts=True)
    n = values.size
    shares = counts / counts.sum()
    low_pos, high_pos = (n - 1) // 2, n // 2  # the middle one or two of the sorted resample
    chunk = max(1, _CELLS_PER_CHUNK // distinct.size)
    means, medians = [], []
    for start in range(0, n_boot, chunk):
        draws = rng.multinomial(n, shares, size=min(chunk, n_boot - start))
        means.append(draws @ distinct / n)
        upto = np.cumsum(draws, axis=1)
        low = distinct[np.argmax(upto > low_pos, axis=1)]
        high = distinct[np.argmax(upto > high_pos, axis=1)]
        medians.append((low + high) / 2)
    return np.concatenate(means), np.concatenate(medians)


def compare_samples(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Two independent samples: Mann-Whitney U (two-sided) with the rank-biserial
    correlation (``P(a > b) - P(a < b)``: positive when ``a`` tends to be larger), and
    Welch's t test with Cohen's d (pooled SD; positive when ``a``'s mean is larger). NaN
    where a sample has fewer than two values or no spread to test."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    out = {"n_a": int(a.size), "n_b": int(b.size),
           "mean_a": float(a.mean()) if a.size else float("nan"),
           "mean_b": float(b.mean()) if b.size else float("nan")}
    out["diff"] = out["mean_a"] - out["mean_b"]
    nan = dict.fromkeys(("mw_u", "mw_p", "rank_biserial", "welch_t", "welch_p", "cohens_d"),
                        float("nan"))
    if a.size < 2 or b.size < 2:
        return {**out, **nan}
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # Identical samples without spread: scipy warns and answers NaN, which is the answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        mw = stats.mannwhitneyu(a, b, alternative="two-sided")
        welch = stats.ttest_ind(a, b, equal_var=False)
    pooled = np.sqrt(((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1))
                     / (a.size + b.size - 2))
    return {**out, "mw_u": float(mw.statistic), "mw_p": float(mw.pvalue),
            "rank_biserial": float(2 * mw.statistic / (a.size * b.size) - 1),
            "welch_t": float(welch.statistic), "welch_p": float(welch.pvalue),
            "cohens_d": float(out["diff"] / pooled) if pooled > 0 else float("nan")}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (family-wise error) of ``p_values``; NaN stays NaN and
    is not counted."""
    p = np.asarray(p_values, dtype=np.float64)
    adjusted = np.full(p.shape, np.nan)
    known = np.flatnonzero(np.isfinite(p))
    order = known[np.argsort(p[known], kind="stable")]
    m = order.size
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()
