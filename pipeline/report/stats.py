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


def compare_paired(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Two paired samples (``a[i]`` and ``b[i]`` from the same agent: cells that share
    agents and random draws): Wilcoxon's signed-rank test (two-sided, zero differences
    dropped) with the matched-pairs rank-biserial correlation ``(T+ - T-) / (T+ + T-)``
    (positive when ``a`` tends to be larger), and the paired t test with
    ``d_z = mean(a - b) / sd(a - b)``. Pairs with a missing value are dropped. Also
    ``identical_share`` (pairs with the same answer) and ``pair_r`` (Pearson's r between the
    two). NaN where fewer than two pairs or no spread to test."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    diff = a - b
    out = {"n_pairs": int(a.size),
           "mean_a": float(a.mean()) if a.size else float("nan"),
           "mean_b": float(b.mean()) if b.size else float("nan"),
           "diff": float(diff.mean()) if diff.size else float("nan"),
           "identical_share": float(np.mean(diff == 0)) if diff.size else float("nan")}
    nan = dict.fromkeys(("pair_r", "rank_stat", "rank_p", "rank_biserial", "t_stat", "t_p",
                         "d"), float("nan"))
    if a.size < 2:
        return {**out, **nan}
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        r = (float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0
             else float("nan"))
        moved = diff[diff != 0]
        if moved.size:
            ranks = stats.rankdata(np.abs(moved))
            up, down = ranks[moved > 0].sum(), ranks[moved < 0].sum()
            signed = stats.wilcoxon(diff, zero_method="wilcox", alternative="two-sided")
            rank = {"rank_stat": float(signed.statistic), "rank_p": float(signed.pvalue),
                    "rank_biserial": float((up - down) / (up + down))}
        else:  # every agent answered the same in both: nothing to test
            rank = {"rank_stat": float("nan"), "rank_p": float("nan"), "rank_biserial": 0.0}
        sd = diff.std(ddof=1)
        paired = stats.ttest_rel(a, b) if sd > 0 else None
    return {**out, "pair_r": r, **rank,
            "t_stat": float(paired.statistic) if paired is not None else float("nan"),
            "t_p": float(paired.pvalue) if paired is not None else float("nan"),
            "d": float(diff.mean() / sd) if sd > 0 else float("nan")}


def power_two_sample(d: float, n_a: int, n_b: int, alpha: float = 0.05) -> float:
    """The power of a two-sided two-sample t test (level ``alpha``) to detect a standardized
    difference ``d`` between groups of ``n_a`` and ``n_b`` (noncentral t)."""
    if n_a < 2 or n_b < 2:
        return float("nan")
    df = n_a + n_b - 2
    ncp = d * np.sqrt(n_a * n_b / (n_a + n_b))
    critical = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(critical, df, ncp) + stats.nct.cdf(-critical, df, ncp))


def group_tests(samples: Sequence[np.ndarray]) -> dict[str, float]:
    """Two or more independent groups, in their order: Kruskal-Wallis H with epsilon
    squared (``H / (n - 1)``), a trend over the order (Spearman's rho between each answer
    and its group's rank; only with three groups or more, NaN otherwise) and the power of a
    t test between the two smallest groups to detect d = 0.2 and d = 0.5."""
    samples = [np.asarray(s, dtype=np.float64) for s in samples]
    samples = [s[np.isfinite(s)] for s in samples]
    n = int(sum(s.size for s in samples))
    out = dict.fromkeys(("kw_h", "kw_p", "epsilon_sq", "trend_rho", "trend_p"), float("nan"))
    sizes = sorted(s.size for s in samples)
    out["power_d02"] = power_two_sample(0.2, *sizes[:2]) if len(sizes) >= 2 else float("nan")
    out["power_d05"] = power_two_sample(0.5, *sizes[:2]) if len(sizes) >= 2 else float("nan")
    if len(samples) < 2 or n < 3 or min(sizes) == 0:
        return out
    values = np.concatenate(samples)
    if np.ptp(values) == 0:  # every answer the same: nothing to rank
        return out
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        kw = stats.kruskal(*samples)
        out.update(kw_h=float(kw.statistic), kw_p=float(kw.pvalue),
                   epsilon_sq=float(kw.statistic / (n - 1)))
        if len(samples) >= 3:
            rank = np.concatenate([np.full(s.size, i, dtype=np.float64)
                                   for i, s in enumerate(samples)])
            rho = stats.spearmanr(rank, values)
            out.update(trend_rho=float(rho.statistic), trend_p=float(rho.pvalue))
    return out
