"""The comparison of an experiment's cells (``simpipe report EXPERIMENT_DIR``): what
``simpipe.report.build`` puts before the usual tables of every cell's run.

- ``conditions``: one row per cell, its value of each grid key;
- ``conditions_rounds``: per cell and round the mean and median valid answer with
  bootstrap 95% intervals (``simpipe.report.stats``, fixed seeds), the game's other
  per-round numbers (the beauty contest's target and winning number) and, where the cell's
  game is one the human data covers, the human value of that round beside it;
- ``pairwise``: every two cells that differ in one grid key, their first-round answers
  tested (Mann-Whitney U with the rank-biserial correlation, Welch's t with Cohen's d),
  p values Holm-adjusted over the table;
- one figure per cell (mean and median per round with the interval, the human data) and
  one of every cell's mean per round.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simpipe.records import CorruptFile
from simpipe.report import figures as fig
from simpipe.report import tables as tab
from simpipe.report.contents import FigureItem, TableSection
from simpipe.report.load import ReportInputError, RunData, load_run, slug
from simpipe.report.stats import CONFIDENCE, N_BOOTSTRAP, bootstrap_intervals, compare_samples, holm
from simpipe.store.experiment import ExperimentRecord, read_experiment
from simpipe.store.layout import RunPaths

#: The first round is where the conditions differ only by what the agents were told: later
#: rounds also carry each cell's own history (the winning numbers it announced).
TESTED_ROUND = 0
_MAX_VALUE_CHARS = 60


@dataclass
class ExperimentRuns:
    """An experiment folder read back: its record and the cells that have finished rounds."""

    folder: Path
    record: ExperimentRecord
    runs: list[RunData]
    notes: list[str]

    def values(self, cell: str) -> dict[str, Any]:
        found = self.record.cell(cell)
        return dict(found.overrides) if found is not None else {}


def load_experiment_runs(folder: str | Path) -> ExperimentRuns:
    """``experiment.json`` and every cell's run that has a completed round (the others are
    named in a note); ReportInputError when the file is damaged or no cell has a round."""
    folder = Path(folder)
    try:
        record = read_experiment(folder)
    except CorruptFile as exc:
        raise ReportInputError(f"{exc}; rerun `simpipe experiment` on its config to write it "
                               "again") from None
    runs, notes = [], []
    for cell in record.cells:
        run_dir = folder / cell.name
        paths = RunPaths(run_dir)
        if not paths.summary.is_file() or not paths.ledger.is_file():
            notes.append(f"cell {cell.name}: {cell.state}, no completed round yet: left out")
            continue
        run = load_run(run_dir, label=cell.name)
        if not run.round_indices:
            notes.append(f"cell {cell.name}: {cell.state}, no completed round yet: left out")
            continue
        if run.ledger.state != "finished":
            notes.append(f"cell {cell.name}: {run.ledger.state}, {len(run.round_indices)} of "
                         f"{run.ledger.rounds_total} rounds so far")
        runs.append(run)
    if not runs:
        raise ReportInputError(f"{folder}: no cell of the experiment has a completed round yet; "
                               "run `simpipe experiment` on its config first")
    kinds = {run.game.kind for run in runs}
    if len(kinds) > 1:
        raise ReportInputError(f"{folder}: the cells play different games ({', '.join(kinds)}); "
                               "a comparison needs one game")
    return ExperimentRuns(folder, record, runs, notes)


def comparison(experiment: ExperimentRuns, out_dir: Path
               ) -> tuple[list[TableSection], list[FigureItem], list[str]]:
    """The comparison's tables, figures (written under ``out_dir/figures``) and notes."""
    runs = experiment.runs
    game = runs[0].game
    factors = experiment.record.factors()
    rounds = conditions_rounds(runs)
    pairs = pairwise_table(experiment, factors)
    answers = game.answer_plural
    sections = [
        TableSection("conditions", "Conditions", conditions_table(experiment, factors),
                     notes=[f"One run per cell of the grid ({', '.join(factors)}); "
                            f"folder {experiment.folder}."]),
        TableSection("conditions_rounds", "Conditions by round", rounds,
                     notes=_rounds_notes(runs, game.answer_plural)),
        TableSection("pairwise", f"Conditions that differ in one factor: first-round {answers}",
                     pairs, notes=_pairwise_notes(pairs, answers)),
    ]
    figures = [FigureItem(fig.conditions_figure(runs, rounds, out_dir / "figures"
                                            / "conditions-mean.png"),
                          f"every condition: mean {game.answer_name} per round, bootstrap "
                          f"{CONFIDENCE:.0%} interval", section="conditions_rounds")]
    for run in runs:
        figures.append(FigureItem(
            fig.condition_figure(run, rounds[rounds["condition"] == run.label],
                             out_dir / "figures" / f"condition-{slug(run.label)}.png"),
            f"{run.label}: mean and median {game.answer_name} per round",
            section="conditions_rounds"))
    return sections, figures, list(experiment.notes)


# --- tables ---------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    """A grid value as a table cell: text as it is, anything else as its JSON."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=False)
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS - 3] + "..."


