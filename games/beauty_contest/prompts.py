"""The p-beauty contest's words: its rules, how to answer, how an earlier round reads."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.config import BeautyContestConfig, parse_ratio
from simpipe.games.text import PromptTexts, cot_instruction, fmt_number

CLASSIC_GAME = "guess 2/3 of the average"
COMPLETION_CUE = "My number:"
RATIONAL_PLAYERS = "All players in this game are rational."
# predict_others with a basic prompt: the completion starts with the prediction.
PREDICTION_CUE = "My prediction of the average of the other players' numbers:"


class HistoryItem(NamedTuple):
    """What one agent saw of an earlier round: its own answer (None: invalid) and the result."""

    round: int  # 0-based, like ``round_index``
    own_guess: float | None
    winning_number: float | None


def prompt_label(game: BeautyContestConfig) -> str:
    """``game.prompt`` with the prompt options that are on: ``"cot, rational players"``."""
    options = [name for name, on in (("rational players", game.rational_players),
                                     ("predict others", game.predict_others)) if on]
    return ", ".join([game.prompt, *options])


def rule_text(game: BeautyContestConfig) -> str:
    """The target formula in words; the ratio exactly as configured (``"2/3"``, ``"0.51"``)."""
    if game.offset == 0:
        return f"{game.ratio} of the average of all chosen numbers"
    return f"{fmt_number(game.offset)} + {game.ratio} * the average of all chosen numbers"


def rules_text(game: BeautyContestConfig) -> str:
    """The shared rules paragraph, variant disclosure included."""
    low, high = fmt_number(game.low), fmt_number(game.high)
    lines = [
        "You are playing a number-guessing game with other players.",
        f"Every player chooses a number between {low} and {high} (inclusive).",
        f"The target is {rule_text(game)}.",
    ]
    ratio = float(parse_ratio(game.ratio))
    lowest, highest = game.offset + ratio * game.low, game.offset + ratio * game.high
    if lowest < game.low or highest > game.high:
        lines.append(f"A target outside {low} to {high} is moved to the nearest end of that range.")
    lines.append("The player whose number is closest to the target wins.")
    if game.rational_players:
        lines.append(RATIONAL_PLAYERS)
    if game.disclose_variant:
        lines.append(
            f'This game is a variation of the well-known game "{CLASSIC_GAME}": '
            f"here the target is {rule_text(game)}."
        )
    rounds = "one round" if game.rounds == 1 else f"{game.rounds} rounds"
    lines.append(f"The game lasts {rounds}; after each round the winning number is announced.")
    return " ".join(lines)


def instruction_text(game: BeautyContestConfig, marker: str = ANSWER_MARKER) -> str:
    """The shared part of the round instruction for ``game.prompt`` (and ``predict_others``:
    the prediction first, then the marked number, so the answer stays one number)."""
    if game.predict_others:
        prediction = "your prediction of the average of the other players' numbers"
        if game.prompt == "cot":
            return (f"Think step by step about what the other players will choose and write "
                    f'{prediction}, then write "{marker}" followed by your number.')
        return f'First write {prediction}, then write "{marker}" followed by your number.'
    if game.prompt == "cot":
        return cot_instruction("what the other players will choose", "number", marker)
    return "Reply with your number only."


def history_line(item: HistoryItem) -> str:
    """``"Round 1: you chose 50; the winning number was 33.33."``"""
    own = (
        "your answer was invalid"
        if item.own_guess is None or not math.isfinite(item.own_guess)
        else f"you chose {fmt_number(item.own_guess)}"
    )
    win = (
        "no winning number was announced"
        if item.winning_number is None or not math.isfinite(item.winning_number)
        else f"the winning number was {fmt_number(item.winning_number)}"
    )
    return f"Round {item.round + 1}: {own}; {win}."


@functools.lru_cache(maxsize=1 << 16)
def _number_or(x: float | None, missing: str) -> str:
    return missing if x is None or not math.isfinite(x) else fmt_number(x)


def _rounds_label(n: int) -> str:
    return "round 1" if n == 1 else f"rounds 1 to {n}"


@functools.lru_cache(maxsize=1 << 12)
def _told_text(winning: tuple[float | None, ...]) -> str:
    # Every agent of a group was told the same numbers: built once per group and round.
    noun = "number" if len(winning) == 1 else "numbers"
    values = ", ".join(_number_or(w, "none announced") for w in winning)
    return f"Winning {noun} of {_rounds_label(len(winning))}: {values}."


def split_history(history: Sequence[HistoryItem]) -> tuple[str, str]:
    """(``"Winning numbers of rounds 1 to 2: 33.33, 24.7."``, ``"Your numbers in rounds 1
    to 2: 50, 30."``): the announced part every agent of a group shares, then its own."""
    told = _told_text(tuple(item.winning_number for item in history))
    noun = "number" if len(history) == 1 else "numbers"
    own = ", ".join(_number_or(item.own_guess, "invalid") for item in history)
    return told, f"Your {noun} in {_rounds_label(len(history))}: {own}."


def prompt_texts(game: BeautyContestConfig, marker: str = ANSWER_MARKER) -> PromptTexts:
    cue = PREDICTION_CUE if game.predict_others else COMPLETION_CUE
    split = split_history if game.history_layout == "split" else None
    return PromptTexts(rules=rules_text(game), instruction=instruction_text(game, marker),
                       cue=cue, rounds=game.rounds, cot=game.prompt == "cot",
                       history_line=history_line, split_history=split)
