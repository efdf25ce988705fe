"""The ``persona`` column of a population partition: rendered from the template, or written
by an LLM through the same back-ends as the game.

LLM personas run inside the population build's Dask task for the partition: the whole
partition's meta-prompts go to the back-end in one ``generate`` call (it overlaps them
itself); outputs that fail the checks are asked again with fresh seeds, and whatever still
fails gets the template text with ``persona_source = "template_fallback"``. No agent is
ever dropped. The engine is the worker process's own (``simpipe.agents.registry``), shared
with the game's agents when they use the same model, so the model loads once per worker.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from simpipe.agents.llm import agent_seeds
from simpipe.agents.registry import EngineFactory, process_backend
from simpipe.config.model import AgentsConfig
from simpipe.core.aio import run_async
from simpipe.inference.base import GenerationRequest
from simpipe.personas import meta_prompt
from simpipe.personas.config import PopulationConfig
from simpipe.personas.templates import render_one, render_template

BackendFactory = EngineFactory  # replaces the generator's engine (tests inject one)
SOURCES = ("template", "llm", "template_fallback")
_SEED_SALT = 0x9E450A  # keeps persona request seeds apart from the game's

_lock = threading.Lock()
_requests_in_process = 0


@dataclass
class PersonaStats:
    """What one partition's persona step did (summed into ``_population.json``)."""

    llm_requests: int = 0
    tokens_out: int = 0
    rejected: Counter = field(default_factory=Counter)
    sources: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"llm_requests": self.llm_requests, "tokens_out": self.tokens_out,
                "rejected": dict(self.rejected), "sources": dict(self.sources)}


def process_request_count() -> int:
    """Persona requests this process sent since it started (for tests and diagnostics)."""
    return _requests_in_process


def _count(n: int) -> None:
    global _requests_in_process
    with _lock:
        _requests_in_process += n


def _records(frame: pd.DataFrame, names: list[str]) -> list[dict]:
    columns = {name: frame[name].astype(object).tolist() for name in names}
    return [dict(zip(names, values, strict=True))
            for values in zip(*columns.values(), strict=True)]


def add_personas(frame: pd.DataFrame, population: PopulationConfig, seed: int,
                 agents: AgentsConfig | None = None,
                 factory: BackendFactory | None = None) -> tuple[pd.DataFrame, PersonaStats]:
    """``frame`` with ``persona`` and ``persona_source`` columns for the configured mode."""
    persona = population.persona
    stats = PersonaStats()
    if persona.mode == "none":
        return frame, stats
    template = population.persona_template
    if persona.mode == "template":
        texts = render_template(template, frame)
        sources = np.zeros(len(frame), dtype=np.int8)
    else:
        if agents is None:
            raise ValueError("persona.mode = 'llm' needs the generator's AgentsConfig")
        texts, sources = _llm_personas(frame, population, seed, agents, factory, stats)
    frame = frame.assign(
        persona=pd.arrays.ArrowExtensionArray(texts) if isinstance(texts, pa.Array) else texts,
        persona_source=pd.Categorical.from_codes(sources, categories=list(SOURCES)),
    )
    stats.sources.update(frame["persona_source"].value_counts().to_dict())
    stats.sources = Counter({k: int(v) for k, v in stats.sources.items() if v})
    return frame, stats


def _llm_personas(frame: pd.DataFrame, population: PopulationConfig, seed: int,
                  agents: AgentsConfig, factory: BackendFactory | None,
                  stats: PersonaStats) -> tuple[list[str], np.ndarray]:
    persona = population.persona
    names = list(population.attributes)
    records = _records(frame, names)
    age_key = population.checked_attribute("age")
    gender_key = population.checked_attribute("gender")
    prompts = [meta_prompt.build_prompt(r, age_key, gender_key) for r in records]
    agent_ids = frame["agent_id"].to_numpy()
    backend = process_backend(agents, factory)
    texts: list[str | None] = [None] * len(frame)
    pending = list(range(len(frame)))
    for attempt in range(persona.retries + 1):
        if not pending:
            break
        seeds = agent_seeds(seed ^ _SEED_SALT, attempt, agent_ids[pending])
        requests = [
            GenerationRequest(prompt=prompts[i], max_tokens=persona.max_tokens,
                              temperature=persona.temperature, top_p=persona.top_p,
                              seed=int(s), stop=meta_prompt.stop_sequences())
            for i, s in zip(pending, seeds.tolist(), strict=True)
        ]
        # One batched call per attempt: the back-end overlaps the whole partition itself.
        results = run_async(backend.generate(requests))
        _count(len(requests))
        stats.llm_requests += len(requests)
        still = []
        for i, result in zip(pending, results, strict=True):
            stats.tokens_out += result.tokens_out
            if result.status != "ok":
                stats.rejected["back-end error"] += 1
                still.append(i)
                continue
            checked = meta_prompt.check_output(
                result.text, result.finish_reason, records[i], age_key=age_key,
                gender_key=gender_key, min_chars=persona.min_chars, max_chars=persona.max_chars)
            if checked.text is None:
                stats.rejected[checked.reason or "invalid"] += 1
                still.append(i)
            else:
                texts[i] = checked.text
        pending = still
    sources = np.full(len(frame), SOURCES.index("llm"), dtype=np.int8)
    template = population.persona_template
    for i in pending:
        texts[i] = render_one(template, {"agent_id": int(agent_ids[i]), **records[i]})
        sources[i] = SOURCES.index("template_fallback")
    return [t or "" for t in texts], sources
