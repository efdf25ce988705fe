"""Text pieces every game's prompts share: numbers as people write them, and what a game
hands the common prompt layout (``simpipe.games.prompts.PromptBuilder``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

COT_CUE = "Let's think step by step."


def fmt_number(x: float) -> str:
    """``5.0 -> "5"``, ``33.3333 -> "33.33"``, ``-0.0 -> "0"``; at most two decimals."""
    if not math.isfinite(x):
        return str(x)
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def cot_instruction(about: str, answer: str, marker: str) -> str:
    """The chain-of-thought instruction: reason about ``about``, then the marked answer."""
    return f'Think step by step about {about}, then write "{marker}" followed by your {answer}.'


@dataclass(frozen=True)
class PromptTexts:
    """A game's part of every prompt; the layout around it is the same for every game."""

    rules: str  # the shared rules paragraph: identical for every agent and round
    instruction: str  # how to answer (basic or chain of thought)
    cue: str  # what a basic completion prompt ends with, e.g. "My number:"
    rounds: int
    cot: bool
    # One earlier round as the agent saw it; items are hashable (lines are cached by item).
    history_line: Callable[[Hashable], str]
    # Optional: the history in two parts, (what everyone in the agent's group was told,
    # the agent's own part), so the told part joins the prefix agents share and a distinct
    # prompt differs only in its last line. None lays the history out round by round.
    split_history: Callable[[Sequence[Hashable]], tuple[str, str]] | None = None