def conditions_table(experiment: ExperimentRuns, factors: Sequence[str]) -> pd.DataFrame:
    records = []
    for run in experiment.runs:
        values = experiment.values(run.label)
        records.append({"condition": run.label,
                        **{f: _shown(values[f]) if f in values else None for f in factors},
                        "state": run.ledger.state, "n_agents": run.ledger.n_agents,
                        "rounds": len(run.round_indices),
                        "backend": tab.describe_backend(run.ledger.config_dict(), run.game)})
    return pd.DataFrame.from_records(records)


def conditions_rounds(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per cell and round: valid answers, mean and median with bootstrap intervals (seeded
    by the cell's position and the round), the game's other per-round numbers and the human
    value where the cell's game has one."""
    frames = []
    for index, run in enumerate(runs):
        table = tab.round_table(run)  # the game's own per-round numbers
        chart = run.game.round_chart()
        human = run.game.human_reference()
        valid = run.rounds.loc[run.rounds["guess"].notna(), ["round", "guess"]]
        by_round = {int(r): g.to_numpy() for r, g in valid.groupby("round")["guess"]}
        records = []
        for row in table.itertuples(index=False):
            r = int(row.round)
            record = {"condition": run.label, "round": r, "n": int(row.n),
                      "n_valid": int(row.n_valid),
                      **bootstrap_intervals(by_round.get(r, np.empty(0)), key=(index, r))}
            for column, _ in chart.series:
                if column not in record and column in table.columns:
                    record[column] = getattr(row, column)
            if human is not None:
                record[f"human_{human.column}"] = (human.by_round[r] if r < len(human.by_round)
                                                   else None)
            records.append(record)
        frames.append(pd.DataFrame.from_records(records))
    return pd.concat(frames, ignore_index=True)


def pairwise_table(experiment: ExperimentRuns, factors: Sequence[str]) -> pd.DataFrame:
    """Every two cells whose grid values differ in exactly one key, their answers of
    ``TESTED_ROUND`` compared (``compare_samples``); ``mw_p_holm`` adjusts ``mw_p`` and
    ``welch_p_holm`` ``welch_p`` over the whole table."""
    runs = experiment.runs
    samples = {run.label: _round_answers(run, TESTED_ROUND) for run in runs}
    records = []
    for a, b in combinations(runs, 2):
        va, vb = experiment.values(a.label), experiment.values(b.label)
        differ = [f for f in factors if va.get(f) != vb.get(f)]
        if len(differ) != 1:
            continue
        factor = differ[0]
        records.append({"factor": factor, "condition_a": a.label, "condition_b": b.label,
                        "value_a": _shown(va.get(factor)), "value_b": _shown(vb.get(factor)),
                        **compare_samples(samples[a.label], samples[b.label])})
    columns = ["factor", "condition_a", "condition_b", "value_a", "value_b", "n_a", "n_b",
               "mean_a", "mean_b", "diff", "mw_u", "mw_p", "mw_p_holm", "rank_biserial",
               "welch_t", "welch_p", "welch_p_holm", "cohens_d"]
    table = pd.DataFrame.from_records(records, columns=[c for c in columns
                                                        if not c.endswith("_holm")])
    table["mw_p_holm"] = holm(table["mw_p"].tolist()) if len(table) else []
    table["welch_p_holm"] = holm(table["welch_p"].tolist()) if len(table) else []
    return table[columns]


def _round_answers(run: RunData, round_index: int) -> np.ndarray:
    rows = run.rounds
    picked = rows.loc[(rows["round"] == round_index) & rows["guess"].notna(), "guess"]
    return picked.to_numpy(dtype=np.float64)


def _rounds_notes(runs: Sequence[RunData], answers: str) -> list[str]:
    notes = [f"mean and median of the valid {answers} with percentile bootstrap "
             f"{CONFIDENCE:.0%} intervals ({N_BOOTSTRAP:,} resamples from fixed seeds: the "
             "same files give the same intervals). Rounds are numbered from 0."]
    cited: dict[str, str] = {}
    for run in runs:
        human = run.game.human_reference()
        if human is not None:
            cited.setdefault(human.citation, f"human_{human.column}: {human.statistic} of "
                             f"human subjects, {human.note} ({human.citation}); blank where "
                             "the study has no such round")
    notes += list(cited.values())
    without = [run.label for run in runs if run.game.human_reference() is None]
    if without and len(without) < len(runs):
        notes.append(f"no human data for {', '.join(without)} (another game variant than "
                     "the published experiments)")
    return notes


def _pairwise_notes(pairs: pd.DataFrame, answers: str) -> list[str]:
    if not len(pairs):
        return ["No two conditions differ in exactly one factor."]
    m = len(pairs)
    return [
        f"Round {TESTED_ROUND} (the first): valid {answers} of each condition, independent "
        "samples. mw: Mann-Whitney U, two-sided; rank_biserial = P(a > b) - P(a < b). welch: "
        "Welch's t test; cohens_d = (mean_a - mean_b) / pooled SD. diff = mean_a - mean_b.",
        f"Multiple comparisons: {m} tests in this table. Read mw_p_holm and welch_p_holm "
        "(Holm's adjustment, family-wise error rate) rather than the raw p values: at 5% each, "
        f"about {0.05 * m:.1f} of {m} null comparisons would come out 'significant' by chance. "
        "With many agents a tiny difference is significant: the effect sizes say how large "
        "it is.",
    ]
