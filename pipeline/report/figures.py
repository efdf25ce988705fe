"""The report's PNG figures, drawn from what each run's game says about itself (its answer
range, its equilibrium, ``Game.round_chart``, ``Game.round_mark``).

Figures are built with ``matplotlib.figure.Figure`` directly (the Agg canvas), never through
pyplot, so nothing global (backend, interactive state, open-figure registry) is touched.
Distributions are binned with numpy first: a million answers become fifty bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simpipe.games import validity
from simpipe.games.base import RoundChart
from simpipe.report.load import RunData
from simpipe.report.stats import CONFIDENCE

N_BINS = 50
DPI = 110
MAX_COLUMNS = 5
MARKERS = ("o", "s", "^", "D")
LINES = ("-", "-", "--", "-.")
def guesses_figure(run: RunData, path: Path) -> Path:
    """Histogram of valid answers, one panel per round, with the equilibrium and the round's
    own mark (the beauty contest: the target)."""
    game = run.game
    round_ids = run.round_indices
    n_cols = min(len(round_ids), MAX_COLUMNS)
    n_rows = -(-len(round_ids) // n_cols)
    fig = Figure(figsize=(3.2 * n_cols, 2.6 * n_rows + 0.6), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(n_rows, n_cols, sharex=True, squeeze=False)).ravel()
    edges = game.answer().bin_edges(N_BINS)
    pooled = game.summary_by_round(run.summary)
    for ax, (r, counts) in zip(axes, _histograms(run, edges), strict=False):
        ax.stairs(counts, edges, fill=True, color="#4c72b0", alpha=0.8)
        ax.axvline(game.equilibrium(), color="black", linestyle=":",
                   label=game.equilibrium_name)
        mark = game.round_mark(pooled.loc[r].to_dict()) if r in pooled.index else None
        if mark is not None:
            ax.axvline(mark[1], color="#c44e52", label=mark[0])
        n, n_valid = int((run.rounds["round"] == r).sum()), int(counts.sum())
        why = validity.problem(n, n_valid)
        ax.set_title(f"round {r}" + (f"\n{why}" if why else ""), fontsize=10 if not why else 7,
                     color="black" if not why else "#c44e52")
        ax.set_xlabel(game.answer_name)
    for ax in axes[len(round_ids):]:
        ax.set_visible(False)
    axes[0].set_ylabel("agents")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{run.label}: distribution of {game.answer_plural}")
    return _save(fig, path)


def convergence_figure(run: RunData, rounds: pd.DataFrame, path: Path) -> Path:
    """The game's per-round series (``Game.round_chart``) against its reference levels and
    the human data, where there is any."""
    chart = run.game.round_chart()
    fig = Figure(figsize=(6.4, 4.0), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for (column, label), marker, line in zip(chart.series, MARKERS, LINES, strict=False):
        ax.plot(rounds["round"], rounds[column], marker=marker, linestyle=line, label=label)
    for name, value in chart.levels:
        ax.axhline(value, color="black", linestyle=":", label=f"{name} {value:g}")
    if comparable(run, rounds):
        _reference(ax, chart, rounds["round"])
    mark_flagged(ax, rounds, chart.series[0][0])
    _round_axis(ax, rounds["round"])
    ax.set_ylim(*chart.y_range)
    ax.set_ylabel(chart.y_label)
    ax.set_title(f"{run.label}: {chart.title}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def attribute_figure(table: pd.DataFrame, series: str, title: str, answer_name: str,
                     path: Path, y_low: float = 0.0) -> Path:
    """Mean answer per level with 95% CIs; one dodged series per value of `series`. The
    y axis starts at ``y_low`` (the answer range's lower bound), not at the data: a small
    gap must look small. A level that is not valid enough is a hollow marker with its n,
    without an interval."""
    levels = list(dict.fromkeys(table["level"]))
    groups = list(dict.fromkeys(table[series]))
    width = 0.8 / max(len(groups), 1)
    fig = Figure(figsize=(max(6.4, 0.9 * len(levels) + 2), 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(levels))
    for i, group in enumerate(groups):
        part = table[table[series] == group].set_index("level").reindex(levels)
        offset = (i - (len(groups) - 1) / 2) * width
        yerr = np.vstack([part["mean"] - part["ci_low"], part["ci_high"] - part["mean"]])
        drawn = ax.errorbar(x + offset, part["mean"], yerr=np.nan_to_num(yerr), fmt="o",
                            capsize=3,
                            label=f"{series} {group}" if series == "round" else str(group))
        if "valid_enough" in part:
            weak = ~part["valid_enough"].fillna(True).astype(bool).to_numpy()
            color = drawn.lines[0].get_color()
            for xi, yi, n in zip((x + offset)[weak], part["mean"].to_numpy()[weak],
                                 part["n_valid"].to_numpy()[weak], strict=True):
                ax.plot([xi], [yi], marker="o", markersize=11, markerfacecolor="white",
                        markeredgecolor=color)
                ax.annotate(f"n={n:.0f}, not valid enough", (xi, yi), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    ax.set_ylim(bottom=y_low)
    crowded = len(levels) > 4
    ax.set_xticks(x, levels, rotation=20 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel(f"mean {answer_name} (95% CI)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def compare_guesses_figure(runs: Sequence[RunData], path: Path) -> Path:
    """Each run's distributions side by side, every round as an outline."""
    fig = Figure(figsize=(3.6 * len(runs), 3.2), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(runs), sharey=True, squeeze=False)).ravel()
    for ax, run in zip(axes, runs, strict=True):
        edges = run.game.answer().bin_edges(N_BINS)
        for r, counts in _histograms(run, edges):
            share = counts / max(counts.sum(), 1)
            ax.stairs(share, edges, label=f"round {r}")
        ax.axvline(run.game.equilibrium(), color="black", linestyle=":")
        ax.set_title(f"{run.label}\n{run.game.variant()}", fontsize=9)
        ax.set_xlabel(run.game.answer_name)
    axes[0].set_ylabel(f"share of valid {runs[0].game.answer_plural}")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"distribution of {runs[0].game.answer_plural} per round")
    return _save(fig, path)


