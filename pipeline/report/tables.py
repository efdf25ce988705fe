"""The report's tables, computed from the Parquet files (pooled over groups).

The game's own statistics, columns and comparisons come from its ``Game`` object
(``report_rounds``, ``report_run``, ``report_references``); this module adds what every run
has (back-end, agents, tokens, wall time) and the breakdown by persona attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile, without importing all of scipy.stats

from simpipe.config import population_mix as mix
from simpipe.config.backends import BACKENDS
from simpipe.games import validity
from simpipe.games.base import Game, ReferenceTable
from simpipe.report.load import RunData
from simpipe.report.stats import group_tests

CONFIDENCE = 0.95
MAX_LEVELS = 12  # numeric attributes with more distinct values are binned
N_BINS = 6

ATTRIBUTE_COLUMNS = ["run", "attribute", "level", "round", "n", "n_valid", "valid_share", "mean",
                     "sd", "ci_low", "ci_high", "valid_enough", "flag"]
TEST_COLUMNS = ["run", "attribute", "round", "levels", "n", "kw_h", "kw_p", "epsilon_sq",
                "trend_order", "trend_rho", "trend_p", "smallest_pair", "power_d02",
                "power_d05", "valid_enough", "flag"]


def with_flags(table: pd.DataFrame, n: str = "n", n_valid: str = "n_valid") -> pd.DataFrame:
    """``table`` with ``valid_enough`` and ``flag`` (why not; "" where it is) from its
    counts, by the one rule (``simpipe.games.validity``)."""
    enough, flag = validity.flags(table[n], table[n_valid])
    return table.assign(valid_enough=enough, flag=flag)


def round_table(run: RunData) -> pd.DataFrame:
    """Per round, the game's statistics (``Game.report_rounds``), with the run's label and
    each round's validity (``valid_enough``, ``flag``)."""
    table = with_flags(run.game.report_rounds(run.rounds, run.summary))
    table.insert(0, "run", run.label)
    return table


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
    """Per (level, round): n answers, n valid, mean, sd and a t-based 95% CI of the mean
    (only where the level is valid enough, ``simpipe.games.validity``)."""
    frame = _levelled(run, attribute)
    grouped = frame.groupby(["level", "round"], observed=True)["guess"]
    table = grouped.agg(n="size", n_valid="count", mean="mean", sd="std").reset_index()
    table["valid_share"] = table["n_valid"] / table["n"]
    table = with_flags(table)
    low, high = confidence_interval(table["mean"].to_numpy(), table["sd"].to_numpy(),
                                    table["n_valid"].to_numpy())
    enough = table["valid_enough"].to_numpy()
    table["ci_low"] = np.where(enough, low, np.nan)
    table["ci_high"] = np.where(enough, high, np.nan)
    table["level"] = table["level"].astype(str)
    table.insert(0, "attribute", attribute)
    table.insert(0, "run", run.label)
    return table[ATTRIBUTE_COLUMNS]


def attribute_tests(run: RunData, attribute: str) -> pd.DataFrame:
    """Per round, the valid answers compared across the attribute's levels that are valid
    enough (``simpipe.report.stats.group_tests``): Kruskal-Wallis with epsilon squared, a
    trend over the levels' order (Spearman with the level's rank: numeric ranges by value,
    labels in the config's order) and the power of a t test between the two smallest levels
    to detect d = 0.2 and d = 0.5."""
    frame = _levelled(run, attribute)
    numeric = not isinstance(run.population[attribute].dtype, pd.CategoricalDtype) and (
        pd.api.types.is_numeric_dtype(run.population[attribute]))
    order = "by value" if numeric else (
        "config order" if run.attribute_order(attribute) else "alphabetical")
    records = []
    for r, part in frame.groupby("round", observed=True):
        counts = part.groupby("level", observed=True)["guess"].agg(n="size", n_valid="count")
        enough, flags = validity.flags(counts["n"], counts["n_valid"])
        kept = [level for level, ok in zip(counts.index, enough, strict=True) if ok]
        left = [f"{level}: {why}" for level, why in zip(counts.index, flags, strict=True) if why]
        samples = [part.loc[(part["level"] == level) & part["guess"].notna(), "guess"]
                   .to_numpy(dtype=np.float64) for level in kept]
        result = group_tests(samples) if len(samples) >= 2 else {}
        if len(samples) < 2:
            left.insert(0, "fewer than two levels valid enough: no test")
        if len(samples) >= 2:
            smallest = sorted(range(len(kept)), key=lambda i: samples[i].size)[:2]
            result["smallest_pair"] = " / ".join(f"{kept[i]} ({samples[i].size:,})"
                                                 for i in sorted(smallest))
        records.append({"run": run.label, "attribute": attribute, "round": int(r),
                        "levels": len(kept), "n": int(sum(v.size for v in samples)),
                        **result,
                        "trend_order": order if np.isfinite(result.get("trend_p", np.nan))
                        else None,
                        "valid_enough": len(samples) >= 2, "flag": "; ".join(left)})
    return pd.DataFrame.from_records(records, columns=TEST_COLUMNS)


