"""The scripted agents beside Nagel (1995), round by round: the calibration table.

The cognitive-hierarchy players (``level_k``) were fitted on the 2/3 sessions only; the 1/2
and 4/3 rows are held out. For 4/3 only the first period's mean is in hand, so its later
rows compare the share of agents choosing 100 with the share of subjects who did.

The agents play through ``BeautyContest.scripted_answers``, the code the pipeline's
``scripted`` back-end calls, in one group, each round told the winning number (the target)
of the round before.

    python -m simpipe.games.beauty_contest.calibration            # the table
    python -m simpipe.games.beauty_contest.calibration --fit      # the grid the fit chose from
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simpipe.games.base import ScriptedSettings, Turn
from simpipe.games.beauty_contest.environment import target_of
from simpipe.games.beauty_contest.game import BeautyContest
from simpipe.games.beauty_contest.level_k import DEPTH_GROWTH, NOISE, TAU
from simpipe.games.beauty_contest.reference import References, load_references
from simpipe.games.config import BeautyContestConfig

TOLERANCE = 3.0  # the task: round by round within +-3 of Nagel's session averages
FITTED = ("2/3",)
RATIOS = ("2/3", "1/2", "4/3")
PERIODS = 4
COLUMNS = ["ratio", "round", "statistic", "model", "nagel", "difference", "within_3", "role"]


@dataclass(frozen=True)
class Play:
    """What scripted agents did: each round's mean, median and share at the top."""

    means: tuple[float, ...]
    medians: tuple[float, ...]
    top_shares: tuple[float, ...]


def play(ratio: str, settings: ScriptedSettings, agents: int = 10_000, seed: int = 0,
         rounds: int = PERIODS) -> Play:
    """``agents`` scripted agents play ``rounds`` rounds of the 0-100 game with this ratio."""
    config = BeautyContestConfig(ratio=ratio, rounds=rounds)
    game = BeautyContest(config)
    frame = pd.DataFrame(index=pd.RangeIndex(agents))
    feedback = np.empty((agents, 0))
    means, medians, tops = [], [], []
    for r in range(rounds):
        turn = Turn(game=game, seed=seed, round_index=r, partition=0, past_feedback=feedback)
        guesses = game.scripted_answers(frame, turn, settings)
        mean = float(guesses.mean())
        means.append(mean)
        medians.append(float(np.median(guesses)))
        tops.append(float(np.mean(guesses == config.high)))
        winning = float(target_of(mean, config))
        feedback = np.column_stack([feedback, np.full(agents, winning)])
    return Play(tuple(means), tuple(medians), tuple(tops))


def calibration_table(settings: ScriptedSettings | None = None, agents: int = 10_000,
                      seed: int = 0, refs: References | None = None) -> pd.DataFrame:
    """Per ratio and round: the model's statistic, Nagel's, their difference, whether it is
    within +-3 (percentage points for shares), and whether the row was fitted or held out."""
    settings = settings or ScriptedSettings()
    refs = refs or load_references()
    rows = []
    for ratio in RATIOS:
        role = "fitted" if ratio in FITTED else "held out"
        result = play(ratio, settings, agents, seed)
        human = _human_rows(refs, ratio)
        for period, statistic, nagel in human:
            if statistic == "mean":
                model = result.means[period - 1]
            else:
                model, nagel = 100 * result.top_shares[period - 1], 100 * nagel
            diff = model - nagel
            rows.append({"ratio": ratio, "round": period, "statistic": statistic,
                         "model": model, "nagel": nagel, "difference": diff,
                         "within_3": bool(abs(diff) <= TOLERANCE), "role": role})
    return pd.DataFrame(rows, columns=COLUMNS)


def _human_rows(refs: References, ratio: str) -> list[tuple[int, str, float]]:
    """(period, statistic, Nagel's value): the session averages where in hand, else the
    first-round mean and the share choosing the top of the range."""
    means = refs.period_means(ratio)
    if means is not None:
        return [(p + 1, "mean", m) for p, m in enumerate(means)]
    first = refs.human_for(ratio, 0)
    top = refs.high_share(ratio)
    if first is None or top is None:
        raise ValueError(f"the reference data has no repeated-play rows for ratio {ratio}")
    rows = [(1, "mean", first.mean)]
    rows += [(p, f"% choosing {top.value:g}", s)
             for p, s in zip(top.periods, top.shares, strict=True)]
    return rows


def format_table(table: pd.DataFrame) -> str:
    """The table as Markdown (what docs/games.md shows)."""
    lines = ["| ratio | round | statistic | model | Nagel | difference | within ±3 | role |",
             "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        lines.append(f"| {row.ratio} | {row.round} | {row.statistic} | {row.model:.1f} | "
                     f"{row.nagel:.1f} | {row.difference:+.1f} | "
                     f"{'yes' if row.within_3 else 'no'} | {row.role} |")
    return "\n".join(lines)


def fit_grid(agents: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """The grid the fit chose ``TAU`` and ``DEPTH_GROWTH`` from, best first: 2/3 only, the
    squared misses of the four session-averaged means plus that of the first-round median;
    noise held at ``NOISE`` (the loss is flat in it between 0.1 and 0.25)."""
    refs = load_references()
    means = np.array(refs.period_means("2/3"))
    first = refs.human_for("2/3", 0)
    rows = []
    for tau, growth in itertools.product(np.arange(0.8, 1.61, 0.05), np.arange(0.0, 0.81, 0.05)):
        settings = ScriptedSettings(tau=round(float(tau), 2), noise=NOISE,
                                    depth_growth=round(float(growth), 2))
        result = play("2/3", settings, agents, seed)
        loss = float(((np.array(result.means) - means) ** 2).sum()
                     + (result.medians[0] - first.median) ** 2)
        rows.append({"tau": round(float(tau), 2), "growth": round(float(growth), 2),
                     "loss": loss, "means": np.round(result.means, 1).tolist(),
                     "median_1": round(result.medians[0], 1)})
    return pd.DataFrame(rows).sort_values("loss", ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simpipe.games.beauty_contest.calibration",
        description="Scripted agents beside Nagel (1995), round by round.")
    parser.add_argument("--agents", type=int, default=10_000, help="agents per game")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit", action="store_true",
                        help="print the fit's grid (best 10) instead of the table")
    args = parser.parse_args(argv)
    if args.agents < 1:
        parser.error("--agents must be at least 1")
    if args.fit:
        print(fit_grid(args.agents, args.seed).head(10).to_string(index=False))
        return
    print(f"tau {TAU}, depth_growth {DEPTH_GROWTH}, noise {NOISE}; {args.agents} agents, "
          f"seed {args.seed}")
    print(format_table(calibration_table(agents=args.agents, seed=args.seed)))


if __name__ == "__main__":
    main()
