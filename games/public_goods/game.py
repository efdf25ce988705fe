"""The linear public goods game as a ``Game``: its environment (``public_goods``), words
(``public_goods_prompts``), rule-based players (``conditional_cooperation``) and the human
data of Fischbacher & Gaechter (2010) (``public_goods_reference.json``)."""

from __future__ import annotations

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
from simpipe.games.config import PublicGoodsConfig
from simpipe.games.data import package_json
from simpipe.games.public_goods import prompts as words
from simpipe.games.public_goods.conditional_cooperation import contributions
from simpipe.games.public_goods.environment import (
    SUMMARY_COLUMNS,
    Partial,
    partial_from_rows,
    payoffs,
    reduce_round,
)
from simpipe.games.round_stats import answer_stats, comparison_refusal
from simpipe.games.text import PromptTexts

DATA_FILE = "public_goods/reference.json"
_STREAM = 0x9C8  # the scripted agents' per-round random stream (Turn.rng)
ROUND_COLUMNS = ["round", "n", "n_valid", "valid_share", "n_truncated", "n_no_final_answer",
                 "mean_contribution", "median", "sd", "contribution_pct", "mean_payoff"]
HUMAN_COLUMNS = ["run", "period", "run_n", "run_pct", "human_n", "human_pct"]


def human_data() -> dict[str, Any]:
    """The published per-period means, their design, citation and caveat."""
    return package_json(DATA_FILE)["human"]