def compare_caption(chart: RoundChart) -> str:
    """What ``compare_convergence_figure`` draws, in words."""
    lines = [f"{chart.series[0][1]} (solid)"]
    if len(chart.series) > 1:
        lines.append(f"{chart.series[1][1]} (dashed)")
    text = " and ".join(lines) + " per round"
    if chart.levels:
        text += f"; dotted: each run's {chart.levels[0][0]}"
    return text


def compare_convergence_figure(runs: Sequence[RunData], rounds: Sequence[pd.DataFrame],
                               path: Path) -> Path:
    """The first (solid) and second (dashed) series of every run on one axis, each run's
    first reference level dotted, the human data (if any) in grey."""
    chart = runs[0].game.round_chart()
    fig = Figure(figsize=(6.8, 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for run, table in zip(runs, rounds, strict=True):
        series = run.game.round_chart().series
        column, label = series[0]
        (line,) = ax.plot(table["round"], table[column], marker="o", label=f"{run.label} {label}")
        if len(series) > 1:
            column, label = series[1]
            ax.plot(table["round"], table[column], marker="s", linestyle="--",
                    color=line.get_color(), alpha=0.6, label=f"{run.label} {label}")
        for _, value in run.game.round_chart().levels[:1]:
            ax.axhline(value, color=line.get_color(), linestyle=":", alpha=0.8)
    all_rounds = pd.concat([t["round"] for t in rounds])
    if all(comparable(run, table) for run, table in zip(runs, rounds, strict=True)):
        _reference(ax, chart, all_rounds)
    _round_axis(ax, all_rounds)
    ax.set_ylabel(f"{chart.y_label} (dotted: {chart.levels[0][0]})" if chart.levels
                  else chart.y_label)
    ax.set_title(chart.title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def condition_figure(run: RunData, rows: pd.DataFrame, path: Path) -> Path:
    """One cell: mean (with its interval) and median per round, the game's reference levels
    and the human data where there is any."""
    game = run.game
    chart = game.round_chart()
    fig = Figure(figsize=(6.4, 4.0), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    x = rows["round"].to_numpy()
    ax.fill_between(x, rows["mean_ci_low"], rows["mean_ci_high"], alpha=0.25,
                    label=f"mean, {CONFIDENCE:.0%} interval")
    ax.plot(x, rows["mean"], marker="o", label=f"mean {game.answer_name}")
    mark_flagged(ax, rows, "mean")
    ax.plot(x, rows["median"], marker="s", linestyle="--", label=f"median {game.answer_name}")
    if "winning_guess" in rows:
        ax.plot(x, rows["winning_guess"], marker="^", linestyle="-.", label="winning guess")
    human = game.human_reference()
    column = f"human_{human.column}" if human is not None else None
    if column is not None and column in rows and human.column == "mean":
        shown = rows[column].notna().to_numpy()
        if shown.any():
            ax.plot(x[shown], rows[column][shown], color="grey", linestyle="--", marker="x",
                    label="humans")
    for name, value in chart.levels:
        ax.axhline(value, color="black", linestyle=":", label=f"{name} {value:g}")
    _round_axis(ax, x)
    ax.set_ylim(*game.answer().bounds)
    ax.set_ylabel(game.answer_name)
    ax.set_title(f"{run.label}\n{game.variant()}", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def conditions_figure(runs: Sequence[RunData], rows: pd.DataFrame, path: Path) -> Path:
    """Every cell's mean per round with its interval, on one axis."""
    game = runs[0].game
    fig = Figure(figsize=(7.2, 4.4), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    width = 0.6 / max(len(runs), 1)
    for i, run in enumerate(runs):
        part = rows[rows["condition"] == run.label]
        x = part["round"].to_numpy() + (i - (len(runs) - 1) / 2) * width
        err = np.vstack([part["mean"] - part["mean_ci_low"], part["mean_ci_high"] - part["mean"]])
        weak = (~part["valid_enough"].astype(bool)).any() if "valid_enough" in part else False
        drawn = ax.errorbar(x, part["mean"], yerr=np.nan_to_num(err), marker="o", capsize=3,
                            label=f"{run.label} (not valid enough)" if weak else run.label)
        mark_flagged(ax, part.assign(round=x), "mean", drawn.lines[0].get_color())
    _round_axis(ax, rows["round"].to_numpy())
    ax.set_ylim(*game.answer().bounds)
    ax.set_ylabel(f"mean {game.answer_name} ({CONFIDENCE:.0%} interval)")
    ax.set_title(f"mean {game.answer_name} per round, every condition")
    ax.legend(fontsize=7)
    return _save(fig, path)


def comparable(run: RunData, rounds: pd.DataFrame) -> bool:
    """Whether human data may be drawn beside the run (its rounds: ``valid_enough``): not
    for synthetic answers, nor where any round is not valid enough."""
    if run.synthetic:
        return False
    return "valid_enough" not in rounds or bool(rounds["valid_enough"].all())


def mark_flagged(ax, rows: pd.DataFrame, column: str, color: str = "black") -> None:
    """The rounds of ``rows`` that are not valid enough (``valid_enough``): a hollow ring
    around their point of ``column`` with their n."""
    if "valid_enough" not in rows:
        return
    weak = rows[~rows["valid_enough"].astype(bool) & rows[column].notna()]
    for _, row in weak.iterrows():
        ax.plot([row["round"]], [row[column]], marker="o", markersize=12,
                markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.5)
        ax.annotate(f"n={int(row['n_valid'])} of {int(row['n'])}: not valid enough",
                    (row["round"], row[column]), fontsize=7, xytext=(5, 5),
                    textcoords="offset points")


def _reference(ax, chart: RoundChart, rounds: pd.Series) -> None:
    """The human data per round, on the rounds played that it covers."""
    if chart.reference is None:
        return
    label, values = chart.reference
    played = sorted(int(r) for r in set(rounds) if 1 <= int(r) <= len(values))  # from 1
    if played:
        ax.plot(played, [values[r - 1] for r in played], color="grey", linestyle="--",
                marker="x", label=label)


def _histograms(run: RunData, edges: np.ndarray):
    valid = run.rounds.loc[run.rounds["guess"].notna(), ["round", "guess"]]
    by_round = dict(tuple(valid.groupby("round")["guess"]))
    for r in run.round_indices:
        values = by_round[r].to_numpy() if r in by_round else np.empty(0)
        yield r, np.histogram(values, bins=edges)[0]


def _round_axis(ax, rounds: pd.Series) -> None:
    ticks = sorted(set(int(r) for r in rounds))
    if len(ticks) <= 20:
        ax.set_xticks(ticks)
    ax.set_xlabel("round")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
