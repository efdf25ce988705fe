"""The exact prompt one agent got in one round, rebuilt from the run's files.

A prompt is a pure function of the game's config, the agent's persona, its own earlier
answers and what its group was told (``simpipe.agents.llm.render_prompts``, the function the
round task calls). Every one of those is on disk: run.json's config, the population part,
the earlier rounds' part files and the summary. Rebuilding from them gives the same text
without storing a prompt per agent and round (a million CoT prompts are gigabytes), and
also for a round not played yet once the rounds before it are.

The history is rebuilt exactly as the round task reads it: the agent's answer where its
status was ``ok``, else "invalid"; the group's announced number from the summary. The
prompt shape (completion or chat) is the back-end's, from its stored settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from simpipe.agents.base import Turn
from simpipe.agents.llm import render_prompts
from simpipe.config import population_mix as mix
from simpipe.config.backends import BACKENDS
from simpipe.config.model import AgentsConfig, Config
from simpipe.core.errors import SimpipeError
from simpipe.core.records import CorruptFile
from simpipe.games.base import Game
from simpipe.games.groups import assign_groups
from simpipe.games.registry import game_for
from simpipe.store.integrity import RESUME_REPAIRS, check_part, read_part, read_summary
from simpipe.store.layout import RunPaths
from simpipe.store.record import RunRecord, read_ledger

Prompt = str | tuple[dict[str, str], ...]


class PromptUnavailable(SimpipeError, ValueError):
    """No prompt to show for that agent and round; the message says why and what to ask."""


@dataclass(frozen=True)
class AgentPrompt:
    agent_id: int
    round_index: int  # from 0 (the round numbered round_index + 1)
    rounds_total: int
    group_id: int
    partition: int
    style: str  # "completion" or "chat"
    prompt: Prompt
    #: What the model counted for this agent's request in that round (None: not played yet);
    #: for an answer drawn from a shared distribution, its share of the tree's tokens.
    tokens_in: int | None
    shared: bool | None

    def text(self) -> str:
        """The prompt as printed: the completion text, or each chat message under its role."""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in self.prompt)

    def as_json(self) -> dict:
        return {"agent_id": self.agent_id, "round": self.round_index + 1,  # from 1
                "rounds_total": self.rounds_total, "group_id": self.group_id,
                "partition": self.partition, "style": self.style,
                "prompt": self.prompt if isinstance(self.prompt, str) else list(self.prompt),
                "text": self.text(), "tokens_in": self.tokens_in, "shared": self.shared}


def prompt_style(agents: dict) -> str | None:
    """The prompt shape of a stored ``[agents]`` table; None for rule-based agents."""
    name = agents.get("backend")
    plugin = BACKENDS.get(name) if isinstance(name, str) else None
    if plugin is None:
        raise PromptUnavailable(f"agents.backend = {name!r} is not a back-end this version "
                                "knows: its prompts cannot be rebuilt")
    if not plugin.is_llm:
        return None
    try:
        settings = plugin.settings.model_validate(agents.get(name) or {})
    except ValidationError:
        settings = plugin.settings()  # the shape depends on keys an old table may lack
    return plugin.prompt_style(settings)


def rebuild_prompt(run_dir: str | Path, agent_id: int, round_index: int = 0,
                   resolve: Callable[[Path], Path] = lambda p: p) -> AgentPrompt:
    """The prompt agent ``agent_id`` got in round ``round_index`` (0-based).
    ``resolve`` maps each file before it is read (the web UI keeps reads inside its root).
    PromptUnavailable (one line) when there is none or a file it needs is missing/damaged."""
    paths = RunPaths(Path(run_dir))
    try:
        ledger = read_ledger(resolve(paths.ledger)).at(paths.ledger)
        game = ledger.game()
    except CorruptFile as exc:
        raise PromptUnavailable(f"{exc}; restore it from a copy") from None
    paths = ledger.run_paths(paths.root)  # its rounds' folders as the run numbers them
    n_agents, total = ledger.n_agents or 0, ledger.rounds_total or 0
    if not 0 <= agent_id < n_agents:
        raise PromptUnavailable(f"agent {agent_id}: the run has agents 0 to {n_agents - 1}")
    agents = ledger.section("agents")
    if agents.get(mix.BY):
        try:
            agents = _mixed_agent_table(paths, ledger, agents, agent_id, resolve)
        except CorruptFile as exc:
            raise PromptUnavailable(f"{exc}; {RESUME_REPAIRS}") from None
    style = prompt_style(agents)
    if style is None:
        who = (f"agent {agent_id} is rule-based" if ledger.section("agents").get(mix.BY)
               else "its agents are rule-based")
        raise PromptUnavailable(f"{paths.root}: {who} "
                                f"(agents.backend = {agents.get('backend')!r}): they get no "
                                "prompt")
    if not 0 <= round_index < total:
        raise PromptUnavailable(f"round {round_index + 1}: the run has rounds 1 to {total}")
    missing = [r + 1 for r in range(round_index) if ledger.round(r) is None]
    if missing:
        raise PromptUnavailable(
            f"round {round_index + 1}'s prompt shows the earlier rounds, and round "
            f"{missing[0]} has not finished")
    try:
        return _rebuild(paths, ledger, game, style, agent_id, round_index, resolve)
    except CorruptFile as exc:
        raise PromptUnavailable(f"{exc}; {RESUME_REPAIRS}") from None


def _mixed_agent_table(paths: RunPaths, ledger: RunRecord, agents: dict, agent_id: int,
                       resolve: Callable[[Path], Path]) -> dict:
    """A mixed population's ``[agents]`` for ``agent_id``: its value's override applied
    (``simpipe.agents.mix``), the value read from its population part."""
    attribute = next(iter(agents[mix.BY]))
    bounds = ledger.partition_bounds()
    k = next(i for i, (a, b) in enumerate(bounds) if a <= agent_id < b)
    part = resolve(paths.population_part(k))
    check_part(part, bounds[k])
    values = pd.read_parquet(part, columns=[attribute])[attribute]
    return mix.stored_table(agents, str(values.iloc[agent_id - bounds[k][0]]))


def _rebuild(paths: RunPaths, ledger: RunRecord, game: Game, style: str, agent_id: int,
             round_index: int, resolve: Callable[[Path], Path]) -> AgentPrompt:
    bounds = ledger.partition_bounds()
    k = next(i for i, (a, b) in enumerate(bounds) if a <= agent_id < b)
    start = bounds[k][0]
    # Checked, then read whole, as the round task reads it (the persona column if any).
    part = resolve(paths.population_part(k))
    check_part(part, bounds[k])
    population = pd.read_parquet(part)
    seed = int(ledger.section("run").get("seed", 0))
    groups = assign_groups(ledger.n_agents or 0, game.config.group_size, seed)
    group = int(groups[agent_id])
    own = np.full((1, round_index), np.nan)
    for r in range(round_index):
        rows = read_part(resolve(paths.round_part(r, k)), bounds[k], ["guess", "status"])
        row = rows.iloc[agent_id - start]
        own[0, r] = row["guess"] if row["status"] == "ok" else np.nan
    feedback = np.empty((1, 0))
    if round_index:
        summary = read_summary(resolve(paths.summary), game.summary_columns,
                               first_round=ledger.first_round)
        feedback = game.feedback_table(summary, int(groups.max()) + 1, round_index)[[group]]
    turn = Turn(game=game, seed=seed, round_index=round_index, partition=k,
                past_feedback=feedback, past_answers=own if round_index else None)
    agent = population.iloc[[agent_id - start]].reset_index(drop=True)
    prompt = render_prompts(agent, turn, style)[0]
    tokens_in = shared = None
    if ledger.round(round_index) is not None:
        played = read_part(resolve(paths.round_part(round_index, k)), bounds[k],
                           ["tokens_in", "shared"])
        tokens_in = int(played["tokens_in"].iloc[agent_id - start])
        shared = bool(played["shared"].iloc[agent_id - start])
    return AgentPrompt(agent_id, round_index, ledger.rounds_total or 0, group, k, style,
                       prompt if isinstance(prompt, str) else tuple(prompt), tokens_in, shared)


def example_prompt(config: Config, persona: str | None,
                   agents: AgentsConfig | None = None) -> Prompt:
    """Round 1's prompt of an agent with ``persona`` under ``config`` (``simpipe validate``),
    answered by ``agents`` (default ``config.agents``; a mixed population's agent by its
    group's); PromptUnavailable for rule-based agents."""
    agents = agents or config.agents
    plugin = agents.plugin
    if not plugin.is_llm:
        raise PromptUnavailable("rule-based agents get no prompt")
    style = plugin.prompt_style(agents.settings)
    agent = pd.DataFrame({"agent_id": [0]} | ({"persona": [persona]} if persona else {}))
    turn = Turn(game=game_for(config.game), seed=config.run.seed, round_index=0, partition=0,
                past_feedback=np.empty((1, 0)))
    return render_prompts(agent, turn, style)[0]
