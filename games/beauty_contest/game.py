"""The p-beauty contest as a ``Game``: its environment (``beauty_contest``), words
(``beauty_contest_prompts``), rule-based players (``level_k``) and published numbers
(``beauty_contest_reference``) behind the one interface."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from simpipe.games.answers import NumberAnswer
from simpipe.games.base import (
    Game,
    HumanReference,
    ReferenceTable,
    RoundChart,
    ScriptedSettings,
    Turn,
)
from simpipe.games.beauty_contest import prompts as words
from simpipe.games.beauty_contest.environment import (
    SUMMARY_COLUMNS,
    Partial,
    equilibrium,
    partial_from_rows,
    reduce_round,
)
from simpipe.games.beauty_contest.level_k import HierarchyParams, hierarchy_guesses
from simpipe.games.beauty_contest.reference import load_references
from simpipe.games.config import BeautyContestConfig
from simpipe.games.round_stats import answer_stats, comparison_refusal
from simpipe.games.text import PromptTexts

_STREAM = 0x5C1  # the scripted agents' random stream (Turn.rng)
WITHIN = 1.0  # "rounds to get within 1 of the equilibrium"
#: How the console's round line says what the target is: the number the agents are told.
ANNOUNCED = "announced as the winning number"
ROUND_COLUMNS = ["round", "n", "n_valid", "valid_share", "n_truncated", "n_no_final_answer",
                 "mean", "median", "sd", "dominated_share", "top_share", "target",
                 "winning_guess"]
HUMAN_COLUMNS = ["run", "ratio", "study", "run_n", "run_mean", "run_median", "run_target",
                 "human_n", "human_mean", "human_median", "human_target"]
PAPER_COLUMNS = ["run", "prompt", "metric", "paper_model", "paper_value", "approximate",
                 "run_value", "run_dominated_share", "run_top_share"]
NAGEL = "Nagel (1995), lab"


def rounds_to_equilibrium(rounds: pd.DataFrame, target: float, within: float = WITHIN) -> float:
    """Rounds played until the mean guess is within `within` of `target` (1: the first round;
    ``rounds``' ``round`` numbered from 1).

    NaN when it never gets there.
    """
    hit = rounds.loc[(rounds["mean"] - target).abs() <= within, "round"]
    return float(hit.min()) if len(hit) else float("nan")


def weighted_mean(rows: pd.DataFrame) -> float | None:
    """The mean valid guess over groups (each group's mean weighted by its valid guesses)."""
    valid = rows["n_valid"].to_numpy()
    if valid.sum() == 0:
        return None
    return float(np.nansum(rows["mean"].to_numpy() * valid) / valid.sum())


class BeautyContest(Game):
    kind = "beauty_contest"
    title = "p-beauty contest"
    equilibrium_name = "equilibrium"
    answer_name = "guess"
    answer_plural = "guesses"
    summary_columns = SUMMARY_COLUMNS
    # The target is what the agents are told, in the words of the paper and of Nagel (1995):
    # "the winning number"; the valid guess closest to it is the winning guess.
    feedback_column = "target"
    page_columns = (("mean", "mean"), ("median", "median"), ("target", "target"),
                    ("winning_guess", "winning guess"))
    summary_note = ("target: offset + ratio x mean, announced to the agents as the winning "
                    "number; winning_guess: the valid guess closest to it. Rounds from 1.")

    config: BeautyContestConfig

    def __init__(self, config: BeautyContestConfig) -> None:
        super().__init__(config)
        self._equilibrium = equilibrium(config)

    # --- answers and prompts ------------------------------------------------------------

    def answer(self) -> NumberAnswer:
        return NumberAnswer(self.config.low, self.config.high, self.config.free_text_answer)

    def prompt_texts(self, marker: str) -> PromptTexts:
        return words.prompt_texts(self.config, marker)

    def histories(self, past_answers: np.ndarray | None,
                  past_feedback: np.ndarray) -> list[list[Hashable]] | None:
        """Each agent's own earlier answers beside the targets it was told (as the winning
        numbers)."""
        if past_answers is None or past_feedback.shape[1] == 0:
            return None
        out: list[list[Hashable]] = []
        for guesses, winning in zip(past_answers.tolist(), past_feedback.tolist(), strict=True):
            out.append([
                words.HistoryItem(r, None if math.isnan(g) else g, None if math.isnan(w) else w)
                for r, (g, w) in enumerate(zip(guesses, winning, strict=True))
            ])
        return out

    # --- the round ----------------------------------------------------------------------

    partial = staticmethod(partial_from_rows)

    def reduce_merged(self, partial: Partial, round_index: int) -> pd.DataFrame:
        return reduce_round(partial, self.config, round_index)

    # --- scripted agents ----------------------------------------------------------------

    def scripted_answers(self, agents: pd.DataFrame, turn: Turn,
                         settings: ScriptedSettings) -> np.ndarray:
        """Cognitive-hierarchy guesses (``level_k``), two decimals."""
        n = len(agents)
        depth_mean = np.full(n, float(settings.tau))
        for attr, shifts in settings.depth_shift.items():
            values = agents[attr].astype(object)
            depth_mean += values.map(shifts).fillna(0.0).to_numpy(dtype=np.float64)
        anchor = turn.past_feedback[:, -1] if turn.round_index > 0 else None
        params = HierarchyParams(tau=settings.tau, noise=settings.noise,
                                 growth=settings.depth_growth)
        guesses = hierarchy_guesses(self.config, params, depth_mean, anchor, turn.rng(_STREAM),
                                    turn.round_index)
        # Two decimals, as a person (or the LLM answer grammar) would write them; it also keeps
        # the per-partition value counts that the reduce receives small.
        return np.round(guesses, 2)

    def describe_scripted(self, settings: ScriptedSettings) -> str:
        return f"tau {settings.tau}"

    def scripted_attributes(self, settings: ScriptedSettings) -> set[str]:
        return set(settings.depth_shift)

    # --- references and what is shown ---------------------------------------------------

    def equilibrium(self) -> float:
        return self._equilibrium

    def reasoning_step(self) -> float | None:
        return self.config.ratio_value

    def human_reference(self) -> HumanReference | None:
        """Nagel (1995) for this ratio (no offset, guesses in [0, 100]): the mean choice per
        period where her sessions' periods are in hand (1/2, 2/3: the unweighted average of
        the sessions' means), the first period alone otherwise (4/3)."""
        refs = load_references()
        row = refs.human_for(self.config.ratio, self.config.offset)
        if row is None or (self.config.low, self.config.high) != (0, 100):
            return None
        periods = refs.period_means(self.config.ratio)
        if periods is not None:
            # Period 1 is Nagel's figure over all the ratio's subjects (first_round.mean), the
            # one the first-round table shows; the unweighted average of the sessions'
            # period-1 means differs in the second decimal (36.68 for 2/3, not 36.73).
            periods = (row.mean, *periods[1:])
        if periods is None:
            return HumanReference(
                citation=refs.human_citation, note="first-round guesses only", subjects=row.n,
                statistic="mean guess", by_round=(row.mean,), medians=(row.median,))
        return HumanReference(
            citation=refs.human_citation, subjects=row.n, statistic="mean guess",
            note="mean choice per period: period 1 over all subjects, later periods the "
                 "unweighted average of the sessions' means (the winning number announced "
                 "after each period)",
            by_round=periods, medians=(row.median,))

    def round_numbers(self, rows: pd.DataFrame) -> dict[str, float | None]:
        return {"mean": weighted_mean(rows)}

    def round_text(self, rows: pd.DataFrame, numbers: Mapping[str, float | None]) -> str:
        if len(rows) == 1:
            row = rows.iloc[0]
            return (f"mean {row['mean']:.2f}  target ({ANNOUNCED}) {row['target']:.2f}  "
                    f"winning guess {row['winning_guess']:.2f}")
        return (f"mean {numbers['mean'] or float('nan'):.2f}  target ({ANNOUNCED}; avg over "
                f"{len(rows)} groups) {rows['target'].mean():.2f}")

    def reference_text(self, round_index: int) -> str:
        return f"equilibrium {self._equilibrium:g}"

    def describe(self) -> str:
        g = self.config
        return (f"target = {g.offset:g} + {g.ratio} × mean, guesses in [{g.low:g}, {g.high:g}], "
                f"{g.rounds} rounds, prompt {words.prompt_label(g)}, "
                f"equilibrium {self._equilibrium:.2f}")

    def variant(self) -> str:
        return f"ratio {self.config.ratio}, {words.prompt_label(self.config)}"

    def round_chart(self) -> RoundChart:
        return RoundChart(
            title="mean guess, target and winning guess per round", y_label="number",
            y_range=(self.config.low, self.config.high),
            series=(("mean", "mean guess"), ("target", "target"),
                    ("winning_guess", "winning guess")),
            levels=(("equilibrium", self._equilibrium),))

    def summary_by_round(self, summary: pd.DataFrame) -> pd.DataFrame:
        """Median, target and winning guess averaged over groups (the mean guess pooled
        over groups is ``round_numbers``' and run.json's)."""
        return summary.groupby("round")[["median", "target", "winning_guess"]].mean()

    def round_mark(self, pooled: Mapping[str, Any]) -> tuple[str, float] | None:
        target = pooled.get("target")
        if target is None or not np.isfinite(target):
            return None
        return ("target", float(target))

    # --- the report ---------------------------------------------------------------------

    def report_rounds(self, rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
        """Per round: n, valid share, mean, median, sd of valid guesses; target and winning
        guess as announced (from the summary; averaged over groups when there are several)."""
        announced = summary.groupby("round")[["target", "winning_guess"]].mean()
        table = answer_stats(rows).join(announced, how="left")
        valid = rows["guess"].dropna().groupby(rows["round"])
        shares = pd.DataFrame.from_dict(
            {r: self.dominated_shares(g.to_numpy()) for r, g in valid}, orient="index",
            columns=["dominated_share", "top_share"])
        table = table.join(shares, how="left").reset_index()
        return table[ROUND_COLUMNS]

    def highest_target(self) -> float:
        """The largest target the game can announce (everyone at the top of the range):
        ``offset + ratio * high`` clipped to the range (66.67 in the classic game)."""
        g = self.config
        return float(np.clip(g.offset + g.ratio_value * g.high, g.low, g.high))

    def dominated_shares(self, values: np.ndarray) -> dict[str, float] | None:
        """Shares of valid guesses above ``highest_target`` (dominated: whatever the others
        guess, the highest target is closer to the target) and at the top of the range."""
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return {"dominated_share": float("nan"), "top_share": float("nan")}
        return {"dominated_share": float(np.mean(values > self.highest_target() + 1e-9)),
                "top_share": float(np.mean(values >= self.config.high))}

    def report_notes(self) -> dict[str, list[str]]:
        return {
            "runs": ["rounds_to_within_1: rounds played until the mean guess is within 1 of "
                     "the equilibrium (1 = already in the first round)."],
            "rounds": ["Statistics of valid guesses, pooled over groups; target and "
                       "winning_guess as announced (averaged over groups when there are "
                       "several). Rounds are numbered from 1, as in the prompts and the "
                       "Parquet files.",
                       f"dominated_share: share of valid guesses above "
                       f"{self.highest_target():.4g}, the highest target possible (offset + "
                       "ratio x the top of the range): whatever the others guess, that "
                       "number is closer to the target, so a guess above it is never a "
                       f"best reply; top_share: share at {self.config.high:g}, the top of "
                       "the range."],
        }

    def report_run(self, rounds: pd.DataFrame) -> dict[str, Any]:
        first, last = rounds.iloc[0], rounds.iloc[-1]
        return {
            "ratio": self.config.ratio, "offset": self.config.offset,
            "prompt": self.config.prompt, "equilibrium": self._equilibrium,
            "first_mean": first["mean"], "first_median": first["median"],
            "last_mean": last["mean"],
            "rounds_to_within_1": rounds_to_equilibrium(rounds, self._equilibrium),
        }

    def report_references(self, label: str, rounds: pd.DataFrame) -> list[ReferenceTable]:
        refs = load_references()
        return [self._human_table(label, rounds, refs), self._paper_table(label, rounds, refs)]

    def _human_table(self, label: str, rounds: pd.DataFrame, refs: Any) -> ReferenceTable:
        """The first round beside Nagel (1995)'s row for this ratio and, for 2/3, the
        newspaper contests (Bosch-Domènech et al. 2002: one-shot play by thousands of
        readers); a note where none."""
        g = self.config
        table = ReferenceTable("human_reference", "First round beside human subjects",
                               HUMAN_COLUMNS, f"{refs.human_citation} {refs.newspaper_citation}")
        refusal = comparison_refusal(label, rounds)
        if refusal:
            table.notes.append(refusal)
            return table
        human = refs.human_for(g.ratio, g.offset)
        if human is None or (g.low, g.high) != (0, 100):
            table.notes.append(f"{label}: no human data for ratio {g.ratio}"
                               f"{'' if g.offset == 0 else f' with offset {g.offset:g}'}"
                               f"{'' if (g.low, g.high) == (0, 100) else ' in this range'}"
                               f" (Nagel 1995 has 1/2, 2/3 and 4/3 without offset, 0-100)")
            return table
        first = rounds.iloc[0]
        run = {"run": label, "ratio": g.ratio, "run_n": int(first["n_valid"]),
               "run_mean": first["mean"], "run_median": first["median"],
               "run_target": first["target"]}
        table.records.append({**run, "study": NAGEL, "human_n": human.n,
                              "human_mean": human.mean, "human_median": human.median,
                              "human_target": None})
        papers = refs.newspaper_for(g.ratio, g.offset)
        for paper in papers:
            table.records.append({**run, "study": f"{paper.source}, newspaper",
                                  "human_n": paper.n, "human_mean": paper.mean,
                                  "human_median": None, "human_target": paper.winning})
        if papers:
            table.notes.append(
                "Lab and newspaper: Nagel's subjects played in the lab (15-18 per session, "
                "repeated); the newspaper contests were played once by thousands of readers "
                "(human_target: the winning number, 2/3 of the mean; run_target: the run's "
                f"first target). {refs.newspaper_caveat}")
        return table

    def _paper_table(self, label: str, rounds: pd.DataFrame, refs: Any) -> ReferenceTable:
        """The paper's LLM numbers beside this run, for the same game and prompt."""
        g = self.config
        table = ReferenceTable("paper_reference", "Beside the paper's LLM agents",
                               PAPER_COLUMNS, refs.llm_citation)
        if not refs.llm_applies(g.ratio, g.offset):
            table.notes.append(f"{label}: the paper's numbers are for ratio {refs.llm_ratio} "
                               f"without offset; this run has ratio {g.ratio}, "
                               f"offset {g.offset:g}")
            return table
        refusal = comparison_refusal(label, rounds)
        if refusal:
            table.notes.append(refusal)
            return table
        if g.rational_players or g.predict_others:
            table.notes.append(f"{label}: the paper's numbers are for its basic and cot prompts; "
                               f"this run's prompt is {words.prompt_label(g)}")
            return table
        for ref in refs.llm:
            if ref.prompt != g.prompt:
                continue
            value = _metric(ref.metric, rounds)
            if value is None:
                table.notes.append(f"{label}: {refs.metrics.get(ref.metric, ref.metric)} needs "
                                   f"more rounds than the {len(rounds)} played")
                continue
            shares = ({"run_dominated_share": rounds["dominated_share"].iloc[0],
                       "run_top_share": rounds["top_share"].iloc[0]}
                      if ref.metric == "first_round_mean" and "dominated_share" in rounds
                      else {"run_dominated_share": None, "run_top_share": None})
            table.records.append({
                "run": label, "prompt": ref.prompt, "metric": ref.metric,
                "paper_model": ref.model, "paper_value": ref.value,
                "approximate": ref.approximate, "run_value": value, **shares,
            })
        if any(r["run_dominated_share"] is not None for r in table.records):
            table.notes.append(
                f"run_dominated_share, run_top_share: the run's first-round guesses above "
                f"{self.highest_target():.4g} (never a best reply) and at "
                f"{self.config.high:g}; the paper's mean of about 50 may hide such guesses.")
        return table


def _metric(metric: str, rounds: pd.DataFrame) -> float | None:
    if metric == "first_round_mean":
        return float(rounds["mean"].iloc[0])
    if metric == "first_round_winning_number":
        return float(rounds["target"].iloc[0])
    if metric == "five_round_average_winning_number":
        return float(rounds["target"].iloc[:5].mean()) if len(rounds) >= 5 else None
    raise ValueError(f"unknown reference metric {metric!r} in the reference data")
