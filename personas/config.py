"""``[population]``: how many agents, how they are split, and their attributes."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CategoricalAttribute(_Section):
    """``values = { label = weight, ... }``; weights are normalised."""

    values: dict[str, float]

    @field_validator("values")
    @classmethod
    def _weights(cls, values: dict[str, float]) -> dict[str, float]:
        if not values:
            raise ValueError("needs at least one label, e.g. values = { \"a\" = 1.0 }")
        bad = {k: w for k, w in values.items() if not (w >= 0 and math.isfinite(w))}
        if bad:
            raise ValueError(f"weights must be finite and >= 0, got {bad}")
        if sum(values.values()) <= 0:
            raise ValueError("weights must not all be zero")
        return values


class IntegerAttribute(_Section):
    """``min``/``max``: uniform integers, both ends included."""

    min: int
    max: int

    @model_validator(mode="after")
    def _order(self) -> "IntegerAttribute":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


Attribute = CategoricalAttribute | IntegerAttribute


class PopulationConfig(_Section):
    size: int = Field(1000, ge=1)
    partitions: int | None = Field(None, ge=1)
    partition_size: int | None = Field(None, ge=1)
    sampling: Literal["exact", "random"] = "exact"
    attributes: dict[str, Attribute] = Field(default_factory=dict)

    @field_validator("attributes", mode="before")
    @classmethod
    def _attribute_kind(cls, raw: object) -> object:
        # Pick the attribute kind from its keys so errors name the right fields.
        if not isinstance(raw, dict):
            return raw
        out = {}
        for name, spec in raw.items():
            if isinstance(spec, dict) and "values" in spec:
                kind: type[BaseModel] = CategoricalAttribute
            elif isinstance(spec, dict) and ("min" in spec or "max" in spec):
                kind = IntegerAttribute
            else:
                raise ValueError(
                    f"attribute {name!r} needs `values = {{label = weight}}` or `min`/`max`"
                )
            try:
                out[name] = kind.model_validate(spec)
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                key = ".".join([name, *map(str, err["loc"])])
                raise ValueError(f"{key}: {err['msg'].removeprefix('Value error, ')}") from None
        return out

    @field_validator("attributes")
    @classmethod
    def _reserved(cls, attrs: dict[str, Attribute]) -> dict[str, Attribute]:
        reserved = {"agent_id", "persona", "group_id", "round", "guess", "status"}
        clash = sorted(reserved & set(attrs))
        if clash:
            raise ValueError(f"attribute names {clash} are reserved column names")
        return attrs

    @model_validator(mode="after")
    def _one_split(self) -> "PopulationConfig":
        if self.partitions is not None and self.partition_size is not None:
            raise ValueError("set population.partitions or population.partition_size, not both")
        return self

    @property
    def n_partitions(self) -> int:
        if self.partition_size is not None:
            return max(1, math.ceil(self.size / self.partition_size))
        return min(self.partitions or 8, self.size)
