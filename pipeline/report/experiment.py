"""The comparison of an experiment's cells (``simpipe report EXPERIMENT_DIR``): what
``simpipe.report.build`` puts before the usual tables of every cell's run.

- ``conditions``: one row per cell, its value of each grid key;
- ``conditions_rounds``: per cell and round the mean and median valid answer with
  bootstrap 95% intervals (``simpipe.report.stats``, fixed seeds), the game's other
  per-round numbers (the beauty contest's target and winning guess) and, where the cell's
  game is one the human data covers, the human value of that round beside it; every
  round judged by the validity rule (``simpipe.games.validity``);
- ``pairwise``: every two cells that differ in one grid key, their first-round answers
  tested: as pairs matched by agent_id where the cells share their draws (Wilcoxon
  signed-rank, paired t), as independent samples where they do not (Mann-Whitney U,
  Welch's t), p values Holm-adjusted over the table;
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

from simpipe.core.records import CorruptFile
from simpipe.games import validity
from simpipe.report import figures as fig
from simpipe.report import tables as tab
from simpipe.report.contents import FigureItem, TableSection
from simpipe.report.load import ReportInputError, RunData, load_run, slug
from simpipe.report.stats import (
    CONFIDENCE,
    N_BOOTSTRAP,
    bootstrap_intervals,
    compare_paired,
    compare_samples,
    holm,
)
from simpipe.store.experiment import ExperimentRecord, read_experiment
from simpipe.store.layout import RunPaths
from simpipe.store.states import RunState

#: The first round is where the conditions differ only by what the agents were told: later
#: rounds also carry each cell's own history (the targets it announced). Numbered from 1.
TESTED_ROUND = 1
_MAX_VALUE_CHARS = 60
INTERVAL_COLUMNS = ("mean_ci_low", "mean_ci_high", "median_ci_low", "median_ci_high")
VALIDITY_RULE = (f"a round is valid enough with at least {validity.MIN_VALID_SHARE:.0%} of "
                 f"its answers valid and at least {validity.MIN_N} valid answers "
                 "(simpipe.games.validity)")


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
        paths = RunPaths(run_dir)  # only its top files: no round folder is named
        if not paths.summary.is_file() or not paths.ledger.is_file():
            notes.append(f"cell {cell.name}: {cell.state}, no completed round yet: left out")
            continue
        run = load_run(run_dir, label=cell.name)
        if not run.round_indices:
            notes.append(f"cell {cell.name}: {cell.state}, no completed round yet: left out")
            continue
        if run.ledger.state != RunState.FINISHED:
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
                        "backend": tab.describe_backend(run.ledger.config_dict(), run.game),
                        "answers": run.answers_source, "seed": _seed(run)})
    return pd.DataFrame.from_records(records)


def conditions_rounds(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per cell and round: answers, valid answers, mean and median with bootstrap intervals
    (seeded by the cell's position and the round), the game's other per-round numbers, the
    human value where the cell's game has one, and the round's validity (``valid_enough``,
    ``flag``). A round that is not valid enough, or a cell of synthetic answers, gets no
    interval (the first) and no human value (both)."""
    frames = []
    for index, run in enumerate(runs):
        table = tab.round_table(run)  # the game's own per-round numbers, and the flags
        chart = run.game.round_chart()
        human = run.game.human_reference()
        valid = run.rounds.loc[run.rounds["guess"].notna(), ["round", "guess"]]
        by_round = {int(r): g.to_numpy() for r, g in valid.groupby("round")["guess"]}
        records = []
        for row in table.itertuples(index=False):
            r = int(row.round)
            enough = bool(row.valid_enough)
            # seeded by the round's index, as before rounds were numbered from 1
            intervals = bootstrap_intervals(by_round.get(r, np.empty(0)), key=(index, r - 1))
            if not enough:
                intervals.update(dict.fromkeys(INTERVAL_COLUMNS, float("nan")))
            record = {"condition": run.label, "round": r, "n": int(row.n),
                      "n_valid": int(row.n_valid), "valid_share": float(row.valid_share),
                      **intervals}
            for column, _ in chart.series:
                if column not in record and column in table.columns:
                    record[column] = getattr(row, column)
            if human is not None:
                shown = enough and not run.synthetic and r <= len(human.by_round)
                record[f"human_{human.column}"] = human.by_round[r - 1] if shown else None
            record.update(valid_enough=enough, flag=row.flag)
            records.append(record)
        frames.append(pd.DataFrame.from_records(records))
    return pd.concat(frames, ignore_index=True)


