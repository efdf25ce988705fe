"""Mixed populations, the config's part: who answers for an agent chosen by one of its
attributes.

``[agents.by.<attribute>.<value>]`` tables override ``[agents]`` for the agents whose
attribute has that value (``[agents.by.model.scripted] backend = "scripted"``,
``[agents.by.model.gemma] backend = "llamacpp"``): scripted and LLM agents in one game, or
two LLM configurations in one run. The attribute is sampled with shares like any other,
so the mix follows its weights exactly.

An override is merged into ``[agents]``: its top-level keys replace those of ``[agents]``,
and a back-end table (``llamacpp = { n_parallel = 4 }``) is merged key by key into the one
of ``[agents]``, so endpoints that servers started for the run put into ``[agents]`` reach
every group of that back-end that does not name its own.

This module resolves and checks the mix (the config's validators call it; it imports
nothing of the config, whose ``AgentsConfig`` it gets as ``type(agents)``);
``simpipe.agents.mix`` plays a partition by it and counts each value's answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from simpipe.config.keys import joined_key
from simpipe.personas.config import PopulationConfig, attribute_labels

#: ``simpipe.config.model.AgentsConfig`` (not imported: the config imports this module)
AgentsConfig = Any

BY = "by"


@dataclass(frozen=True)
class Group:
    """One value of the mix attribute and the agents config its agents get."""

    value: str | None  # None: no mix, every agent
    agents: AgentsConfig


def mix_attribute(agents: AgentsConfig) -> str | None:
    """The attribute that chooses each agent's back-end, or None (one for all)."""
    return next(iter(agents.by), None)


