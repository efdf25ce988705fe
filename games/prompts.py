"""Prompt text for any game: its rules, the agent's persona, the agent's own history.

Layout, most shared first, so that an engine reusing a common prefix (llama.cpp's slot
cache, vLLM's and TGI's prefix caches, the embedded engine's probe chains) evaluates only
where prompts differ:

    rules -> round instruction                    identical for every agent and every round
    persona                                        per agent, identical across rounds
    announced results, oldest first                identical within a group (split layout)
    round line                                     identical for every agent of the round
    own earlier answers                            per agent: the distinct suffix
    answer cue

That is the split layout, for games whose history splits into what the group was told and
the agent's own part (``PromptTexts.split_history``; the beauty contest by default). Round
by round instead (``history_line``, one line per earlier round with both parts):

    rules -> round instruction, persona
    own history, oldest first                      per agent, grows append-only
    round line + answer cue

After round 1 nearly every agent's prompt is distinct (its own answers), so what a distinct
prompt costs is the text after the point where it leaves its sorted neighbour: the split
layout puts the shared announced numbers before that point and only the own answers after
it (measured in docs/measurements.md). The game supplies the rules, the instruction, the
cue and how its history reads (``Game.prompt_texts``); the layout is the same for all.

Two shapes: "completion" (one plain text for base models such as Gemma 3 270M, ending in an
answer cue) and "chat" (OpenAI-style messages: system = shared rules and instruction,
user = persona + history + round line + a short instruction reminder).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Literal

from simpipe.games.answer_format import ANSWER_MARKER
from simpipe.games.config import AnyGameConfig
from simpipe.games.registry import game_for
from simpipe.games.text import COT_CUE

Style = Literal["completion", "chat"]
Prompt = str | tuple[dict[str, str], ...]

_LINE_CACHE_MAX = 1_000_000


def history_text(history: Sequence[Hashable], line: Callable[[Hashable], str]) -> str:
    """One line per earlier round, oldest first; empty without history."""
    if not history:
        return ""
    return "Your earlier rounds:\n" + "\n".join(map(line, history)) + "\n\n"


class PromptBuilder:
    """Renders one game's prompts in one style; the shared prefix is built once."""

    def __init__(self, game: AnyGameConfig, style: Style = "completion",
                 marker: str = ANSWER_MARKER):
        if style not in ("completion", "chat"):
            raise ValueError(f'style must be "completion" or "chat", got {style!r}')
        texts = game_for(game).prompt_texts(marker)
        self.game, self.style, self.marker = game, style, marker
        self.cot = texts.cot
        self.rules = texts.rules
        self.instruction = texts.instruction
        # Completion: everything shared, ready to be followed by the per-agent part.
        self.prefix = f"{self.rules}\n\n{self.instruction}\n\n"
        self.cue = COT_CUE if self.cot else texts.cue
        self.system = f"{self.rules}\n\n{self.instruction}"
        self._rounds = texts.rounds
        self._history_line = texts.history_line
        self._split_history = texts.split_history
        # Announced numbers are shared and answers repeat a lot: format each distinct line once.
        self._lines: dict[Hashable, str] = {}

    def _line(self, item: Hashable) -> str:
        text = self._lines.get(item)
        if text is None:
            if len(self._lines) >= _LINE_CACHE_MAX:
                self._lines.clear()
            text = self._lines[item] = self._history_line(item)
        return text

    def round_line(self, round_index: int) -> str:
        return f"Round {round_index + 1} of {self._rounds}."

    def render(
        self, persona: str | None, history: Sequence[Hashable], round_index: int
    ) -> Prompt:
        """One agent's prompt for ``round_index`` (0-based)."""
        return self._render(persona, history, self.round_line(round_index))

    def _render(self, persona: str | None, history: Sequence[Hashable], line: str) -> Prompt:
        about = f"About you: {persona.strip()}\n\n" if persona and not persona.isspace() else ""
        if self._split_history is not None and history:
            told, own = self._split_history(history)
            tail = f"{about}{told}\n\n{line}\n{own}"
        else:
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
        histories: Sequence[Sequence[Hashable]] | None,
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
        return [render(p, h, line) for p, h in zip(personas, histories, strict=True)]
