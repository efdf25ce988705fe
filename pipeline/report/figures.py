"""The report's PNG figures.

Figures are built with ``matplotlib.figure.Figure`` directly (the Agg canvas), never through
pyplot, so nothing global (backend, interactive state, open-figure registry) is touched.
Distributions are binned with numpy first: a million guesses become fifty bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simpipe.report.load import RunData

N_BINS = 50
DPI = 110
MAX_COLUMNS = 5


def guesses_figure(run: RunData, path: Path) -> Path:
    """Histogram of valid guesses, one panel per round, with mean, target and equilibrium."""
    round_ids = run.round_indices
    n_cols = min(len(round_ids), MAX_COLUMNS)
    n_rows = -(-len(round_ids) // n_cols)
    fig = Figure(figsize=(3.2 * n_cols, 2.6 * n_rows + 0.6), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(n_rows, n_cols, sharex=True, squeeze=False)).ravel()
    edges = np.linspace(run.game.low, run.game.high, N_BINS + 1)
    targets = run.summary.groupby("round")["target"].mean()
    for ax, (r, counts) in zip(axes, _histograms(run, edges)):
        ax.stairs(counts, edges, fill=True, color="#4c72b0", alpha=0.8)
        ax.axvline(run.equilibrium, color="black", linestyle=":", label="equilibrium")
        if r in targets.index:
            ax.axvline(targets[r], color="#c44e52", label="target")
        ax.set_title(f"round {r}", fontsize=10)
        ax.set_xlabel("guess")
    for ax in axes[len(round_ids):]:
        ax.set_visible(False)
    axes[0].set_ylabel("agents")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{run.label}: distribution of guesses")
    return _save(fig, path)


def convergence_figure(run: RunData, rounds: pd.DataFrame, path: Path) -> Path:
    """Mean guess, target and winning guess per round against the equilibrium."""
    fig = Figure(figsize=(6.4, 4.0), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.plot(rounds["round"], rounds["mean"], marker="o", label="mean guess")
    ax.plot(rounds["round"], rounds["target"], marker="s", label="target")
    ax.plot(rounds["round"], rounds["winning_guess"], marker="^", linestyle="--",
            label="winning guess")
    ax.axhline(run.equilibrium, color="black", linestyle=":",
               label=f"equilibrium {run.equilibrium:g}")
    _round_axis(ax, rounds["round"])
    ax.set_ylim(run.game.low, run.game.high)
    ax.set_ylabel("number")
    ax.set_title(f"{run.label}: mean and winning number per round")
    ax.legend(fontsize=8)
    return _save(fig, path)


def attribute_figure(table: pd.DataFrame, series: str, title: str, path: Path) -> Path:
    """Mean guess per level with 95% CIs; one dodged series per value of `series`."""
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
        ax.errorbar(x + offset, part["mean"], yerr=np.nan_to_num(yerr), fmt="o", capsize=3,
                    label=f"{series} {group}" if series == "round" else str(group))
    crowded = len(levels) > 4
    ax.set_xticks(x, levels, rotation=20 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel("mean guess (95% CI)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def compare_guesses_figure(runs: Sequence[RunData], path: Path) -> Path:
    """Each run's distributions side by side, every round as an outline."""
    fig = Figure(figsize=(3.6 * len(runs), 3.2), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(runs), sharey=True, squeeze=False)).ravel()
    for ax, run in zip(axes, runs):
        edges = np.linspace(run.game.low, run.game.high, N_BINS + 1)
        for r, counts in _histograms(run, edges):
            share = counts / max(counts.sum(), 1)
            ax.stairs(share, edges, label=f"round {r}")
        ax.axvline(run.equilibrium, color="black", linestyle=":")
        ax.set_title(f"{run.label}\nratio {run.game.ratio}, {run.game.prompt}", fontsize=9)
        ax.set_xlabel("guess")
    axes[0].set_ylabel("share of valid guesses")
    axes[0].legend(fontsize=7)
    fig.suptitle("distribution of guesses per round")
    return _save(fig, path)


def compare_convergence_figure(runs: Sequence[RunData], rounds: Sequence[pd.DataFrame],
                               path: Path) -> Path:
    """Mean guess per round for every run on one axis, each with its equilibrium."""
    fig = Figure(figsize=(6.8, 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for run, table in zip(runs, rounds):
        (line,) = ax.plot(table["round"], table["mean"], marker="o", label=f"{run.label} mean")
        ax.plot(table["round"], table["target"], marker="s", linestyle="--",
                color=line.get_color(), alpha=0.6, label=f"{run.label} target")
        ax.axhline(run.equilibrium, color=line.get_color(), linestyle=":", alpha=0.8)
    _round_axis(ax, pd.concat([t["round"] for t in rounds]))
    ax.set_ylabel("number (dotted: equilibrium)")
    ax.set_title("mean and winning number per round")
    ax.legend(fontsize=8)
    return _save(fig, path)


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
    ax.set_xlabel("round (0 = first)")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
