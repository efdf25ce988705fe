"""Prompt text for the p-beauty contest: rules, persona, each agent's own history.

Layout, most shared first, so servers with prefix caching reuse the longest common prefix:

    rules (+ variant note) -> round instruction   identical for every agent and every round
    persona                                        per agent, identical across rounds
    own history, oldest first                      per agent, grows append-only
    round line + answer cue                        the only text that changes every round

The round number therefore sits after the history: an agent's round-r prompt extends its
round-(r-1) prompt up to the round line.

Two shapes: "completion" (one plain text for base models such as Gemma 3 270M, ending in an
answer cue) and "chat" (OpenAI-style messages: system = shared rules and instruction,
user = persona + history + round line + a short instruction reminder).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.config import GameConfig, parse_ratio

Style = Literal["completion", "chat"]
Prompt = str | tuple[dict[str, str], ...]

CLASSIC_GAME = "guess 2/3 of the average"
COMPLETION_CUE = "My number:"
COT_CUE = "Let's think step by step."
_LINE_CACHE_MAX = 1_000_000


class HistoryItem(NamedTuple):
    """What one agent saw of an earlier round: its own answer (None: invalid) and the result."""

    round: int  # 0-based, like ``round_index``
    own_guess: float | None
    winning_number: float | None


def fmt_number(x: float) -> str:
    """``5.0 -> "5"``, ``33.3333 -> "33.33"``, ``-0.0 -> "0"``; at most two decimals."""
    if not math.isfinite(x):
        return str(x)
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def rule_text(game: GameConfig) -> str:
    """The target formula in words; the ratio exactly as configured (``"2/3"``, ``"0.51"``)."""
    if game.offset == 0:
        return f"{game.ratio} of the average of all chosen numbers"
    return f"{fmt_number(game.offset)} + {game.ratio} * the average of all chosen numbers"


def rules_text(game: GameConfig) -> str:
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
    if game.disclose_variant:
        lines.append(
            f'This game is a variation of the well-known game "{CLASSIC_GAME}": '
            f"here the target is {rule_text(game)}."
        )
    rounds = "one round" if game.rounds == 1 else f"{game.rounds} rounds"
    lines.append(f"The game lasts {rounds}; after each round the winning number is announced.")
    return " ".join(lines)


def instruction_text(game: GameConfig, marker: str = ANSWER_MARKER) -> str:
    """The shared part of the round instruction for ``game.prompt``."""
    if game.prompt == "cot":
        return (
            "Think step by step about what the other players will choose, then write "
            f'"{marker}" followed by your number.'
        )
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


def history_text(
    history: Sequence[HistoryItem], line: Callable[[HistoryItem], str] = history_line
) -> str:
    """One line per earlier round, oldest first; empty without history."""
    if not history:
        return ""
    return "Your earlier rounds:\n" + "\n".join(map(line, history)) + "\n\n"


class PromptBuilder:
    """Renders prompts for one game and style; the shared prefix is built once."""

    def __init__(self, game: GameConfig, style: Style = "completion", marker: str = ANSWER_MARKER):
        if style not in ("completion", "chat"):
            raise ValueError(f'style must be "completion" or "chat", got {style!r}')
        self.game, self.style, self.marker = game, style, marker
        self.cot = game.prompt == "cot"
        self.rules = rules_text(game)
        self.instruction = instruction_text(game, marker)
        # Completion: everything shared, ready to be followed by the per-agent part.
        self.prefix = f"{self.rules}\n\n{self.instruction}\n\n"
        self.cue = COT_CUE if self.cot else COMPLETION_CUE
        self.system = f"{self.rules}\n\n{self.instruction}"
        self._rounds = game.rounds
        # Winning numbers are shared and guesses repeat a lot: format each distinct line once.
        self._lines: dict[HistoryItem, str] = {}

    def _line(self, item: HistoryItem) -> str:
        text = self._lines.get(item)
        if text is None:
            if len(self._lines) >= _LINE_CACHE_MAX:
                self._lines.clear()
            text = self._lines[item] = history_line(item)
        return text

    def round_line(self, round_index: int) -> str:
        return f"Round {round_index + 1} of {self._rounds}."

    def render(
        self, persona: str | None, history: Sequence[HistoryItem], round_index: int
    ) -> Prompt:
        """One agent's prompt for ``round_index`` (0-based)."""
        return self._render(persona, history, self.round_line(round_index))

    def _render(self, persona: str | None, history: Sequence[HistoryItem], line: str) -> Prompt:
        about = f"About you: {persona.strip()}\n\n" if persona and not persona.isspace() else ""
        tail = about + history_text(history, self._line) + line
        if self.style == "completion":
            return f"{self.prefix}{tail}\n{self.cue}"
        return (
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"{tail} {self.instruction}"},
        )

    def render_many(
        self,
        personas: Sequence[str | None],
        histories: Sequence[Sequence[HistoryItem]] | None,
        round_index: int,
    ) -> list[Prompt]:
        """Prompts for many agents at one round; ``histories=None`` means none yet."""
        if histories is not None and len(histories) != len(personas):
            raise ValueError(
                f"{len(personas)} personas but {len(histories)} histories: one per agent"
            )
        render, line = self._render, self.round_line(round_index)
        if histories is None:
            return [render(p, (), line) for p in personas]
        return [render(p, h, line) for p, h in zip(personas, histories)]