class PublicGoods(Game):
    kind = "public_goods"
    title = "linear public goods game"
    equilibrium_name = "Nash equilibrium"
    answer_name = "contribution"
    answer_plural = "contributions"
    summary_columns = SUMMARY_COLUMNS
    feedback_column = "total_contribution"
    page_columns = (("mean_contribution", "contribution"),
                    ("contribution_pct", "% of endowment"), ("mean_payoff", "payoff"))
    scripted_needs_own_answers = True  # cooperators react to what the others gave

    config: PublicGoodsConfig

    # --- answers and prompts ------------------------------------------------------------

    def answer(self) -> NumberAnswer:
        return NumberAnswer(0, self.config.endowment, self.config.prompt == "cot",
                            integer=True)

    def prompt_texts(self, marker: str) -> PromptTexts:
        return words.prompt_texts(self.config, marker)

    def histories(self, past_answers: np.ndarray | None,
                  past_feedback: np.ndarray) -> list[list[Hashable]] | None:
        """Each agent's own contributions beside its group's totals and its payoffs."""
        if past_answers is None or past_feedback.shape[1] == 0:
            return None
        earned = payoffs(past_answers, past_feedback, self.config)
        out: list[list[Hashable]] = []
        rows = zip(past_answers.tolist(), past_feedback.tolist(), earned.tolist(), strict=True)
        for own, totals, pays in rows:
            out.append([
                words.ContributionItem(r, None if np.isnan(c) else c,
                                       None if np.isnan(t) else t, None if np.isnan(p) else p)
                for r, (c, t, p) in enumerate(zip(own, totals, pays, strict=True))
            ])
        return out

    # --- the round ----------------------------------------------------------------------

    partial = staticmethod(partial_from_rows)

    def reduce_merged(self, partial: Partial, round_index: int) -> pd.DataFrame:
        return reduce_round(partial, self.config, round_index)

    def population_problem(self, size: int) -> str | None:
        n = self.config.group_size
        if size % n == 0:
            return None
        below, above = size - size % n, size - size % n + n
        return (f"population.size = {size:,} does not divide into groups of game.group_size = "
                f"{n}: every member is told the group has {n} players; use a multiple of {n} "
                f"(e.g. {below:,} or {above:,})" if below else
                f"population.size = {size:,} is smaller than game.group_size = {n}")

    # --- scripted agents ----------------------------------------------------------------

    def scripted_answers(self, agents: pd.DataFrame, turn: Turn,
                         settings: ScriptedSettings) -> np.ndarray:
        """Free riders and conditional cooperators (``conditional_cooperation``); the
        cognitive hierarchy's ``settings`` do not apply to this game."""
        return contributions(turn.seed, turn.partition, turn.rng(_STREAM), turn.past_answers,
                             turn.past_feedback, self.config.group_size,
                             self.config.endowment)

    def describe_scripted(self, settings: ScriptedSettings) -> str:
        return "free riders and conditional cooperators"

    # --- references and what is shown ---------------------------------------------------

    def equilibrium(self) -> float:
        """Keeping every point is each player's best reply whatever the others give
        (mpcr < 1): the only Nash equilibrium is that nobody contributes."""
        return 0.0

    def human_reference(self) -> HumanReference | None:
        """Fischbacher & Gaechter (2010), for their design only (group size, endowment and
        MPCR as in the experiment)."""
        data = human_data()
        design = data["design"]
        g = self.config
        if (g.group_size, g.endowment, g.mpcr) != (design["group_size"], design["endowment"],
                                                   design["mpcr"]):
            return None
        return HumanReference(citation=data["citation"], note=data["caveat"],
                              subjects=int(design["subjects"]), statistic=data["statistic"],
                              by_round=tuple(float(v) for v in data["per_period"]),
                              column="contribution_pct")

    def round_numbers(self, rows: pd.DataFrame) -> dict[str, float | None]:
        n = int(rows["n"].sum())
        if n == 0:
            return {"mean": None, "contribution_pct": None, "mean_payoff": None}
        mean = float(rows["total_contribution"].sum()) / n
        return {
            "mean": mean,
            "contribution_pct": 100.0 * mean / self.config.endowment,
            "mean_payoff": float((rows["mean_payoff"] * rows["n"]).sum()) / n,
        }

    def round_text(self, rows: pd.DataFrame, numbers: Mapping[str, float | None]) -> str:
        mean, pct, payoff = (numbers.get(k) for k in ("mean", "contribution_pct", "mean_payoff"))
        if mean is None:
            return "no contributions"
        return (f"contribution {mean:.2f} of {self.config.endowment} ({pct:.1f}%)  "
                f"payoff {payoff:.2f}")

    def reference_text(self, round_index: int) -> str:
        text = "Nash equilibrium: contribute 0"
        human = self.human_reference()
        if human is not None and round_index < len(human.by_round):
            text += f"; humans in period {round_index + 1}: {human.by_round[round_index]:.1f}%"
        return text

    def describe(self) -> str:
        g = self.config
        return (f"groups of {g.group_size}, endowment {g.endowment}, MPCR {g.mpcr:.10g}: "
                f"payoff = {g.endowment} - contribution + {g.mpcr:.10g} × group total, "
                f"{g.rounds} rounds, prompt {g.prompt}; Nash equilibrium: contribute 0")

    def variant(self) -> str:
        return f"MPCR {self.config.mpcr:.10g}, {self.config.prompt}"

    def round_chart(self) -> RoundChart:
        human = self.human_reference()
        reference = None
        if human is not None:
            reference = ("Fischbacher & Gaechter (2010), humans", human.by_round)
        return RoundChart(
            title="mean contribution per round", y_label="contribution (% of endowment)",
            y_range=(0.0, 100.0), series=(("contribution_pct", "mean contribution"),),
            levels=(("Nash equilibrium", 0.0),), reference=reference)

    def summary_by_round(self, summary: pd.DataFrame) -> pd.DataFrame:
        """Mean contribution (points and % of the endowment) and mean payoff over all groups."""
        by_round = summary.assign(payoff_sum=summary["mean_payoff"] * summary["n"]).groupby(
            "round")[["n", "total_contribution", "payoff_sum"]].sum()
        mean = by_round["total_contribution"] / by_round["n"]
        return pd.DataFrame({
            "mean_contribution": mean,
            "contribution_pct": 100.0 * mean / self.config.endowment,
            "mean_payoff": by_round["payoff_sum"] / by_round["n"],
        })

    def round_mark(self, pooled: Mapping[str, Any]) -> tuple[str, float] | None:
        mean = pooled.get("mean_contribution")
        if mean is None or not np.isfinite(mean):
            return None
        return ("mean contribution", float(mean))

    # --- the report ---------------------------------------------------------------------

    def report_rounds(self, rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
        """Per round: contributions of every agent (an invalid answer counts 0, as in the
        payoffs), as points and % of the endowment, and the mean payoff."""
        table = answer_stats(rows, rows["guess"].fillna(0.0))
        table = table.rename(columns={"mean": "mean_contribution"})
        table["contribution_pct"] = 100.0 * table["mean_contribution"] / self.config.endowment
        table = table.join(self.summary_by_round(summary)[["mean_payoff"]], how="left")
        return table.reset_index()[ROUND_COLUMNS]

    def report_notes(self) -> dict[str, list[str]]:
        invalid = ("An invalid answer counts as contributing 0, as it does in the payoffs "
                   "(n_valid says how many answers were valid).")
        return {
            "runs": ["first_pct, last_pct: mean contribution in the first and the last round, "
                     "as % of the endowment; mean_payoff: over all rounds.", invalid],
            "rounds": ["Contributions of every agent, pooled over groups; mean_payoff as the "
                       "game paid it. Rounds are numbered from 1, as in the prompts and the "
                       "Parquet files.",
                       invalid],
        }

    def report_run(self, rounds: pd.DataFrame) -> dict[str, Any]:
        g = self.config
        return {
            "endowment": g.endowment, "mpcr": g.mpcr, "group_size": g.group_size,
            "prompt": g.prompt, "first_pct": rounds["contribution_pct"].iloc[0],
            "last_pct": rounds["contribution_pct"].iloc[-1],
            "mean_payoff": rounds["mean_payoff"].mean(),
        }

    def report_references(self, label: str, rounds: pd.DataFrame) -> list[ReferenceTable]:
        """The first and the last period's mean contribution beside the human data."""
        data = human_data()
        table = ReferenceTable("human_reference",
                               "First and last period beside human subjects", HUMAN_COLUMNS,
                               data["citation"])
        table.notes.append(f"Human data: {data['caveat']}")
        refusal = comparison_refusal(label, rounds)
        if refusal:
            table.notes.append(refusal)
            return [table]
        human = self.human_reference()
        if human is None:
            d = data["design"]
            g = self.config
            table.notes.append(
                f"{label}: no human data for groups of {g.group_size}, endowment {g.endowment}, "
                f"MPCR {g.mpcr:.10g} (the experiment: groups of {d['group_size']}, endowment "
                f"{d['endowment']}, MPCR {d['mpcr']})")
            return [table]
        for position in sorted({0, len(rounds) - 1}):
            row = rounds.iloc[position]
            r = int(row["round"])  # numbered from 1, as the experiment's periods
            if r > len(human.by_round):
                table.notes.append(f"{label}: the experiment has {len(human.by_round)} "
                                   f"periods; round {r} has no human counterpart")
                continue
            table.records.append({
                "run": label, "period": r, "run_n": int(row["n"]),
                "run_pct": row["contribution_pct"], "human_n": human.subjects,
                "human_pct": human.by_round[r - 1],
            })
        return [table]
