"""The one interface every game implements; the round loop, the report and the web page
know games only through it.

A game is its ``[game]`` table (``simpipe.games.config``) plus a ``Game`` object built from
it (``simpipe.games.registry.game_for``). The object says:

* what an answer is (``answer``: a number in a range; grammar, regex, JSON schema, parser);
* its words (``prompt_texts``: rules, instruction, cue, how an earlier round reads) for the
  shared prompt layout (``simpipe.games.prompts``), and each agent's history items;
* the round: a partition's ``partial`` of its rows, the exact ``reduce`` of all partials to
  one summary row per group (``summary_columns``), and the one number per group and round
  announced to the group before the next round (``feedback_column``, ``feedback_table``);
* rule-based (scripted) agents' answers;
* its reference values (equilibria) and human data with the citation;
* what the console, the report and the web page show of a round.

Only the rules are abstract (the answer, the words, the round's partial and reduce,
scripted answers, the equilibrium): everything shown (history items, the console line, the
page, the report) has a default read from the summary's ``mean`` and ``n_valid`` columns and
the feedback column, which a game overrides where it has more to say.

Pure domain code: numpy and pandas, no Dask, no HTTP, nothing of the pipeline.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

from simpipe.games.answers import NumberAnswer
from simpipe.games.config import AnyGameConfig
from simpipe.games.partials import Partial
from simpipe.games.round_stats import answer_stats
from simpipe.games.text import PromptTexts, fmt_number


@dataclass(frozen=True)
class Turn:
    """What a partition's agents know when they decide. It crosses to the Dask workers with
    the round's task, so everything in it pickles (a ``Game`` is its ``[game]`` table)."""

    # The game, built: its rules, answer and words, without a registry look-up per use.
    game: Game
    seed: int
    round_index: int
    partition: int
    # (agents, rounds so far): what each agent's group was told after each round (the
    # game's feedback column: the beauty contest's target, told as the winning number, the
    # public goods game's total contribution); NaN where nothing was announced
    past_feedback: np.ndarray
    # (agents, rounds so far): each agent's own earlier answers, NaN where invalid; None
    # when the policy does not ask for them (reading them costs a file per round)
    past_answers: np.ndarray | None = None
    # The round's planned answer distributions (``simpipe.answers.round_plan``), by prompt key
    # (the prompt text for completion prompts): agents whose prompt is here draw from it
    # instead of asking the model. A distribution's ``calls`` and tokens are what this
    # partition is charged for it (zero except in the one partition that carries its cost).
    # Empty where the round is not planned.
    planned: Mapping[str, Any] = field(default_factory=dict)
    # Whether the round plan chose how every prompt of the round is answered: a prompt not in
    # ``planned`` is then answered by calls (the plan found them cheaper, or its distribution
    # could not be pinned down), never by a distribution of this partition's own.
    plan_decides: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.game, Game):  # a [game] table where the built game belongs
            raise TypeError(f"Turn.game must be a Game (registry.game_for(table)), "
                            f"got {type(self.game).__name__}")

    def rng(self, stream: int) -> np.random.Generator:
        """A generator that depends only on (seed, stream, round, partition)."""
        return np.random.default_rng([self.seed, stream, self.round_index, self.partition])


# The cognitive hierarchy stops at level 20 (simpipe.games.beauty_contest.level_k.MAX_LEVEL);
# its Poisson shares exp(-tau) * tau**k / k! underflow to 0 for tau above ~700.
DEPTH_LIMIT = 100.0


