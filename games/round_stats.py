"""Per-round statistics of every agent's answer, pooled over groups (the report's rounds
table); the part every game's table shares."""

from __future__ import annotations

import pandas as pd


def answer_stats(rows: pd.DataFrame, values: pd.Series | None = None) -> pd.DataFrame:
    """Per round (index ``round``): ``n`` rows, ``n_valid`` valid answers, ``valid_share``,
    and ``mean``, ``median``, ``sd`` (ddof 1) of ``values`` where not NaN (default: the
    valid answers, ``rows["guess"]``)."""
    values = rows["guess"] if values is None else values
    by_round = values.dropna().groupby(rows["round"])
    table = pd.DataFrame({
        "n": rows.groupby("round").size(),
        "n_valid": rows["guess"].notna().groupby(rows["round"]).sum(),
        "mean": by_round.mean(),
        "median": by_round.median(),
        "sd": by_round.std(ddof=1),
    })
    table["n_valid"] = table["n_valid"].fillna(0).astype("int64")
    table["valid_share"] = table["n_valid"] / table["n"]
    table.index.name = "round"
    return table