PAIR_COLUMNS = ["factor", "condition_a", "condition_b", "value_a", "value_b", "design", "n_a",
                "n_b", "n_pairs", "mean_a", "mean_b", "diff", "identical_share", "pair_r",
                "rank_test", "rank_stat", "rank_p", "rank_p_holm", "rank_biserial", "t_test",
                "t_stat", "t_p", "t_p_holm", "d_kind", "d", "valid_enough", "flag"]
PAIRED, INDEPENDENT = "paired", "independent"
#: What each design's columns hold (``compare_paired``, ``compare_samples``).
TESTS = {PAIRED: ("Wilcoxon signed-rank", "paired t", "d_z"),
         INDEPENDENT: ("Mann-Whitney U", "Welch t", "Cohen's d")}


def pairwise_table(experiment: ExperimentRuns, factors: Sequence[str]) -> pd.DataFrame:
    """Every two cells whose grid values differ in exactly one key, their answers of
    ``TESTED_ROUND`` compared. Cells that share agents and random draws (the same
    ``run.seed``: ``experiment.independent_draws`` off) are paired samples, matched by
    ``agent_id`` (``compare_paired``: Wilcoxon signed-rank, paired t, d_z); cells with their
    own seeds are independent ones (``compare_samples``: Mann-Whitney U, Welch's t, Cohen's
    d). A pair with a cell that is not valid enough (``simpipe.games.validity``) is not
    tested (its flag says why). ``rank_p_holm`` and ``t_p_holm``: Holm's adjustment over
    the tests of the table that have a p value."""
    runs = experiment.runs
    samples = {run.label: _round_answers(run, TESTED_ROUND) for run in runs}
    counts = {run.label: int((run.rounds["round"] == TESTED_ROUND).sum()) for run in runs}
    records = []
    for a, b in combinations(runs, 2):
        va, vb = experiment.values(a.label), experiment.values(b.label)
        differ = [f for f in factors if va.get(f) != vb.get(f)]
        if len(differ) != 1:
            continue
        factor = differ[0]
        sa, sb = samples[a.label], samples[b.label]
        design = PAIRED if shared_draws(a, b) else INDEPENDENT
        common = sa.index.intersection(sb.index)
        flags = [f"{run.label}: {why}" for run, sample in ((a, sa), (b, sb))
                 if (why := validity.problem(counts[run.label], sample.size))]
        if design == PAIRED and not flags and common.size < validity.MIN_N:
            flags.append(f"only {common.size} agents with a valid answer in both")
        record = {"factor": factor, "condition_a": a.label, "condition_b": b.label,
                  "value_a": _shown(va.get(factor)), "value_b": _shown(vb.get(factor)),
                  "design": design, "n_a": int(sa.size), "n_b": int(sb.size),
                  "mean_a": float(sa.mean()) if sa.size else float("nan"),
                  "mean_b": float(sb.mean()) if sb.size else float("nan")}
        record["diff"] = record["mean_a"] - record["mean_b"]
        if design == PAIRED:
            record["n_pairs"] = int(common.size)
        if not flags:
            record.update(_tested(design, sa, sb, common))
            rank_test, t_test, d_kind = TESTS[design]
            record.update(rank_test=rank_test, t_test=t_test, d_kind=d_kind)
        record.update(valid_enough=not flags, flag="; ".join(flags))
        records.append(record)
    table = pd.DataFrame.from_records(records, columns=PAIR_COLUMNS)
    table["rank_p_holm"] = holm(table["rank_p"].tolist()) if len(table) else []
    table["t_p_holm"] = holm(table["t_p"].tolist()) if len(table) else []
    return table


def _tested(design: str, a: pd.Series, b: pd.Series, common: pd.Index) -> dict[str, Any]:
    if design == PAIRED:
        found = compare_paired(a.loc[common].to_numpy(), b.loc[common].to_numpy())
        return {k: v for k, v in found.items() if k not in ("mean_a", "mean_b", "diff")}
    found = compare_samples(a.to_numpy(), b.to_numpy())
    return {"rank_stat": found["mw_u"], "rank_p": found["mw_p"],
            "rank_biserial": found["rank_biserial"], "t_stat": found["welch_t"],
            "t_p": found["welch_p"], "d": found["cohens_d"]}


def _seed(run: RunData) -> Any:
    return run.ledger.section("run").get("seed")


def shared_draws(a: RunData, b: RunData) -> bool:
    """Whether two cells share their agents' random draws: the same ``run.seed`` (every
    draw of an agent, its persona attributes, its scripted answer, its LLM sampling, is
    seeded by the run's seed and its ``agent_id``), so an agent's answers in the two are
    linked, not independent."""
    seed = _seed(a)
    return seed is not None and seed == _seed(b)