# The back-end's table (simpipe.config.backends.ScriptedBackendSettings) is this model with the
# back-end's own keys added: the game's keys are defined once, here.
class ScriptedSettings(BaseModel):
    """`tau`, `depth_growth`, `noise` and `depth_shift` are the keys the game reads: the beauty
    contest's cognitive hierarchy (defaults fitted to Nagel 1995's 2/3 sessions,
    ``simpipe.games.beauty_contest.calibration``); other games have their own calibrated
    players and ignore them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tau: FiniteFloat = Field(1.2, ge=0, le=DEPTH_LIMIT, description=(
        "mean reasoning depth (Poisson) in round 1, growing by `depth_growth` per round; level 0 "
        "guesses uniformly in round 1 and repeats the previous mean later; level k "
        "best-responds to the levels below (fitted to Nagel 1995's 2/3 sessions)"))
    depth_growth: FiniteFloat = Field(0.35, ge=0, le=DEPTH_LIMIT, description=(
        "mean depth added per round played (learning); 0: the same depth every round"))
    # The bound: exp(10 * a normal draw) still fits a float64.
    noise: FiniteFloat = Field(0.25, ge=0, le=10, description=(
        "the sd of a log-normal factor on the distance to the equilibrium"))
    depth_shift: dict[str, dict[str, Annotated[FiniteFloat, Field(ge=-DEPTH_LIMIT,
                                                                  le=DEPTH_LIMIT)]]] = Field(
        default_factory=dict, description=(
            "`attribute = { label = shift }`: added to the mean reasoning depth of an agent "
            "with that label, e.g. `education = { \"Ph.D.\" = 1.0 }`"))

    @classmethod
    def from_table(cls, raw: Mapping[str, Any]) -> ScriptedSettings:
        """From ``[agents.scripted]`` as run.json stores it (other keys are not a game's)."""
        return ScriptedSettings(**{k: raw[k] for k in ScriptedSettings.model_fields if k in raw})


@dataclass(frozen=True)
class HumanReference:
    """Published results of human subjects in (a configuration of) the game."""

    citation: str
    note: str  # how the numbers were obtained, and what could not be checked
    subjects: int
    statistic: str  # what ``by_round`` holds, e.g. "mean contribution (% of endowment)"
    by_round: tuple[float, ...]  # from the first round on; only as many rounds as published
    medians: tuple[float, ...] = ()  # per round, where published
    # The column of ``Game.report_rounds`` that ``by_round`` is on the scale of.
    column: str = "mean"


@dataclass(frozen=True)
class RoundChart:
    """How a game's rounds are drawn, in the report's figures and on the web page."""

    title: str
    y_label: str
    y_range: tuple[float, float]
    # (column of the per-round table, legend label), drawn in this order
    series: tuple[tuple[str, str], ...]
    # horizontal reference lines (name, value), e.g. ("equilibrium", 0.0)
    levels: tuple[tuple[str, float], ...] = ()
    # human data per round from the first, on the same scale as ``series`` (label, values)
    reference: tuple[str, tuple[float, ...]] | None = None


@dataclass
class ReferenceTable:
    """One of the report's comparison tables, for every run of a report."""

    key: str  # the CSV's stem
    title: str
    columns: list[str]
    citation: str
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Game(abc.ABC):
    """A game, configured: built once per ``[game]`` table (``registry.game_for``).

    A game must say its rules (the abstract members); what is shown has defaults that read
    the summary's ``mean`` (the mean valid answer of a group) and ``n_valid`` columns and the
    feedback column: a game whose summary has no ``mean`` overrides them."""

    kind: ClassVar[str]
    title: ClassVar[str]  # e.g. "p-beauty contest"
    answer_name: ClassVar[str]  # what the rows' ``guess`` column holds: "guess", "contribution"
    answer_plural: ClassVar[str]  # "guesses", "contributions"
    summary_columns: ClassVar[tuple[str, ...]]  # summary.parquet, in order
    feedback_column: ClassVar[str]  # the summary column announced to each group
    #: A line under ``simpipe show``'s summary saying what its columns mean ("" for none).
    summary_note: ClassVar[str] = ""
    equilibrium_name: ClassVar[str] = "equilibrium"  # or "Nash equilibrium", ...
    # Whether scripted agents need their own earlier answers (``Turn.past_answers``).
    scripted_needs_own_answers: ClassVar[bool] = False

    def __init__(self, config: AnyGameConfig) -> None:
        self.config = config

    # A game is its table: two built from equal tables are equal, so a game unpickled on a
    # worker (``Turn.game``) finds what the process cached for that table before.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Game):
            return NotImplemented
        return type(self) is type(other) and self.config == other.config

    def __hash__(self) -> int:
        return hash((type(self), self.config))

    # === the rules: what every game must say ============================================

    @abc.abstractmethod
    def answer(self) -> NumberAnswer:
        """What an answer is: its range, constraints and parser."""

    @abc.abstractmethod
    def prompt_texts(self, marker: str) -> PromptTexts:
        """The game's part of every prompt (``marker``: the chain-of-thought answer marker)."""

    @abc.abstractmethod
    def partial(self, rows: pd.DataFrame) -> Partial:
        """What one partition's rows (``group_id``, ``guess``, ``status``) contribute to the
        round's reduce: small, picklable, and merged exactly by ``reduce``."""

    @abc.abstractmethod
    def reduce_merged(self, partial: Partial, round_index: int) -> pd.DataFrame:
        """``reduce`` of the partials of every partition, concatenated."""

    @abc.abstractmethod
    def scripted_answers(self, agents: pd.DataFrame, turn: Turn,
                         settings: ScriptedSettings) -> np.ndarray:
        """One rule-based answer per agent (same order as ``agents``), seeded by ``turn``."""

    @abc.abstractmethod
    def equilibrium(self) -> float:
        """The answer every player gives in the game's equilibrium (``equilibrium_name``)."""

    # === the round, from the rules ======================================================

    def reduce(self, partials: Sequence[Partial], round_index: int) -> pd.DataFrame:
        """One summary row per group (``summary_columns``), sorted by group. A summary's
        ``round`` column numbers rounds from 1, as players and readers count them; the code's
        ``round_index`` counts from 0 (its rows have ``round`` = ``round_index + 1``, set
        here whatever ``reduce_merged`` wrote)."""
        rows = self.reduce_merged(Partial.concat(list(partials)), round_index)
        rows["round"] = np.int32(round_index + 1)
        return rows

    def feedback_table(self, summary: pd.DataFrame, n_groups: int, upto: int) -> np.ndarray:
        """(groups, round indices < upto): the number announced to each group after each
        round; ``summary``'s rounds numbered from 1."""
        table = np.full((n_groups, upto), np.nan)
        if upto and len(summary):
            done = summary[summary["round"] <= upto]
            table[done["group_id"].to_numpy(), done["round"].to_numpy() - 1] = (
                done[self.feedback_column].to_numpy())
        return table

    def reasoning_step(self) -> float | None:
        """The factor one step of reasoning about the others applies (the beauty contest's
        ratio: "2/3 of 50 is 33"), whose iterations are a chain of thought's depth
        (``simpipe.games.cot_audit``); None: the game has none."""
        return None

    def population_problem(self, size: int) -> str | None:
        """Why a population of ``size`` agents cannot play this game; None when it can."""
        return None

    def histories(self, past_answers: np.ndarray | None,
                  past_feedback: np.ndarray) -> list[list[Hashable]] | None:
        """Each agent's earlier rounds as history items (``PromptTexts.history_line`` reads
        them), from its own answers and its group's feedback; None before the first. By
        default one ``(round, own answer, feedback)`` tuple per round, None for an invalid
        answer or nothing announced."""
        if past_answers is None or past_feedback.shape[1] == 0:
            return None
        return [[(r, _number(own), _number(told))
                 for r, (own, told) in enumerate(zip(mine, group, strict=True))]
                for mine, group in zip(past_answers.tolist(), past_feedback.tolist(),
                                       strict=True)]

    # === scripted agents, shown ==========================================================

    def describe_scripted(self, settings: ScriptedSettings) -> str:
        """The scripted agents in a few words (the report's back-end column)."""
        return "rule-based players"

    def scripted_attributes(self, settings: ScriptedSettings) -> set[str]:
        """The population attributes scripted agents' answers depend on (none by default)."""
        return set()

    # === references and what is shown (defaults: the summary's mean answer) ============

    def human_reference(self) -> HumanReference | None:
        """Human subjects' results for this configuration; None when none are published."""
        return None

    def round_numbers(self, rows: pd.DataFrame) -> dict[str, float | None]:
        """A round's headline numbers over all groups, from its summary rows, as run.json
        records them (``mean``: the mean answer, as every game has one)."""
        valid = int(rows["n_valid"].sum())
        if valid == 0:
            return {"mean": None}
        return {"mean": float((rows["mean"] * rows["n_valid"]).sum()) / valid}

    def round_text(self, rows: pd.DataFrame, numbers: Mapping[str, float | None]) -> str:
        """The console round line's game part (``numbers``: ``round_numbers(rows)``)."""
        mean = numbers.get("mean")
        return (f"no valid {self.answer_plural}" if mean is None
                else f"mean {self.answer_name} {mean:.2f}")

    def reference_text(self, round_index: int) -> str:
        """What the round line ends with in brackets, e.g. "equilibrium 0"."""
        return f"{self.equilibrium_name} {fmt_number(self.equilibrium())}"

    def describe(self) -> str:
        """The configured game in one line (the report and the web page)."""
        g = self.config
        return f"{self.title}: groups of {g.group_size}, {g.rounds} rounds, prompt {g.prompt}"

    def variant(self) -> str:
        """What tells this configuration from others of the game, in a few words (titles of
        figures that compare runs)."""
        return f"prompt {self.config.prompt}"

    @property
    def page_columns(self) -> tuple[tuple[str, str], ...]:
        """The web page's rounds table: (column of ``summary_by_round`` or run.json's round
        record, header), after the status counts. A game may set it as a class attribute."""
        extra = self.feedback_column != "mean"
        return ((("mean", f"mean {self.answer_name}"),)
                + (((self.feedback_column, self.feedback_column.replace("_", " ")),)
                   if extra else ()))

    def round_chart(self) -> RoundChart:
        """How rounds are drawn (report figures, the web page's chart)."""
        return RoundChart(title=f"mean {self.answer_name} per round", y_label=self.answer_name,
                          y_range=self.answer().bounds,
                          series=(("mean", f"mean {self.answer_name}"),),
                          levels=((self.equilibrium_name, self.equilibrium()),))

    def summary_by_round(self, summary: pd.DataFrame) -> pd.DataFrame:
        """Per round (index ``round``), the game's statistics pooled over groups from its
        summary rows: what the web page's chart and rounds table show. By default the mean
        valid answer and the mean of the feedback column over groups."""
        weighted = summary.assign(answer_sum=summary["mean"].fillna(0.0) * summary["n_valid"])
        by_round = weighted.groupby("round")
        out = pd.DataFrame({"mean": by_round["answer_sum"].sum() / by_round["n_valid"].sum()})
        if self.feedback_column != "mean":
            out[self.feedback_column] = by_round[self.feedback_column].mean()
        return out

    def round_mark(self, pooled: Mapping[str, Any]) -> tuple[str, float] | None:
        """The round's own line on its histogram of answers (label, value), from that
        round's ``summary_by_round`` row; None when it has none."""
        mean = pooled.get("mean")
        if mean is None or not np.isfinite(mean):
            return None
        return (f"mean {self.answer_name}", float(mean))

    # === the report (pure pandas; the report draws and writes) ==========================

    def report_rounds(self, rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
        """Per round: the report's statistics from every agent's row (``round``, ``guess``,
        ``status``) and the summary; a ``round`` column first. By default the answers'
        statistics and the other columns of ``summary_by_round``."""
        pooled = self.summary_by_round(summary).drop(columns="mean", errors="ignore")
        return answer_stats(rows).join(pooled, how="left").reset_index()

    def report_notes(self) -> dict[str, list[str]]:
        """Notes under the report's "runs" and "rounds" tables, on the game's columns."""
        return {}

    def report_run(self, rounds: pd.DataFrame) -> dict[str, Any]:
        """The game's columns of the report's per-run table (``rounds``: ``report_rounds``)."""
        g = self.config
        return {"group_size": g.group_size, "prompt": g.prompt,
                "first_mean": rounds["mean"].iloc[0], "last_mean": rounds["mean"].iloc[-1]}

    def report_references(self, label: str, rounds: pd.DataFrame) -> list[ReferenceTable]:
        """The comparison tables for one run (each with its records and notes); the report
        concatenates the tables of the same key over runs."""
        return []

    def dominated_shares(self, values: np.ndarray) -> dict[str, float] | None:
        """Among the valid answers ``values``, the shares of answers no player should give
        whatever the others do (the beauty contest: above the highest target possible) and
        at the top of the range, as ``{"dominated_share": ..., "top_share": ...}`` (NaN for
        no answers); None: the game has no dominated answers."""
        return None


def _number(value: float) -> float | None:
    """None for NaN: a history item says "invalid" or "not announced" by None."""
    return None if math.isnan(value) else value
