"""What ``simpipe validate`` prints after "ok": the settings a run of the config would use,
resolved (defaults filled in, ``--set`` applied), and agent 0's round-1 prompt as an example,
built with the function the run uses."""

from __future__ import annotations

from typing import Any

from simpipe.config.model import AgentsConfig, Config
from simpipe.config.population_mix import groups as mix_groups
from simpipe.config.population_mix import mix_attribute, resolve
from simpipe.games.beauty_contest.prompts import prompt_label
from simpipe.games.config import BeautyContestConfig
from simpipe.games.registry import game_for
from simpipe.personas.sampling import sample_partition
from simpipe.personas.templates import render_template
from simpipe.run.agent_prompt import PromptUnavailable, example_prompt

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "cot_max_tokens",
                 "share_answers", "reproducible")
LLM_PERSONA = "(written by the persona model when the population is built)"


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in values.items())


def _attributes(config: Config) -> str:
    parts = []
    for name, spec in config.population.attributes.items():
        raw = spec.model_dump(exclude_none=True)
        if "values" in raw:
            parts.append(f"{name} ({len(raw['values'])} values)")
        elif "given" in raw:
            parts.append(f"{name} (given {raw['given']})")
        else:
            parts.append(f"{name} ({raw.get('min')}..{raw.get('max')})")
    return ", ".join(parts) or "none"


def agent0_persona(config: Config) -> str | None:
    """Agent 0's persona as the population build makes it (template mode: its attributes
    sampled and the template rendered; llm mode: a placeholder; none: None)."""
    persona = config.population.persona
    if persona.mode == "none":
        return None
    if persona.mode == "llm":
        return LLM_PERSONA
    frame = sample_partition(config.population, config.run.seed, 0).head(1)
    return str(render_template(config.population.persona_template, frame)[0])


def agent0_agents(config: Config) -> AgentsConfig:
    """The agents config agent 0 is answered by (its group's, in a mixed population)."""
    attribute = mix_attribute(config.agents)
    if attribute is None:
        return config.agents
    frame = sample_partition(config.population, config.run.seed, 0).head(1)
    return resolve(config.agents, str(frame[attribute].iloc[0]))


def _backend_lines(agents: AgentsConfig, game: Any, label: str) -> list[str]:
    """Who answers and with what settings: ``back-end: ...`` (or a mix value's ``label``)."""
    plugin = agents.plugin
    settings = agents.settings.model_dump(mode="json", exclude_none=True)
    lines = [f"{'back-end:    ' if not label else '             ' + label}"
             f"{agents.backend} ({plugin.describe(settings, game)})"]
    if settings:
        lines.append(f"             [agents.{agents.backend}] {_pairs(settings)}")
    if plugin.is_llm:
        lines.append(f"             {_pairs({k: getattr(agents, k) for k in SAMPLING_KEYS})}")
    return lines


def resolved_settings(config: Config) -> str:
    game = game_for(config.game)
    g = config.game
    options = (prompt_label(g) if isinstance(g, BeautyContestConfig) else g.prompt)
    lines = [
        f"game:        {game.describe()}",
        f"             {_pairs(g.model_dump(mode='json'))}",
        f"prompt:      {options}; answer "
        + ("reasoning, then 'Final answer:' and the number" if g.free_text_answer
           else "the number alone"),
    ]
    attribute = mix_attribute(config.agents)
    if attribute is not None:
        lines.append(f"back-end:    chosen by {attribute} (agents.by.{attribute}), "
                     f"{len(config.agents.by[attribute])} values:")
    for group in mix_groups(config.agents):
        lines += _backend_lines(group.agents, game,
                                f"  {attribute} = {group.value!r}: " if attribute else "")
    cluster = config.cluster.model_dump(mode="json", exclude_none=True)
    servers = cluster.pop("servers", {})
    p = config.population
    persona = p.persona.mode + (f", template {p.persona_template!r}"
                                if p.persona.mode != "none" else "")
    lines += [
        f"population:  {p.size:,} agents in {p.n_partitions} partitions, sampling {p.sampling}; "
        f"attributes {_attributes(config)}; personas {persona}",
        f"cluster:     {_pairs(cluster)}",
    ]
    if servers.get("kind") != "none":
        lines.append(f"             [cluster.servers] {_pairs(servers)}")
    try:
        prompt = example_prompt(config, agent0_persona(config), agent0_agents(config))
    except PromptUnavailable as exc:
        lines.append(f"prompt of agent 0, round 1: none ({exc})")
        return "\n".join(lines)
    text = prompt if isinstance(prompt, str) else "\n\n".join(
        f"[{m['role']}]\n{m['content']}" for m in prompt)
    lines += ["prompt of agent 0, round 1 (as the run builds it):", "---", text, "---"]
    return "\n".join(lines)
