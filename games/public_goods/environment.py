"""The linear public goods game's environment: payoffs and the per-round reduce.

Each member of a group contributes ``c_i`` of its ``endowment`` points to a group project;
``payoff_i = endowment - c_i + mpcr * sum of the group's contributions``. An invalid answer
contributes 0 (the agent keeps its endowment and still earns its share of the project) and
is counted in the group's ``n_unparsed`` / ``n_out_of_range`` / ``n_error`` /
``n_truncated`` / ``n_no_final_answer``.

A partition reports a *partial*: per group, the count of each answer status and (its
``values``) the sum of its valid contributions. Contributions are whole numbers, so the sums
are exact in float64 and the reduce gives the same summary however the agents are split
into partitions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simpipe.games.config import PublicGoodsConfig
from simpipe.games.partials import Partial, status_counts

SUMMARY_COLUMNS = (
    "round", "group_id", "n", "n_valid", "total_contribution", "mean_contribution",
    "contribution_pct", "mean_payoff", "n_unparsed", "n_out_of_range", "n_error", "n_truncated",
    "n_no_final_answer",
)


def payoffs(own: np.ndarray, group_total: np.ndarray, game: PublicGoodsConfig) -> np.ndarray:
    """Each agent's payoff from its own contribution (NaN: invalid, i.e. 0) and its group's
    total contribution."""
    own = np.nan_to_num(np.asarray(own, dtype=np.float64), nan=0.0)
    return game.endowment - own + game.mpcr * np.asarray(group_total, dtype=np.float64)


def partial_from_rows(rows: pd.DataFrame) -> Partial:
    """The partial of a round's rows (``group_id``, ``guess``: the contribution, ``status``)."""
    counts, ok = status_counts(rows)
    valid = rows.loc[ok, ["group_id", "guess"]]
    totals = valid.groupby("group_id", sort=True)["guess"].sum().rename("total").reset_index()
    return Partial(counts, totals.astype({"total": np.float64}))


def reduce_round(partial: Partial, game: PublicGoodsConfig, round_index: int) -> pd.DataFrame:
    """One summary row per group: contributions (invalid answers count 0), payoffs, statuses."""
    counts = partial.status_counts.groupby("group_id", sort=True).sum()
    totals = partial.values.groupby("group_id", sort=True)["total"].sum()
    out = counts.join(totals, how="left")
    total = out.pop("total").fillna(0.0).to_numpy(dtype=np.float64)
    n = out["n"].to_numpy(dtype=np.float64)
    mean = total / n
    out["n_valid"] = out.pop("n_ok")
    out["total_contribution"] = total
    out["mean_contribution"] = mean
    out["contribution_pct"] = 100.0 * mean / game.endowment
    # The mean of endowment - c_i + mpcr * total over the group's members.
    out["mean_payoff"] = game.endowment - mean + game.mpcr * total
    out.insert(0, "round", np.int32(round_index + 1))  # numbered from 1
    out = out.reset_index()
    return out[list(SUMMARY_COLUMNS)].astype({"group_id": np.int64, "n": np.int64})
