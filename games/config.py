"""``[game]``: one table per game, chosen by ``kind``, validated once.

Every game has ``rounds``, ``group_size`` and ``prompt``; the other keys are its own. The
section is a pydantic union discriminated on ``kind`` (``"beauty_contest"`` when the table
does not say), so a key of another game's table is refused with a line naming the game it
belongs to, and errors name keys as the user wrote them (``game.ratio``, never the union
member pydantic validated against).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    FiniteFloat,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    Tag,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

# Guesses, targets and the agents' noise are computed in float64; a range this wide keeps
# every difference (high - low, guess - equilibrium) finite, and no game needs more.
VALUE_LIMIT = 1e9
# Contributions are whole points; the answer grammar spells every integer up to the
# endowment, so a typo such as 2e9 would build a grammar nobody needs.
ENDOWMENT_LIMIT = 1_000_000
DEFAULT_KIND = "beauty_contest"
# The beauty contest's prompt settings added after runs were made, with the value that gives
# those runs' prompts: left out of the dump at that value, so such a run keeps its hash and
# resumes with it, and put back when its table is read (``stored_table``).
EARLIER_PROMPTS: dict[str, Any] = {"rational_players": False, "predict_others": False,
                                   "history_layout": "by_round"}


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


class GameSettings(BaseModel):
    """Every game's table has ``rounds``, ``group_size`` and ``prompt``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    rounds: StrictInt = Field(3, ge=1, description="rounds played")
    group_size: StrictInt = Field(0, ge=0, description=(
        "`0`: everyone plays one game; `n`: seeded groups of `n` (the remainder is spread, "
        "nobody dropped)"))
    prompt: Literal["basic", "cot"] = Field("basic", description=(
        "`basic`: answer with the number; `cot`: think step by step, then the number after "
        "`Final answer:`"))

    @property
    def free_text_answer(self) -> bool:
        """Whether the answer is free text ending in ``Final answer:`` and the number (the
        answer grammar, the token budget and shared answers follow it), not the bare number."""
        return self.prompt == "cot"


class BeautyContestConfig(GameSettings):
    """The p-beauty contest: target = offset + ratio * mean, clipped to [low, high]; its
    equilibrium and scripted players: [games](games.md)."""

    kind: Literal["beauty_contest"] = "beauty_contest"
    ratio: str = Field("2/3", description=(
        "a fraction string (`\"2/3\"`, `\"51/100\"`) or a number (`0.5`); > 0"))
    offset: FiniteFloat = Field(0.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT, description=(
        "target = `offset + ratio * mean`, clipped to `[low, high]`"))
    low: FiniteFloat = Field(0.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT, description=(
        "the lowest allowed guess; below `high`"))
    high: FiniteFloat = Field(100.0, ge=-VALUE_LIMIT, le=VALUE_LIMIT, description=(
        "the highest allowed guess"))
    disclose_variant: StrictBool = Field(False, description=(
        "tell the agents the game is a variant of \"guess 2/3 of the average\""))
    rational_players: bool = Field(False, description=(
        "tell the agents that every player is rational"))
    predict_others: bool = Field(False, description=(
        "ask the agents to predict the average of the other players' numbers before giving "
        "their own; the answer then ends in `Final answer:` and the number, as with `cot`"))
    history_layout: Literal["split", "by_round"] = Field("split", description=(
        "how a prompt shows earlier rounds. `split`: the announced winning numbers, then "
        "the round line, then the agent's own numbers last (what agents share comes first, "
        "so a distinct prompt costs only its last line: [shared answers](shared-answers.md)); "
        "`by_round`: one line per round with both (\"Round 1: you chose 50; the winning "
        "number was 33.3.\"), the earlier default"))

    @property
    def free_text_answer(self) -> bool:
        return self.prompt == "cot" or self.predict_others

    @model_serializer(mode="wrap")
    def _without_unset_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # run.json and the results hash are made of the dump: leaving out the prompt settings
        # at the value runs had before the setting existed keeps those runs' hashes.
        data = handler(self)
        for key, earlier in EARLIER_PROMPTS.items():
            if getattr(self, key) == earlier:
                data.pop(key, None)
        return data

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
    def _range(self) -> BeautyContestConfig:
        if self.low >= self.high:
            raise ValueError(f"game.low ({self.low:g}) must be below game.high ({self.high:g})")
        return self

    @property
    def ratio_value(self) -> float:
        return float(parse_ratio(self.ratio))


