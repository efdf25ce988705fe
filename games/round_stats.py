"""Per-round statistics of every agent's answer, pooled over groups (the report's rounds
table); the part every game's table shares."""

from __future__ import annotations

import pandas as pd

from simpipe.games.validity import COMPARABLE_INVALID_SHARE, MIN_N, MIN_VALID_SHARE, problem

#: The invalid answers the report counts per round: why a chain of thought gave no answer.
COUNTED = ("truncated", "no_final_answer")


def answer_stats(rows: pd.DataFrame, values: pd.Series | None = None) -> pd.DataFrame:
    """Per round (index ``round``): ``n`` rows, ``n_valid`` valid answers, ``valid_share``,
    ``n_truncated`` and ``n_no_final_answer`` (from ``status``), and ``mean``, ``median``,
    ``sd`` (ddof 1) of ``values`` where not NaN (default: the valid answers,
    ``rows["guess"]``)."""
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
    for status in COUNTED:
        if "status" in rows:
            hits = (rows["status"] == status).groupby(rows["round"]).sum()
            table[f"n_{status}"] = hits.reindex(table.index).fillna(0).astype("int64")
        else:
            table[f"n_{status}"] = 0
    table.index.name = "round"
    return table


def comparison_refusal(label: str, rounds: pd.DataFrame) -> str | None:
    """Why run ``label`` (its report rounds: ``n``, ``n_valid``, the counts above) must not
    be set beside published numbers; None when it may."""
    n = int(rounds["n"].sum())
    invalid = n - int(rounds["n_valid"].sum())
    if n == 0 or invalid <= COMPARABLE_INVALID_SHARE * n:
        first = problem(rounds["n"].iloc[0], rounds["n_valid"].iloc[0]) if len(rounds) else None
        if n == 0 or first is None:
            return None
        return (f"{label}: not set beside published numbers: its first round has {first} "
                f"(a group needs {MIN_VALID_SHARE:.0%} valid answers and at least {MIN_N})")
    why = [f"{int(rounds[f'n_{s}'].sum()):,} {s.replace('_', ' ')}" for s in COUNTED
           if f"n_{s}" in rounds and rounds[f"n_{s}"].sum()]
    detail = f" ({', '.join(why)})" if why else ""
    return (f"{label}: not set beside published numbers: {invalid:,} of its {n:,} answers "
            f"({invalid / n:.0%}) are not valid{detail}, more than "
            f"{COMPARABLE_INVALID_SHARE:.0%}; the valid ones are a selection, not the run's "
            "result (for chain of thought: raise agents.cot_max_tokens, or use a model that "
            "ends its reasoning with the final answer)")
