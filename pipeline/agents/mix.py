"""Mixed populations on the workers: a partition played group by group, each value of the
mix attribute by its own policy, and what each value's answers add up to
(``simpipe.config.population_mix`` is the config's part: the tables, their checks, the groups)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from simpipe.agents.base import Decisions, DecisionStats, Turn
from simpipe.agents.registry import get_policy
from simpipe.config.model import AgentsConfig
from simpipe.config.population_mix import groups, mix_attribute, resolve
from simpipe.store.round_record import MixSplit, ValueSplit

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
    game = turn.game
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
            prompt_tokens=sum(s.prompt_tokens for s in stats),
            probes=sum(s.probes for s in stats),
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


def round_split(agents: AgentsConfig, counts: list[dict[str, list[float]]]) -> MixSplit | None:
    """The round record's ``by``: the attribute and, per value in the config's order, the
    agents, valid answers, their mean and tokens; None without a mix."""
    attribute = mix_attribute(agents)
    if attribute is None:
        return None
    totals = {value: np.zeros(len(COUNTS)) for value in agents.by[attribute]}
    for part in counts:
        for value, numbers in part.items():
            totals.setdefault(value, np.zeros(len(COUNTS)))
            totals[value] += np.asarray(numbers)
    split = {}
    for value, (n, n_valid, guess_sum, tokens_in, tokens_out) in totals.items():
        split[value] = ValueSplit(backend=resolve(agents, value).backend, n=int(n),
                                  n_valid=int(n_valid),
                                  mean=round(float(guess_sum / n_valid), 4) if n_valid else None,
                                  tokens_in=int(tokens_in), tokens_out=int(tokens_out))
    return MixSplit(attribute=attribute, values=split)


def round_text(split: MixSplit | None) -> str:
    """The round line's split: ``by model: scripted 40.1 (n 30), gemma 47.9 (n 30)``; ""
    without one."""
    if split is None:
        return ""
    parts = []
    for value, numbers in split.values.items():
        shown = f"{numbers.mean:.2f}" if numbers.mean is not None else "-"
        invalid = numbers.n - numbers.n_valid
        parts.append(f"{value} {shown} (n {numbers.n:,}"
                     + (f", invalid {invalid:,}" if invalid else "") + ")")
    return f"\n  mean by {split.attribute}: " + ", ".join(parts)