class PublicGoodsConfig(GameSettings):
    """The linear public goods game: each member of a group of ``group_size`` contributes
    0..endowment points; payoff = endowment - own contribution + mpcr * group total."""

    kind: Literal["public_goods"] = "public_goods"
    rounds: StrictInt = Field(10, ge=1, description="rounds played, in the same groups")
    group_size: StrictInt = Field(4, ge=2, description=(
        "fixed groups of exactly this size: `population.size` must be a multiple of it"))
    endowment: StrictInt = Field(20, ge=1, le=ENDOWMENT_LIMIT, description=(
        "points each member receives every round; a contribution is a whole number from 0 "
        "to it"))
    # Below 1: keeping a point always pays more than contributing it (the dilemma).
    mpcr: FiniteFloat = Field(0.4, gt=0, lt=1, description=(
        "marginal per-capita return: payoff = endowment - contribution + mpcr * the group's "
        "total"))


# One entry per game: its ``kind`` and its table.
GAME_CONFIGS: dict[str, type[GameSettings]] = {
    "beauty_contest": BeautyContestConfig,
    "public_goods": PublicGoodsConfig,
}
AnyGameConfig = BeautyContestConfig | PublicGoodsConfig


def _kind_of(value: Any) -> str | None:
    if isinstance(value, Mapping):
        kind = value.get("kind", DEFAULT_KIND)
        return kind if isinstance(kind, str) else None
    return getattr(value, "kind", None)


def _kinds() -> str:
    return ", ".join(repr(k) for k in GAME_CONFIGS)


def _table_problems(value: Mapping) -> list[dict[str, Any]]:
    """Line errors for an unknown ``kind`` and for keys that are not this game's."""
    kind = value.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in GAME_CONFIGS:
        return [{"type": PydanticCustomError("unknown_game", f"no such game; allowed: {_kinds()}"),
                 "loc": ("kind",), "input": kind}]
    fields = GAME_CONFIGS[kind].model_fields
    problems = []
    for key in value:
        if key in fields:
            continue
        owners = [k for k, cls in GAME_CONFIGS.items() if key in cls.model_fields]
        whose = (f"a key of kind = {' / '.join(map(repr, owners))}, not of kind = {kind!r}"
                 if owners else f"no such key for kind = {kind!r}")
        message = f"{whose}; allowed here: {', '.join(fields)}"
        problems.append({"type": PydanticCustomError("unknown_game_key", message),
                         "loc": (str(key),), "input": value[key]})
    return problems


def _untagged(exc: ValidationError) -> list[dict[str, Any]]:
    """The errors as line errors without the union member's tag in their locations."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        if loc and loc[0] in GAME_CONFIGS:
            loc = loc[1:]
        lines.append({"type": PydanticCustomError(err["type"], err["msg"]), "loc": loc,
                      "input": err.get("input")})
    return lines


def _one_game_table(value: Any, handler: Callable[[Any], Any]) -> Any:
    if isinstance(value, GameSettings):
        return handler(value)
    if not isinstance(value, Mapping):
        raise ValidationError.from_exception_data("game", [{
            "type": PydanticCustomError(
                "game_table", f"a table is expected, e.g. [game] with kind = one of {_kinds()}"),
            "loc": (), "input": value}])
    problems = _table_problems(value)
    if problems and problems[0]["loc"] == ("kind",):
        raise ValidationError.from_exception_data("game", problems)
    known = GAME_CONFIGS[value.get("kind", DEFAULT_KIND)].model_fields
    try:
        # Unknown keys are reported above; the rest is checked all the same.
        game = handler({k: v for k, v in value.items() if k in known})
    except ValidationError as exc:
        problems += _untagged(exc)
    if problems:
        raise ValidationError.from_exception_data("game", problems)
    return game


# The ``[game]`` section: one of the games' tables, chosen by ``kind``.
GameConfig = Annotated[
    Annotated[BeautyContestConfig, Tag("beauty_contest")]
    | Annotated[PublicGoodsConfig, Tag("public_goods")],
    Discriminator(_kind_of),
    WrapValidator(_one_game_table),
]
_GAME_ADAPTER: TypeAdapter[AnyGameConfig] = TypeAdapter(GameConfig)


def stored_table(raw: Any) -> Any:
    """A ``[game]`` table from a run's ``run.json`` with the ``EARLIER_PROMPTS`` it leaves
    out put back (the dump drops them at those values), so it reads back as it was run."""
    if not isinstance(raw, Mapping) or raw.get("kind", DEFAULT_KIND) != DEFAULT_KIND:
        return raw
    return {**EARLIER_PROMPTS, **raw}


def game_config(raw: Any) -> AnyGameConfig:
    """A ``[game]`` table (e.g. from a run's ``run.json``) as its game's config;
    pydantic's ValidationError (a ValueError) when it is not one."""
    return _GAME_ADAPTER.validate_python(raw)
