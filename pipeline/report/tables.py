"""The report's tables, computed from the Parquet files (pooled over groups)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile, without importing all of scipy.stats

from simpipe.report.load import RunData
from simpipe.report.reference import References

CONFIDENCE = 0.95
WITHIN = 1.0  # "rounds to get within 1 of the equilibrium"
MAX_LEVELS = 12  # numeric attributes with more distinct values are binned
N_BINS = 6

ROUND_COLUMNS = ["run", "round", "n", "n_valid", "valid_share", "mean", "median", "sd",
                 "target", "winning_guess"]
ATTRIBUTE_COLUMNS = ["run", "attribute", "level", "round", "n", "mean", "sd", "ci_low", "ci_high"]


def round_table(run: RunData) -> pd.DataFrame:
    """Per round: n, valid share, mean, median, sd of valid guesses; target and winning guess.

    Target and winning guess come from summary.parquet (what the environment announced);
    with several groups they are averaged over the groups.
    """
    rows = run.rounds
    valid = rows.loc[rows["guess"].notna(), ["round", "guess"]]
    by_round = valid.groupby("round")["guess"]
    table = pd.DataFrame({
        "n": rows.groupby("round").size(),
        "n_valid": by_round.size(),
        "mean": by_round.mean(),
        "median": by_round.median(),
        "sd": by_round.std(ddof=1),
    })
    announced = run.summary.groupby("round")[["target", "winning_guess"]].mean()
    table = table.join(announced, how="left")
    table["n_valid"] = table["n_valid"].fillna(0).astype("int64")
    table["valid_share"] = table["n_valid"] / table["n"]
    table = table.reset_index().rename(columns={"index": "round"})
    table.insert(0, "run", run.label)
    return table[ROUND_COLUMNS]


def attribute_levels(population: pd.DataFrame, attribute: str,
                     order: Sequence[str] = ()) -> pd.Categorical:
    """The attribute as a categorical, levels in `order` (the config's) where given;
    many-valued numbers become ranges."""
    column = population[attribute]
    if isinstance(column.dtype, pd.CategoricalDtype):
        present = set(column.cat.categories)
        first = [level for level in order if level in present]
        rest = [level for level in column.cat.categories if level not in set(first)]
        return pd.Categorical(column, categories=first + rest).remove_unused_categories()
    if pd.api.types.is_numeric_dtype(column) and column.nunique() > MAX_LEVELS:
        return pd.Categorical(_bin(column))
    return pd.Categorical(column, categories=sorted(column.dropna().unique()))


def attribute_table(run: RunData, attribute: str) -> pd.DataFrame:
    """Per (level, round): n valid guesses, mean, sd and a t-based 95% CI of the mean."""
    levels = attribute_levels(run.population, attribute, run.attribute_order(attribute))
    rows = run.rounds.loc[run.rounds["guess"].notna(), ["agent_id", "round", "guess"]]
    # A positional lookup on agent_id is much cheaper than a merge at a million agents.
    agent_ids = pd.Index(run.population["agent_id"].to_numpy())
    positions = agent_ids.get_indexer(rows["agent_id"].to_numpy())
    known = positions >= 0
    frame = pd.DataFrame({
        "level": pd.Categorical.from_codes(levels.codes[positions[known]], dtype=levels.dtype),
        "round": rows["round"].to_numpy()[known],
        "guess": rows["guess"].to_numpy()[known],
    })
    grouped = frame.groupby(["level", "round"], observed=True)["guess"]
    table = grouped.agg(n="size", mean="mean", sd="std").reset_index()
    low, high = confidence_interval(table["mean"].to_numpy(), table["sd"].to_numpy(),
                                    table["n"].to_numpy())
    table["ci_low"], table["ci_high"] = low, high
    table["level"] = table["level"].astype(str)
    table.insert(0, "attribute", attribute)
    table.insert(0, "run", run.label)
    return table[ATTRIBUTE_COLUMNS]


def confidence_interval(mean: np.ndarray, sd: np.ndarray, n: np.ndarray,
                        confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval of the mean; NaN where fewer than two guesses."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = stdtrit(np.where(n > 1, n - 1, np.nan), 0.5 + confidence / 2)
        half = t * np.asarray(sd, dtype=np.float64) / np.sqrt(n)
    return mean - half, mean + half


def rounds_to_equilibrium(rounds: pd.DataFrame, target: float, within: float = WITHIN) -> float:
    """Rounds played until the mean guess is within `within` of `target` (1: the first round).

    NaN when it never gets there.
    """
    hit = rounds.loc[(rounds["mean"] - target).abs() <= within, "round"]
    return float(hit.min() + 1) if len(hit) else float("nan")


def run_table(runs: Sequence[RunData], round_tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    records = []
    for run, rounds in zip(runs, round_tables):
        first, last = rounds.iloc[0], rounds.iloc[-1]
        timings = run.ledger.get("timings") or {}
        records.append({
            "run": run.label,
            "backend": describe_backend(run.ledger.get("config", {})),
            "ratio": run.game.ratio,
            "offset": run.game.offset,
            "prompt": run.game.prompt,
            "n_agents": int(run.ledger.get("n_agents") or first["n"]),
            "rounds": len(rounds),
            "equilibrium": run.equilibrium,
            "first_mean": first["mean"],
            "first_median": first["median"],
            "last_mean": last["mean"],
            "rounds_to_within_1": rounds_to_equilibrium(rounds, run.equilibrium),
            "tokens_in": int(run.rounds["tokens_in"].to_numpy().sum(dtype=np.int64)),
            "tokens_out": int(run.rounds["tokens_out"].to_numpy().sum(dtype=np.int64)),
            "wall_s": timings.get("wall_s"),
        })
    return pd.DataFrame.from_records(records)


def human_table(runs: Sequence[RunData], round_tables: Sequence[pd.DataFrame],
                refs: References) -> tuple[pd.DataFrame, list[str]]:
    """Each run's first round beside Nagel (1995)'s row for its ratio; notes where none."""
    records, notes = [], []
    for run, rounds in zip(runs, round_tables):
        human = refs.human_for(run.game.ratio, run.game.offset)
        if human is None:
            notes.append(f"{run.label}: no human data for ratio {run.game.ratio}"
                         f"{'' if run.game.offset == 0 else f' with offset {run.game.offset:g}'}"
                         f" (Nagel 1995 has 1/2, 2/3 and 4/3 without offset)")
            continue
        first = rounds.iloc[0]
        records.append({
            "run": run.label, "ratio": run.game.ratio,
            "run_n": int(first["n_valid"]), "run_mean": first["mean"],
            "run_median": first["median"],
            "human_n": human.n, "human_mean": human.mean, "human_median": human.median,
        })
    columns = ["run", "ratio", "run_n", "run_mean", "run_median",
               "human_n", "human_mean", "human_median"]
    return pd.DataFrame.from_records(records, columns=columns), notes


def paper_table(runs: Sequence[RunData], round_tables: Sequence[pd.DataFrame],
                refs: References) -> tuple[pd.DataFrame, list[str]]:
    """The paper's LLM numbers beside each run with the same game and prompt."""
    records, notes = [], []
    for run, rounds in zip(runs, round_tables):
        if not refs.llm_applies(run.game.ratio, run.game.offset):
            notes.append(f"{run.label}: the paper's numbers are for ratio {refs.llm_ratio} without "
                         f"offset; this run has ratio {run.game.ratio}, offset {run.game.offset:g}")
            continue
        for ref in refs.llm:
            if ref.prompt != run.game.prompt:
                continue
            value = _metric(ref.metric, rounds)
            if value is None:
                notes.append(f"{run.label}: {refs.metrics.get(ref.metric, ref.metric)} needs "
                             f"more rounds than the {len(rounds)} played")
                continue
            records.append({
                "run": run.label, "prompt": ref.prompt, "metric": ref.metric,
                "paper_model": ref.model, "paper_value": ref.value,
                "approximate": ref.approximate, "run_value": value,
            })
    return pd.DataFrame.from_records(records, columns=[
        "run", "prompt", "metric", "paper_model", "paper_value", "approximate", "run_value"]), notes


def describe_backend(config: dict) -> str:
    agents = config.get("agents", {})
    backend = agents.get("backend", "?")
    if backend == "llamacpp":
        model_path = (agents.get("llamacpp") or {}).get("model_path")
        return f"llamacpp:{Path(model_path).name if model_path else 'gemma3-270m (default)'}"
    if backend == "openai":
        return f"openai:{(agents.get('openai') or {}).get('model', 'default')}"
    if backend == "scripted":
        return f"scripted (tau {(agents.get('scripted') or {}).get('tau', '?')})"
    return str(backend)


def _metric(metric: str, rounds: pd.DataFrame) -> float | None:
    if metric == "first_round_mean":
        return float(rounds["mean"].iloc[0])
    if metric == "first_round_winning_number":
        return float(rounds["target"].iloc[0])
    if metric == "five_round_average_winning_number":
        return float(rounds["target"].iloc[:5].mean()) if len(rounds) >= 5 else None
    raise ValueError(f"unknown reference metric {metric!r} in the reference data")


def _bin(column: pd.Series) -> pd.Categorical:
    lo, hi = column.min(), column.max()
    if pd.api.types.is_integer_dtype(column):
        edges = np.unique(np.round(np.linspace(lo, hi + 1, N_BINS + 1)).astype(np.int64))
        labels = [f"{a}-{b - 1}" if b - 1 > a else f"{a}" for a, b in zip(edges[:-1], edges[1:])]
        return pd.cut(column, bins=edges, right=False, labels=labels)
    edges = np.linspace(lo, hi, N_BINS + 1)
    labels = [f"{a:.3g}-{b:.3g}" for a, b in zip(edges[:-1], edges[1:])]
    return pd.cut(column, bins=edges, include_lowest=True, labels=labels)
