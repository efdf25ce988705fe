"""``[game]``: the rules of a p-beauty contest, validated once."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictInt,
    field_validator,
    model_validator,
)

# Guesses, targets and the agents' noise are computed in float64; a range this wide keeps
# every difference (high - low, guess - equilibrium) finite, and no game needs more.
VALUE_LIMIT = 1e9


def parse_ratio(value: object) -> Fraction:
    """``"2/3"``, ``"0.5"``, ``0.51`` or ``2`` to an exact fraction; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a fraction string such as \"2/3\" or a number is allowed")
    if isinstance(value, int | float):
        return Fraction(str(value))
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            pass
    raise ValueError("a fraction string such as \"2/3\" or a number is allowed")


class GameConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["beauty_contest"] = "beauty_contest"
    ratio: str = "2/3"
    offset: FiniteFloat = Field(0.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT)
    low: FiniteFloat = Field(0.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT)
    high: FiniteFloat = Field(100.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT)
    rounds: StrictInt = Field(3, ge=1)
    group_size: StrictInt = Field(0, ge=0)
    prompt: Literal["basic", "cot"] = "basic"
    disclose_variant: bool = False

    @field_validator("ratio", mode="before")
    @classmethod
    def _ratio_text(cls, value: object) -> str:
        parse_ratio(value)
        if isinstance(value, float | int):
            return str(value)
        return str(value).strip()

    @field_validator("ratio")
    @classmethod
    def _ratio_positive(cls, value: str) -> str:
        ratio = parse_ratio(value)
        # An exact fraction can be beyond float range ("1e400") or round to 0 ("1e-400").
        try:
            as_float = float(ratio)
        except OverflowError:
            as_float = math.inf
        if not 0 < as_float < math.inf:
            raise ValueError("the ratio must be a finite number > 0 (as a float64)")
        return value

    @model_validator(mode="after")
    def _range(self) -> "GameConfig":
        if self.low >= self.high:
            raise ValueError(f"game.low ({self.low:g}) must be below game.high ({self.high:g})")
        return self

    @property
    def ratio_value(self) -> float:
        return float(parse_ratio(self.ratio))
