"""``[population]``: how many agents, how they are split, their attributes and personas."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from simpipe.personas.templates import default_template, template_fields

DEFAULT_ROW = "default"  # the `values_given` row for parent labels without their own row
RESERVED_COLUMNS = frozenset(
    {"agent_id", "persona", "persona_source", "group_id", "round", "guess", "status"}
)
# Exact sampling splits label counts over partitions with numpy's multivariate
# hypergeometric draw, which needs a total below 10**9 (group ids are int32 as well).
MAX_POPULATION = 10**9 - 1
# A partition is one task's working set: 180-210 bytes per scripted agent and round
# (measured on one partition of 1 and 2 million agents); LLM agents add their prompt texts.
MAX_PARTITION_AGENTS = 2_000_000
# Every population task computes the whole (partitions x labels) split: 0.08 s per
# attribute at 10,000 partitions, so the total grows with the square of this.
MAX_PARTITIONS = 10_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_weights(values: dict[str, float]) -> dict[str, float]:
    if not values:
        raise ValueError("needs at least one label, e.g. values = { \"a\" = 1.0 }")
    bad = {k: w for k, w in values.items() if not (w >= 0 and math.isfinite(w))}
    if bad:
        raise ValueError(f"weights must be finite and >= 0, got {bad}")
    if sum(values.values()) <= 0:
        raise ValueError("weights must not all be zero")
    return values


class CategoricalAttribute(_Section):
    """``values = { label = weight, ... }``; weights are normalised."""

    values: dict[str, float] = Field(description=(
        "`{ label = weight, ... }`: the labels and their weights (finite, >= 0, not all 0; "
        "normalised)"))

    @field_validator("values")
    @classmethod
    def _weights(cls, values: dict[str, float]) -> dict[str, float]:
        return _check_weights(values)

    @property
    def labels(self) -> list[str]:
        return list(self.values)


class IntegerAttribute(_Section):
    """``min``/``max``: integers, both ends included; uniform, or a rounded normal
    (``distribution = "normal"``, ``mean``, ``sd``) clipped to ``[min, max]``."""

    # max + 1 is the exclusive bound of numpy's int64 draw.
    min: StrictInt = Field(ge=INT64_MIN, le=INT64_MAX - 1,
                           description="the smallest value, included")
    max: StrictInt = Field(ge=INT64_MIN, le=INT64_MAX - 1,
                           description="the largest value, included; >= `min`")
    distribution: Literal["uniform", "normal"] = Field("uniform", description=(
        "`uniform`: every integer in `[min, max]` equally likely; `normal`: a normal draw "
        "(`mean`, `sd`) rounded and clipped to `[min, max]`"))
    mean: FiniteFloat | None = Field(None, description=(
        "the normal's mean, within `[min, max]`; only with `distribution = \"normal\"`"))
    sd: FiniteFloat | None = Field(None, gt=0, description=(
        "the normal's standard deviation; only with `distribution = \"normal\"`"))

    @model_validator(mode="after")
    def _order(self) -> IntegerAttribute:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if self.distribution == "normal":
            if self.mean is None or self.sd is None:
                raise ValueError('distribution = "normal" needs `mean` and `sd` (> 0)')
            if not self.min <= self.mean <= self.max:
                raise ValueError(f"mean ({self.mean}) must lie in [min, max] = "
                                 f"[{self.min}, {self.max}]")
        elif self.mean is not None or self.sd is not None:
            raise ValueError('`mean`/`sd` need distribution = "normal"')
        return self


class ConditionalAttribute(_Section):
    """A categorical attribute whose weights depend on another attribute's label:
    ``given = "education"`` and ``values_given = { parent label = { label = weight } }``,
    with an optional ``default`` row for parent labels without their own."""

    given: str = Field(description=(
        "the parent attribute (categorical or conditional; chains are allowed, a cycle is "
        "an error naming it)"))
    values_given: dict[str, dict[str, float]] = Field(description=(
        "`{ parent label = { label = weight } }`: every label of the parent needs a row, or "
        "a `default` row covers the others"))

    @field_validator("values_given")
    @classmethod
    def _rows(cls, rows: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        if not rows:
            raise ValueError("needs at least one row, e.g. { \"Ph.D.\" = { \"Economist\" = 1 } }")
        for parent, row in rows.items():
            try:
                _check_weights(row)
            except ValueError as exc:
                raise ValueError(f"row {parent!r}: {exc}") from None
        return rows

    @property
    def labels(self) -> list[str]:
        """Every label of every row, in first-seen order (the column's categories)."""
        seen: dict[str, None] = {}
        for row in self.values_given.values():
            seen.update(dict.fromkeys(row))
        return list(seen)

    def row(self, parent_label: str) -> dict[str, float]:
        return self.values_given.get(parent_label, self.values_given.get(DEFAULT_ROW, {}))


Attribute = CategoricalAttribute | IntegerAttribute | ConditionalAttribute
LabelledAttribute = CategoricalAttribute | ConditionalAttribute


def attribute_labels(spec: Attribute) -> list[str] | None:
    """The labels a categorical (or conditional) attribute can take; None for numbers."""
    return spec.labels if isinstance(spec, LabelledAttribute) else None


class PersonaConfig(_Section):
    """``[population.persona]``: the text each agent's prompt carries about itself."""

    mode: Literal["none", "template", "llm"] = Field("none", description=(
        "`none`: no `persona` column; `template`: rendered from `template`; `llm`: written by "
        "a model from each agent's record (see [personas](populations.md#personas))"))
    template: str | None = Field(None, description=(
        "`str.format` text over attribute names (and `agent_id`), e.g. `\"You are a "
        "{age}-year-old {occupation}.\"`; not set: one naming every attribute. In `llm` mode, "
        "the fallback for an output that fails its checks"))
    # --- "llm" mode: the meta-prompt and how its output is checked ---
    max_tokens: StrictInt = Field(120, ge=8, le=4096,
                                  description="`llm` mode: new tokens per persona")
    temperature: FiniteFloat = Field(0.8, ge=0,
                                     description="`llm` mode: sampling temperature")
    top_p: FiniteFloat = Field(0.95, gt=0, le=1, description="`llm` mode: nucleus sampling")
    retries: StrictInt = Field(2, ge=0, le=10, description=(
        "`llm` mode: extra attempts (new seeds) for an output that fails the checks, before "
        "the template fallback"))
    min_chars: StrictInt = Field(40, ge=1, description=(
        "`llm` mode: the shortest description accepted (characters)"))
    max_chars: StrictInt = Field(600, ge=1, description=(
        "`llm` mode: the longest description accepted (characters); >= `min_chars`"))
    age_attribute: str | None = Field(None, description=(
        "`llm` mode: the attribute a stated age is checked against; not set: `age` if it "
        "exists"))
    gender_attribute: str | None = Field(None, description=(
        "`llm` mode: the attribute the output's gender words are checked against; not set: "
        "`gender` if it exists"))
    agents: dict[str, Any] = Field(default_factory=dict, description=(
        "`llm` mode: which back-end writes the personas: `backend` (`llamacpp`, `tgi`, "
        "`openai`) and its `llamacpp` / `tgi` / `openai` table, as under `[agents]`; empty: "
        "the embedded llama.cpp with its default model. Sampling is set by the keys above"))

    @model_validator(mode="after")
    def _bounds(self) -> PersonaConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be <= max_chars "
                             f"({self.max_chars})")
        return self