def _levelled(run: RunData, attribute: str) -> pd.DataFrame:
    """Every answer (``guess`` NaN where invalid) with its agent's level and its round."""
    levels = attribute_levels(run.population, attribute, run.attribute_order(attribute))
    rows = run.rounds.loc[:, ["agent_id", "round", "guess"]]
    # A positional lookup on agent_id is much cheaper than a merge at a million agents.
    agent_ids = pd.Index(run.population["agent_id"].to_numpy())
    positions = agent_ids.get_indexer(rows["agent_id"].to_numpy())
    known = positions >= 0
    frame = pd.DataFrame({
        "level": pd.Categorical.from_codes(levels.codes[positions[known]], dtype=levels.dtype),
        "round": rows["round"].to_numpy()[known],
        "guess": rows["guess"].to_numpy()[known],
    })
    return frame


def confidence_interval(mean: np.ndarray, sd: np.ndarray, n: np.ndarray,
                        confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval of the mean; NaN where fewer than two guesses."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = stdtrit(np.where(n > 1, n - 1, np.nan), 0.5 + confidence / 2)
        half = t * np.asarray(sd, dtype=np.float64) / np.sqrt(n)
    return mean - half, mean + half


def run_table(runs: Sequence[RunData], round_tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    records = []
    for run, rounds in zip(runs, round_tables, strict=True):
        records.append({
            "run": run.label,
            "backend": describe_backend(run.ledger.config_dict(), run.game),
            "n_agents": int(run.ledger.n_agents or rounds["n"].iloc[0]),
            "rounds": len(rounds),
            "answers": run.answers_source,
            "flag": _run_flag(rounds),
            **run.game.report_run(rounds),
            "tokens_in": int(run.rounds["tokens_in"].to_numpy().sum(dtype=np.int64)),
            "tokens_out": int(run.rounds["tokens_out"].to_numpy().sum(dtype=np.int64)),
            "wall_s": run.ledger.wall_s,
        })
    return pd.DataFrame.from_records(records)


def _run_flag(rounds: pd.DataFrame) -> str:
    """The rounds of a run that are not valid enough, or ""."""
    bad = rounds.loc[~rounds["valid_enough"].astype(bool)]
    if not len(bad):
        return ""
    return "not valid enough: " + "; ".join(f"round {int(row['round'])}: {row['flag']}"
                                            for _, row in bad.head(3).iterrows()) + (
        f"; and {len(bad) - 3} more rounds" if len(bad) > 3 else "")


def reference_tables(runs: Sequence[RunData],
                     round_tables: Sequence[pd.DataFrame]) -> list[ReferenceTable]:
    """The game's comparison tables, each holding every run's records and notes. A run of
    synthetic answers (``simpipe.games.validity``) gets a note instead of records."""
    merged: dict[str, ReferenceTable] = {}
    for run, rounds in zip(runs, round_tables, strict=True):
        for table in run.game.report_references(run.label, rounds):
            into = merged.setdefault(table.key, ReferenceTable(
                table.key, table.title, table.columns, table.citation))
            if run.synthetic:
                into.notes.append(f"{run.label}: not set beside published numbers: "
                                  f"{validity.SYNTHETIC_WHY}")
                continue
            into.records += table.records
            into.notes += [n for n in table.notes if n not in into.notes]
    return list(merged.values())


def describe_backend(config: dict, game: Game) -> str:
    agents = config.get("agents", {})
    mixed = agents.get(mix.BY) if isinstance(agents, dict) else None
    if mixed:  # a mixed population: who answered each value's agents
        attribute, tables = next(iter(mixed.items()))
        return f"by {attribute}: " + "; ".join(
            f"{value} = {describe_backend({'agents': mix.stored_table(agents, value)}, game)}"
            for value in tables)
    backend = agents.get("backend", "?")
    plugin = BACKENDS.get(backend) if isinstance(backend, str) else None
    if plugin is None:  # a run of a back-end this version does not know
        return str(backend)
    return plugin.describe(agents.get(backend) or {}, game)


def _bin(column: pd.Series) -> pd.Categorical:
    lo, hi = column.min(), column.max()
    if pd.api.types.is_integer_dtype(column):
        edges = np.unique(np.round(np.linspace(lo, hi + 1, N_BINS + 1)).astype(np.int64))
        labels = [f"{a}-{b - 1}" if b - 1 > a else f"{a}" for a, b in pairwise(edges)]
        return pd.cut(column, bins=edges, right=False, labels=labels)
    edges = np.linspace(lo, hi, N_BINS + 1)
    labels = [f"{a:.3g}-{b:.3g}" for a, b in pairwise(edges)]
    return pd.cut(column, bins=edges, include_lowest=True, labels=labels)
