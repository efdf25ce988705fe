"""What an answer is, for one game: a number in ``[low, high]``, and everything that follows
from that (the output constraints the back-ends send, the language shared answers walk,
the parse of model text).

Both games answer with one number, so one description serves both; a game says which
range, whether its prompt asks for chain of thought, and whether only whole numbers count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from simpipe.games.answer_format import (
    ANSWER_MARKER,
    IntegerAnswers,
    number_grammar,
    number_json_schema,
    number_lark,
    number_regex,
)
from simpipe.games.parsing import parse_many


@dataclass(frozen=True)
class NumberAnswer:
    """A number in ``[low, high]``; with ``integer`` a fractional number is ``out_of_range``
    (only an unconstrained back-end can produce one: the grammar admits integers only)."""

    low: float
    high: float
    cot: bool = False
    integer: bool = False
    marker: str = ANSWER_MARKER

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.low, self.high)

    def bin_edges(self, max_bins: int) -> np.ndarray:
        """Histogram bins over the range: one per whole number for integer answers whose
        range spans at most ``max_bins`` (0..20 in 20: 21 bins), else ``max_bins`` equal bins."""
        if self.integer and self.high - self.low <= max_bins:
            return np.arange(self.low - 0.5, self.high + 1.0, 1.0)
        return np.linspace(self.low, self.high, max_bins + 1)

    def grammar(self) -> str:
        """GBNF for llama.cpp."""
        return number_grammar(self.low, self.high, self.cot, marker=self.marker)

    def regex(self) -> str:
        """A look-ahead free regex (TGI, vLLM)."""
        return number_regex(self.low, self.high, self.cot, marker=self.marker)

    def lark(self) -> str | None:
        """The basic answer as an llguidance grammar (embedded llama.cpp); None for chain of
        thought, which keeps its GBNF grammar (free reasoning rarely meets a rejection)."""
        if self.cot:
            return None
        return number_lark(self.low, self.high)

    def json_schema(self) -> dict | None:
        """``{"number": ...}``; None for chain of thought (the reasoning is free text)."""
        if self.cot:
            return None
        return number_json_schema(self.low, self.high, integer=self.integer)

    def ends(self) -> tuple[str, ...]:
        """The basic answers no answer extends (``IntegerAnswers.ends``); none for chain of
        thought, whose reasoning may hold any of them."""
        return () if self.cot else self.language().ends()

    def language(self) -> IntegerAnswers:
        """The basic answers as a prefix language (shared answer distributions)."""
        return IntegerAnswers(self.low, self.high)

    def parse_many(self, texts: Iterable[object],
                   cut: Iterable[bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(values float64, NaN where invalid; statuses)``, see ``simpipe.games.parsing``;
        ``cut``: per text, whether the back-end stopped it at its token limit."""
        values, statuses = parse_many(texts, self.low, self.high, self.cot, self.marker, cut)
        if self.integer:
            fractional = (statuses == "ok") & (values != np.round(values))
            values[fractional] = np.nan
            statuses[fractional] = "out_of_range"
        return values, statuses