class PopulationConfig(_Section):
    size: StrictInt = Field(1000, ge=1, le=MAX_POPULATION, description=(
        "number of agents. Below 10^9: exact sampling splits counts with numpy's "
        "hypergeometric draw, which needs that. At most 2,000,000 agents per partition (a "
        "partition is one task's working set: 180-210 bytes per scripted agent and round, "
        "measured on one partition of 1 and 2 million; LLM agents add their prompt texts). The "
        "client holds the group of every agent (4 bytes each; 4 GB at the bound, about 20 "
        "bytes each while `group_size > 0` is assigned)"))
    partitions: StrictInt | None = Field(None, ge=1, le=MAX_PARTITIONS, description=(
        "number of Parquet partitions, the unit of work of a Dask task; not set: 8 (or "
        "`size`, if smaller)"))
    partition_size: StrictInt | None = Field(None, ge=1, le=MAX_PARTITION_AGENTS, description=(
        "instead of `partitions`: agents per partition (not both)"))
    sampling: Literal["exact", "random"] = Field("exact", description=(
        "`exact`: label counts follow the weights exactly (largest remainder, per parent label "
        "for conditionals, over all partitions), then a seeded shuffle; `random`: i.i.d. "
        "draws"))
    attributes: dict[str, Attribute] = Field(default_factory=dict, description=(
        "one table per attribute, `[population.attributes.<name>]`; its keys say its kind. "
        "Each becomes a column of the population; these names are reserved for other "
        "columns: " + ", ".join(f"`{c}`" for c in sorted(RESERVED_COLUMNS))))
    persona: PersonaConfig = PersonaConfig()

    @field_validator("attributes", mode="before")
    @classmethod
    def _attribute_kind(cls, raw: object) -> object:
        # Pick the attribute kind from its keys so errors name the right fields.
        if not isinstance(raw, dict):
            return raw
        out = {}
        for name, spec in raw.items():
            if isinstance(spec, BaseModel):
                out[name] = spec
                continue
            if isinstance(spec, dict) and ("given" in spec or "values_given" in spec):
                kind: type[BaseModel] = ConditionalAttribute
            elif isinstance(spec, dict) and "values" in spec:
                kind = CategoricalAttribute
            elif isinstance(spec, dict) and ("min" in spec or "max" in spec):
                kind = IntegerAttribute
            else:
                raise ValueError(
                    f"attribute {name!r} needs `values = {{label = weight}}`, `min`/`max`, "
                    "or `given` + `values_given`"
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
        clash = sorted(RESERVED_COLUMNS & set(attrs))
        if clash:
            raise ValueError(f"attribute names {clash} are reserved column names")
        return attrs

    @field_validator("attributes")
    @classmethod
    def _dependencies(cls, attrs: dict[str, Attribute]) -> dict[str, Attribute]:
        for name, spec in attrs.items():
            if not isinstance(spec, ConditionalAttribute):
                continue
            parent = attrs.get(spec.given)
            if parent is None:
                raise ValueError(f"{name}.given = {spec.given!r}: no such attribute; "
                                 f"allowed: {sorted(set(attrs) - {name}) or 'none'}")
            parent_labels = attribute_labels(parent)
            if parent_labels is None:
                raise ValueError(f"{name}.given = {spec.given!r}: must name a categorical "
                                 "attribute (one with `values` or `values_given`)")
            unknown = sorted(set(spec.values_given) - set(parent_labels) - {DEFAULT_ROW})
            if unknown:
                raise ValueError(f"{name}.values_given: rows {unknown} are not labels of "
                                 f"{spec.given!r}; allowed: {parent_labels + [DEFAULT_ROW]}")
            if DEFAULT_ROW not in spec.values_given:
                missing = [p for p in parent_labels if p not in spec.values_given]
                if missing:
                    raise ValueError(f"{name}.values_given: no row for {spec.given} = "
                                     f"{missing}; add them or a `{DEFAULT_ROW}` row")
        sampling_order(attrs)  # raises on a cycle
        return attrs

    @model_validator(mode="after")
    def _one_split(self) -> PopulationConfig:
        if self.partitions is not None and self.partition_size is not None:
            raise ValueError("set population.partitions or population.partition_size, not both")
        return self

    @model_validator(mode="after")
    def _partition_limits(self) -> PopulationConfig:
        n = self.n_partitions
        if n > MAX_PARTITIONS:
            raise ValueError(f"population.partition_size = {self.partition_size:,} makes {n:,} "
                             f"partitions of {self.size:,} agents; at most {MAX_PARTITIONS:,}: "
                             "raise population.partition_size")
        per_partition = math.ceil(self.size / n)
        if per_partition > MAX_PARTITION_AGENTS:
            need = math.ceil(self.size / MAX_PARTITION_AGENTS)
            raise ValueError(f"population.size = {self.size:,} in {n:,} partitions is "
                             f"{per_partition:,} agents per partition; at most "
                             f"{MAX_PARTITION_AGENTS:,}: set population.partitions >= {need:,} "
                             f"or population.partition_size <= {MAX_PARTITION_AGENTS:,}")
        return self

    @model_validator(mode="after")
    def _persona_names(self) -> PopulationConfig:
        persona = self.persona
        allowed = ["agent_id", *self.attributes]
        if persona.template is not None:
            try:
                fields = template_fields(persona.template)
            except ValueError as exc:
                raise ValueError(f"population.persona.template: {exc}") from None
            unknown = [f for f in fields if f not in allowed]
            if unknown:
                raise ValueError(f"population.persona.template: placeholders {unknown} name no "
                                 f"attribute; allowed: {allowed}")
        for key in ("age_attribute", "gender_attribute"):
            name = getattr(persona, key)
            if name is not None and name not in self.attributes:
                raise ValueError(f"population.persona.{key} = {name!r}: no such attribute; "
                                 f"allowed: {sorted(self.attributes) or 'none'}")
        return self

    @property
    def n_partitions(self) -> int:
        if self.partition_size is not None:
            return max(1, math.ceil(self.size / self.partition_size))
        return min(self.partitions or 8, self.size)

    @property
    def persona_template(self) -> str:
        """The template in use: the configured one, else one naming every attribute."""
        return self.persona.template or default_template(list(self.attributes))

    @property
    def attributes_in_prompt(self) -> list[str]:
        """The attributes an agent's prompt mentions (through its persona), config order.

        ``none``: no persona, so none; ``template``: those the template names; ``llm``: all,
        since each agent's whole record goes into the meta-prompt its persona is written from.
        """
        if self.persona.mode == "none":
            return []
        if self.persona.mode == "llm":
            return list(self.attributes)
        named = set(template_fields(self.persona_template))
        return [a for a in self.attributes if a in named]

    def checked_attribute(self, kind: Literal["age", "gender"]) -> str | None:
        """The attribute LLM personas are checked against for ``kind``, if any."""
        name = getattr(self.persona, f"{kind}_attribute")
        if name is not None:
            return name
        return kind if kind in self.attributes else None


def sampling_order(attrs: dict[str, Attribute]) -> list[str]:
    """Attribute names with every parent before its children (config order otherwise).

    Raises ValueError naming the cycle when the ``given`` links loop.
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: placed

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise ValueError(f"attributes depend on each other in a cycle: "
                             f"{' -> '.join(cycle)} (via `given`)")
        state[name] = 1
        spec = attrs[name]
        if isinstance(spec, ConditionalAttribute) and spec.given in attrs:
            visit(spec.given, [*path, name])
        state[name] = 2
        order.append(name)

    for name in attrs:
        visit(name, [])
    return order