def _round_answers(run: RunData, round_number: int) -> pd.Series:
    """The round's valid answers, indexed by ``agent_id``."""
    rows = run.rounds
    picked = rows.loc[(rows["round"] == round_number) & rows["guess"].notna(),
                      ["agent_id", "guess"]]
    return pd.Series(picked["guess"].to_numpy(dtype=np.float64),
                     index=pd.Index(picked["agent_id"].to_numpy()))


def _rounds_notes(runs: Sequence[RunData], answers: str) -> list[str]:
    notes = [f"mean and median of the valid {answers} with percentile bootstrap "
             f"{CONFIDENCE:.0%} intervals ({N_BOOTSTRAP:,} resamples from fixed seeds: the "
             "same files give the same intervals). Rounds are numbered from 1.",
             f"valid_enough, flag: {VALIDITY_RULE}; a round that is not valid enough shows "
             "its n and mean but no interval and no human value."]
    cited: dict[str, str] = {}
    for run in runs:
        human = run.game.human_reference()
        if human is not None and not run.synthetic:
            cited.setdefault(human.citation, f"human_{human.column}: {human.statistic} of "
                             f"human subjects, {human.note} ({human.citation}); blank where "
                             "the study has no such round")
    notes += list(cited.values())
    synthetic = [run.label for run in runs if run.synthetic]
    if synthetic:
        notes.append(f"no human data beside {', '.join(synthetic)}: {validity.SYNTHETIC_WHY}")
    without = [run.label for run in runs if run.game.human_reference() is None]
    if without and len(without) < len(runs):
        notes.append(f"no human data for {', '.join(without)} (another game variant than "
                     "the published experiments)")
    return notes


def _pairwise_notes(pairs: pd.DataFrame, answers: str) -> list[str]:
    if not len(pairs):
        return ["No two conditions differ in exactly one factor."]
    notes = [f"Round {TESTED_ROUND} (the first): the valid {answers} of each condition. "
             "diff = mean_a - mean_b."]
    paired = pairs[pairs["design"] == PAIRED]
    if len(paired):
        linked = paired["identical_share"].dropna()
        seen = (f" Here {linked.min():.0%}-{linked.max():.0%} of the agents gave the same "
                "answer in both conditions of a pair." if len(linked) else "")
        notes.append(
            "design paired: the two conditions share their agents and random draws (the "
            "same run.seed and agent ids: each agent's persona, scripted answer and LLM "
            "sampling use the same random numbers in both), so an agent's two answers are "
            "linked, not independent samples; tests that assume independence would count the "
            f"shared draws as evidence.{seen} They are matched by agent_id (n_pairs: agents "
            "with a valid answer in both; identical_share: those answering the same; pair_r: "
            "Pearson's r between the two answers) and tested as pairs: Wilcoxon signed-rank "
            "(two-sided, zero differences dropped) with the matched-pairs rank-biserial "
            "correlation (T+ - T-) / (T+ + T-), and the paired t test with d_z = mean "
            "difference / SD of the differences. To give each condition its own draws, set "
            "experiment.independent_draws = true.")
    if (pairs["design"] == INDEPENDENT).any():
        notes.append(
            "design independent: the conditions have their own seeds (their own draws): "
            "Mann-Whitney U (two-sided) with rank_biserial = P(a > b) - P(a < b), and "
            "Welch's t test with Cohen's d = diff / pooled SD.")
    untested = int((~pairs["valid_enough"].astype(bool)).sum())
    if untested:
        notes.append(f"{untested} of {len(pairs)} pairs not tested: a condition is not valid "
                     f"enough ({VALIDITY_RULE}); flag says which and why.")
    m_rank, m_t = int(pairs["rank_p"].notna().sum()), int(pairs["t_p"].notna().sum())
    m = max(m_rank, m_t)
    if m:
        counted = (f"{m} tests" if m_rank == m_t
                   else f"{m_rank} rank tests and {m_t} t tests")
        notes.append(
            f"Multiple comparisons: {counted} with a p value in this table. Read rank_p_holm "
            "and t_p_holm (Holm's adjustment over those, family-wise error rate) rather than "
            f"the raw p values: at 5% each, about {0.05 * m:.1f} of {m} null comparisons "
            "would come out 'significant' by chance. With many agents a tiny difference is "
            "significant: the effect sizes say how large it is.")
    return notes
