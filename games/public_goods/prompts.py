"""The public goods game's words: its rules, how to answer, how an earlier round reads."""

from __future__ import annotations

import math
from typing import NamedTuple

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.config import PublicGoodsConfig
from simpipe.games.text import PromptTexts, cot_instruction, fmt_number

COMPLETION_CUE = "My contribution:"


class ContributionItem(NamedTuple):
    """What one agent saw of an earlier round."""

    round: int  # 0-based, like ``round_index``
    own: float | None  # its contribution; None: its answer was invalid (counted as 0)
    group_total: float | None  # its group's total contribution; None: not announced
    payoff: float | None  # what it earned; None when the group total is unknown


def rules_text(game: PublicGoodsConfig) -> str:
    """The shared rules paragraph."""
    n, endowment = game.group_size, game.endowment
    # The factor and the MPCR exactly as configured (``g``: no float noise like 1.6000000001).
    factor, mpcr = f"{game.mpcr * n:.10g}", f"{game.mpcr:.10g}"
    rounds = "one round" if game.rounds == 1 else f"{game.rounds} rounds"
    return " ".join([
        f"You are playing an investment game in a group of {n} players.",
        f"In every round each player receives {endowment} points and decides how many of them "
        f"to contribute to a group project: a whole number from 0 to {endowment}.",
        "Points not contributed are kept.",
        f"The project multiplies the group's total contribution by {factor} and shares it "
        f"equally: every member earns {mpcr} points for each point contributed by anyone in "
        "the group, including their own.",
        "Your payoff in a round is the points you kept plus your share of the project.",
        f"The game lasts {rounds} in the same group; after each round you learn your group's "
        "total contribution and your payoff.",
    ])


def instruction_text(game: PublicGoodsConfig, marker: str = ANSWER_MARKER) -> str:
    """The shared part of the round instruction for ``game.prompt``."""
    if game.prompt == "cot":
        return cot_instruction("what the other members of your group will contribute",
                               "contribution", marker)
    return "Reply with your contribution only."


def history_line(item: ContributionItem) -> str:
    """``"Round 2: you contributed 8; your group contributed 36 in total; your payoff was
    26.40."``"""
    own = (
        "your answer was invalid and counted as contributing 0"
        if item.own is None or not math.isfinite(item.own)
        else f"you contributed {fmt_number(item.own)}"
    )
    if item.group_total is None or not math.isfinite(item.group_total):
        return f"Round {item.round + 1}: {own}; no group result was announced."
    payoff = "" if item.payoff is None else f"; your payoff was {item.payoff:.2f}"
    return (f"Round {item.round + 1}: {own}; your group contributed "
            f"{fmt_number(item.group_total)} in total{payoff}.")


def prompt_texts(game: PublicGoodsConfig, marker: str = ANSWER_MARKER) -> PromptTexts:
    return PromptTexts(rules=rules_text(game), instruction=instruction_text(game, marker),
                       cue=COMPLETION_CUE, rounds=game.rounds, cot=game.prompt == "cot",
                       history_line=history_line)
