"""The p-beauty contest's environment: target, winners and the per-round reduce.

A partition reports a *partial*: per group, the count of each answer status and (its
``values``) the value counts of its valid guesses. Value counts merge exactly across
partitions and are enough for the mean, the median and the winners, so the reduce on the
client is exact while moving at most one row per distinct guess (LLM answers are a few
hundred integers).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simpipe.games.config import BeautyContestConfig
from simpipe.games.partials import Partial, status_counts

SUMMARY_COLUMNS = (
    "round", "group_id", "n", "n_valid", "mean", "median", "target", "winning_guess",
    "n_winners", "n_unparsed", "n_out_of_range", "n_error", "n_truncated", "n_no_final_answer",
)


def target_of(mean: np.ndarray | float, game: BeautyContestConfig) -> np.ndarray:
    """``offset + ratio * mean``, clipped to ``[low, high]``; NaN stays NaN."""
    raw = game.offset + game.ratio_value * np.asarray(mean, dtype=np.float64)
    return np.clip(raw, game.low, game.high)


def equilibrium(game: BeautyContestConfig) -> float:
    """Where repeated best responses end: the fixed point of ``x -> target(x)``.

    For ratio < 1 it is ``offset / (1 - ratio)`` clipped to the range (0 for 2/3, 10 for
    ``5 + 1/2 * mean``); for ratio > 1 that fixed point repels and play runs to a bound.
    """
    r, c = game.ratio_value, game.offset
    if r < 1:
        return float(np.clip(c / (1 - r), game.low, game.high))
    mid = (game.low + game.high) / 2
    if r == 1:
        return game.high if c > 0 else game.low if c < 0 else mid
    unstable = c / (1 - r)
    return game.high if mid >= unstable else game.low


def partial_from_rows(rows: pd.DataFrame) -> Partial:
    """The partial of a round's rows (``group_id``, ``guess``, ``status``)."""
    counts, ok = status_counts(rows)
    valid = rows.loc[ok, ["group_id", "guess"]]
    value_counts = (
        valid.groupby(["group_id", "guess"], sort=True).size().rename("count").reset_index()
    )
    return Partial(counts, value_counts.astype({"count": np.int64}))


def reduce_round(partial: Partial, game: BeautyContestConfig, round_index: int) -> pd.DataFrame:
    """One summary row per group: n, n_valid, mean, median, target, winners.

    Winners are the agents whose valid guess is closest to the target; when two distinct
    guesses are equally close, ``winning_guess`` is the lower one and ``n_winners`` counts
    both.
    """
    counts = partial.status_counts.groupby("group_id", sort=True).sum()
    values = (
        partial.values.groupby(["group_id", "guess"], sort=True)["count"].sum().reset_index()
    )
    stats = _value_stats(values, game)
    out = counts.join(stats, how="left")
    out["n_valid"] = out.pop("n_ok")
    out["n_winners"] = out["n_winners"].fillna(0).astype(np.int64)
    out.insert(0, "round", np.int32(round_index + 1))  # numbered from 1
    out = out.reset_index()
    return out[list(SUMMARY_COLUMNS)].astype({"group_id": np.int64, "n": np.int64})


def _value_stats(values: pd.DataFrame, game: BeautyContestConfig) -> pd.DataFrame:
    columns = ["mean", "median", "target", "winning_guess", "n_winners"]
    if values.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="group_id"), dtype=float)
    g = values["group_id"].to_numpy()
    x = values["guess"].to_numpy(dtype=np.float64)
    c = values["count"].to_numpy(dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], len(g)]
    cum = np.cumsum(c)
    before = np.r_[0, cum[ends[:-1] - 1]]
    n = cum[ends - 1] - before
    mean = np.add.reduceat(x * c, starts) / n
    # The two middle ranks of each group's sorted guesses, located in the run-length form.
    lo = np.searchsorted(cum, before + (n - 1) // 2, side="right")
    hi = np.searchsorted(cum, before + n // 2, side="right")
    median = (x[lo] + x[hi]) / 2
    target = target_of(mean, game)
    dist = np.abs(x - np.repeat(target, ends - starts))
    best = np.repeat(np.minimum.reduceat(dist, starts), ends - starts)
    wins = dist == best
    n_winners = np.add.reduceat(np.where(wins, c, 0), starts)
    winning = np.minimum.reduceat(np.where(wins, x, np.inf), starts)
    return pd.DataFrame(
        {"mean": mean, "median": median, "target": target, "winning_guess": winning,
         "n_winners": n_winners},
        index=pd.Index(g[starts], name="group_id"),
    )
