"""Mixed populations: who answers for an agent chosen by one of its attributes.

``[agents.by.<attribute>.<value>]`` tables override ``[agents]`` for the agents whose
attribute has that value (``[agents.by.model.scripted] backend = "scripted"``,
``[agents.by.model.gemma] backend = "llamacpp"``): scripted and LLM agents in one game, or
two LLM configurations in one run. The attribute is sampled with shares like any other,
so the mix follows its weights exactly.

An override is merged into ``[agents]``: its top-level keys replace those of ``[agents]``,
and a back-end table (``llamacpp = { n_parallel = 4 }``) is merged key by key into the one
of ``[agents]``, so endpoints that servers started for the run put into ``[agents]`` reach
every group of that back-end that does not name its own.

This module resolves and checks the mix (the config calls it), splits a partition by it
(the round task), and counts each value's answers (the round record and its line).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # the config imports this module inside its validators
    from simpipe.agents.base import Decisions, Turn
    from simpipe.config import AgentsConfig
    from simpipe.personas.config import PopulationConfig

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
    from simpipe.config import AgentsConfig  # see TYPE_CHECKING

    attribute = mix_attribute(agents)
    if attribute is None:
        return agents
    key = f"{agents.model_dump_json()}|{value}"
    found = _resolved.get(key)
    if found is None:
        base = agents.model_dump(mode="json", exclude={BY})
        found = AgentsConfig.model_validate(merged_table(base, agents.by[attribute][value]))
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
    from pydantic import ValidationError

    from simpipe.config import AgentsConfig

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
        where = f"agents.{BY}.{attribute}.{value}"
        if BY in override:
            raise ValueError(f"{where}.{BY}: a mix inside a mix; one attribute chooses")
        try:
            AgentsConfig.model_validate(merged_table(base, override))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            key = ".".join([where, *map(str, err["loc"])])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = (f"unknown key; an override takes the keys of [agents]: "
                       f"{', '.join(k for k in AgentsConfig.model_fields if k != BY)}")
            elif "input" in err and not isinstance(err["input"], dict):
                key += f" = {err['input']!r}"
            raise ValueError(f"{key}: {msg}") from None


def check_population(agents: AgentsConfig, population: PopulationConfig) -> None:
    """ValueError naming the key when the mix does not fit ``[population]``: the attribute
    exists, is categorical, and every one of its labels has a table and no other does."""
    from simpipe.personas.config import attribute_labels

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


def hash_view(agents_dump: dict[str, Any], endpoint_backends: tuple[str, ...]) -> None:
    """Drop the endpoints of every override from a dumped ``[agents]`` (in place): servers
    may move between a run and its ``--resume``, as for ``[agents]`` itself. Without a mix,
    ``by`` goes too: the hash of a config without one is what it was before mixes."""
    if not agents_dump.get(BY):
        agents_dump.pop(BY, None)
        return
    for tables in (agents_dump.get(BY) or {}).values():
        for override in tables.values():
            for name in endpoint_backends:
                if isinstance(override.get(name), dict):
                    override[name].pop("endpoints", None)


# --- playing a partition ---------------------------------------------------------------------


def agent_values(agents: AgentsConfig, frame: pd.DataFrame) -> np.ndarray | None:
    """Each agent's value of the mix attribute (strings), or None without a mix."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return None
    return frame[attribute].astype(str).to_numpy()


def decide_mixed(agents: AgentsConfig, frame: pd.DataFrame, turn: Turn,
                 own_answers: Callable[[], np.ndarray]) -> Decisions:
    """Every agent of a partition decided by its own group's policy (``get_policy``: one
    per agents config and engine per settings in this process), the rows back in agent
    order. ``own_answers`` reads the partition's earlier answers, once, for policies that
    need them."""
    from simpipe.agents.base import Decisions, DecisionStats
    from simpipe.agents.registry import get_policy
    from simpipe.games.registry import game_for

    game = game_for(turn.game)
    values = agent_values(agents, frame)
    answers: list[np.ndarray] = []

    def own() -> np.ndarray:
        if not answers:
            answers.append(own_answers())
        return answers[0]

    parts: list[tuple[np.ndarray, Decisions]] = []
    for group in groups(agents):
        index = (np.arange(len(frame)) if values is None
                 else np.flatnonzero(values == group.value))
        if not index.size:
            continue
        policy = get_policy(group.agents)
        past = own()[index] if policy.needs_own_answers(game) and turn.round_index > 0 else None
        whole = index.size == len(frame)
        sub_turn = dataclasses.replace(
            turn, past_feedback=turn.past_feedback if whole else turn.past_feedback[index],
            past_answers=past)
        sub_frame = frame if whole else frame.iloc[index].reset_index(drop=True)
        parts.append((index, policy.decide(sub_frame, sub_turn)))
    if len(parts) == 1:
        return parts[0][1]
    order = np.argsort(np.concatenate([index for index, _ in parts]), kind="stable")
    decided = pd.concat([d.frame for _, d in parts], ignore_index=True)
    stats = [d.stats for _, d in parts]
    return Decisions(
        decided.iloc[order].reset_index(drop=True),
        DecisionStats(
            prompt_ids=np.concatenate([s.prompt_ids for s in stats]),
            model_calls=sum(s.model_calls for s in stats),
            shared_agents=sum(s.shared_agents for s in stats),
            fallback_prompts=sum(s.fallback_prompts for s in stats),
            unseen_mass_max=max(s.unseen_mass_max for s in stats),
            problem=next((s.problem for s in stats if s.problem), None),
        ),
    )