def merged_table(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``[agents]`` (as a dict, without ``by``) with one value's override applied: top-level
    keys replaced, back-end tables (dicts) merged key by key."""
    merged = {k: v for k, v in base.items() if k != BY}
    for key, value in override.items():
        inner = merged.get(key)
        merged[key] = ({**inner, **value} if isinstance(inner, dict) and isinstance(value, dict)
                       else value)
    return merged


_resolved: dict[str, AgentsConfig] = {}


def resolve(agents: AgentsConfig, value: str) -> AgentsConfig:
    """The agents config of the agents whose mix attribute is ``value`` (validated; cached,
    since every partition of every round asks)."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return agents
    key = f"{agents.model_dump_json()}|{value}"
    found = _resolved.get(key)
    if found is None:
        base = agents.model_dump(mode="json", exclude={BY})
        found = type(agents).model_validate(merged_table(base, agents.by[attribute][value]))
        _resolved[key] = found
    return found


def groups(agents: AgentsConfig) -> list[Group]:
    """Every value's agents config in the config's order; one group (value None) without
    a mix."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return [Group(None, agents)]
    return [Group(value, resolve(agents, value)) for value in agents.by[attribute]]


def llm_groups(agents: AgentsConfig) -> list[Group]:
    """The groups answered by an LLM."""
    return [g for g in groups(agents) if g.agents.plugin.is_llm]


def uses_llm(agents: AgentsConfig) -> bool:
    """Whether any agent of the run is answered by an LLM (engines to close, plans to say)."""
    return bool(llm_groups(agents))


# --- checks (the config's validators call these) -------------------------------------------


def check_shape(agents: AgentsConfig) -> None:
    """ValueError naming the key: one attribute, a table per value, each override valid
    as ``[agents]`` is. The population's part is ``check_population``."""
    if not agents.by:
        return
    if len(agents.by) > 1:
        raise ValueError(f"agents.{BY}: {len(agents.by)} attributes ({', '.join(agents.by)}); one "
                         "attribute chooses the back-end: combine them into one attribute")
    attribute, tables = next(iter(agents.by.items()))
    if not tables:
        raise ValueError(f"agents.{BY}.{attribute}: no values; give one table per value of "
                         f"{attribute}, e.g. [agents.{BY}.{attribute}.<value>] "
                         'backend = "scripted"')
    base = agents.model_dump(mode="json", exclude={BY})
    for value, override in tables.items():
        where = joined_key("agents", BY, attribute, value)
        if BY in override:
            raise ValueError(f"{where}.{BY}: a mix inside a mix; one attribute chooses")
        try:
            type(agents).model_validate(merged_table(base, override))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            key = ".".join([where, *map(str, err["loc"])])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = (f"unknown key; an override takes the keys of [agents]: "
                       f"{', '.join(k for k in type(agents).model_fields if k != BY)}")
            elif "input" in err and not isinstance(err["input"], dict):
                key += f" = {err['input']!r}"
            raise ValueError(f"{key}: {msg}") from None


def check_answer_room(agents: AgentsConfig, longest: str) -> None:
    """ValueError naming the key when an LLM group's ``max_tokens`` cannot hold the game's
    longest basic answer (``longest``, e.g. " 100"). A tokenizer may spend a token on each
    character (Gemma 3 does on digits), and an answer cut there parses as a shorter number
    (" 4" for " 42"): a sampled call's cut is flagged "truncated", but an answer drawn from
    a shared distribution ends at the limit like a finished one, so the bias would be
    silent."""
    attribute = mix_attribute(agents)
    for group in llm_groups(agents):
        if group.agents.max_tokens >= len(longest):
            continue
        override = agents.by[attribute][group.value] if attribute is not None else {}
        key = (joined_key("agents", BY, attribute, group.value, "max_tokens")
               if "max_tokens" in override else "agents.max_tokens")
        raise ValueError(
            f"{key} = {group.agents.max_tokens} is below the {len(longest)} characters of "
            f"this game's longest answer, {longest!r}: a model may spend a token on each, and "
            "an answer cut at the limit reads as a shorter number; set it to "
            f"{len(longest)} or more (answers still end at their last digit)")


def check_population(agents: AgentsConfig, population: PopulationConfig) -> None:
    """ValueError naming the key when the mix does not fit ``[population]``: the attribute
    exists, is categorical, and every one of its labels has a table and no other does."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return
    where = f"agents.{BY}.{attribute}"
    attrs = population.attributes
    if attribute not in attrs:
        shares = ", ".join(f'"{v}" = 1' for v in agents.by[attribute])
        raise ValueError(f"{where}: population.attributes has no {attribute!r} (it has "
                         f"{', '.join(attrs) or 'none'}); add [population.attributes."
                         f"{attribute}] with values = {{ {shares} }}")
    labels = attribute_labels(attrs[attribute])
    if labels is None:
        raise ValueError(f"{where}: {attribute!r} is a number; the back-end is chosen by a "
                         "categorical attribute (one with `values` or `values_given`)")
    mapped = list(agents.by[attribute])
    unknown = [v for v in mapped if v not in labels]
    if unknown:
        raise ValueError(f"{where}: {unknown} are not values of {attribute}; its values: "
                         f"{labels}")
    missing = [v for v in labels if v not in mapped]
    if missing:
        raise ValueError(f"{where}: no table for {attribute} = {missing}; every value needs "
                         f"one: add [agents.{BY}.{attribute}.<value>] for each")
    for value in mapped:
        resolved = resolve(agents, value)
        check = resolved.plugin.population_check
        if check is not None:
            try:
                check(resolved.settings, population)
            except ValueError as exc:
                raise ValueError(f"{where}.{value}: {exc}") from None


def hash_view(agents_dump: dict[str, Any], endpoint_backends: tuple[str, ...],
              dropped: Iterable[str]) -> None:
    """Drop the ``dropped`` keys (the endpoints, ...) of every override's server tables from
    a dumped ``[agents]`` (in place): servers may move between a run and its ``--resume``, as
    for ``[agents]`` itself. Without a mix, ``by`` goes too: the hash of a config without one
    is what it was before mixes."""
    if not agents_dump.get(BY):
        agents_dump.pop(BY, None)
        return
    for tables in (agents_dump.get(BY) or {}).values():
        for override in tables.values():
            for name in endpoint_backends:
                if isinstance(override.get(name), dict):
                    for key in dropped:
                        override[name].pop(key, None)
                    if not override[name]:
                        del override[name]  # a table that named only its servers


def backend_summary(agents: AgentsConfig) -> str:
    """``llamacpp``, or a mix's ``by model: scripted=scripted, gemma=llamacpp``."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return agents.backend
    return f"by {attribute}: " + ", ".join(f"{g.value}={g.agents.backend}"
                                            for g in groups(agents))


def stored_table(agents: Mapping[str, Any], value: str) -> dict[str, Any]:
    """A stored run's ``[agents]`` (run.json) for the agents of ``value``, unvalidated (a
    run of an older version may lack keys)."""
    tables = next(iter((agents.get(BY) or {}).values()), {})
    return merged_table(agents, tables.get(value) or {})