# --- the split of the results -----------------------------------------------------------------

#: What each value's answers add up to in a partition (the round record sums them).
COUNTS = ("n", "n_valid", "guess_sum", "tokens_in", "tokens_out")


def partition_counts(agents: AgentsConfig, population_part: Path,
                     rows: pd.DataFrame) -> dict[str, list[float]]:
    """Per value of the mix attribute, this partition's ``COUNTS``; empty without a mix.
    ``rows``: the partition's round rows, in agent order (the population part's)."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return {}
    values = pd.read_parquet(population_part, columns=[attribute])[attribute]
    valid = (rows["status"] == "ok").to_numpy()
    frame = pd.DataFrame({
        "value": values.astype(str).to_numpy(),
        "n": 1,
        "n_valid": valid.astype(np.int64),
        "guess_sum": np.where(valid, rows["guess"].to_numpy(), 0.0),
        "tokens_in": rows["tokens_in"].to_numpy(np.int64),
        "tokens_out": rows["tokens_out"].to_numpy(np.int64),
    })
    sums = frame.groupby("value", sort=False)[list(COUNTS)].sum()
    return {str(v): [float(x) for x in row] for v, row in zip(sums.index, sums.to_numpy(),
                                                              strict=True)}


def round_split(agents: AgentsConfig, counts: list[dict[str, list[float]]]) -> dict[str, Any]:
    """The round record's ``by``: the attribute and, per value in the config's order, the
    agents, valid answers, their mean and tokens; empty without a mix."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return {}
    totals = {value: np.zeros(len(COUNTS)) for value in agents.by[attribute]}
    for part in counts:
        for value, numbers in part.items():
            totals.setdefault(value, np.zeros(len(COUNTS)))
            totals[value] += np.asarray(numbers)
    split = {}
    for value, (n, n_valid, guess_sum, tokens_in, tokens_out) in totals.items():
        split[value] = {"backend": resolve(agents, value).backend, "n": int(n),
                        "n_valid": int(n_valid),
                        "mean": round(guess_sum / n_valid, 4) if n_valid else None,
                        "tokens_in": int(tokens_in), "tokens_out": int(tokens_out)}
    return {BY: {"attribute": attribute, "values": split}}


def round_text(record: Mapping[str, Any]) -> str:
    """The round line's split: ``by model: scripted 40.1 (n 30), gemma 47.9 (n 30)``; ""
    without one."""
    split = record.get(BY)
    if not isinstance(split, dict):
        return ""
    parts = []
    for value, numbers in split.get("values", {}).items():
        mean = numbers.get("mean")
        shown = f"{mean:.2f}" if mean is not None else "-"
        invalid = numbers["n"] - numbers["n_valid"]
        parts.append(f"{value} {shown} (n {numbers['n']:,}"
                     + (f", invalid {invalid:,}" if invalid else "") + ")")
    return f"\n  mean by {split.get('attribute')}: " + ", ".join(parts)


def describe(agents: AgentsConfig) -> list[str]:
    """One line per value: who answers and what its override changes (``simpipe validate``)."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return []
    lines = []
    for value, override in agents.by[attribute].items():
        resolved = resolve(agents, value)
        changed = json.dumps(override, sort_keys=True, default=str)
        lines.append(f"{attribute} = {value!r}: {resolved.backend}; overrides {changed}")
    return lines


def stored_table(agents: Mapping[str, Any], value: str) -> dict[str, Any]:
    """A stored run's ``[agents]`` (run.json) for the agents of ``value``, unvalidated (a
    run of an older version may lack keys)."""
    tables = next(iter((agents.get(BY) or {}).values()), {})
    return merged_table(agents, tables.get(value) or {})
