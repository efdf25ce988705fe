"""One policy object per worker process and agents config, reused across partitions and
rounds, so a model is loaded (or an HTTP session opened) once per process."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from simpipe.agents.base import AgentPolicy
from simpipe.config import AgentsConfig
from simpipe.inference.base import Backend, GenerationRequest

_lock = threading.Lock()
_policies: dict[str, AgentPolicy] = {}


def backend_class(name: str) -> type[Backend]:
    """The class of the LLM back-end ``name`` (imported on demand: a scripted run never
    loads the HTTP client, and importing the llamacpp module does not load xllamacpp)."""
    if name == "llamacpp":
        from simpipe.inference.llamacpp import LlamaCppBackend  # noqa: PLC0415

        return LlamaCppBackend
    if name == "tgi":
        from simpipe.inference.tgi import TgiBackend  # noqa: PLC0415

        return TgiBackend
    if name == "openai":
        from simpipe.inference.openai_compat import OpenAIBackend  # noqa: PLC0415

        return OpenAIBackend
    raise ValueError(f"agents.backend = {name!r} is not an LLM back-end")


def build_backend(agents: AgentsConfig) -> Backend:
    """The LLM back-end ``agents.backend`` names (not "scripted")."""
    return backend_class(agents.backend)(getattr(agents, agents.backend))  # type: ignore[call-arg]


def backend_supports_distributions(agents: AgentsConfig) -> bool:
    """Whether ``agents.backend`` can compute shared answer distributions (no model load)."""
    if agents.backend == "scripted":
        return False
    return backend_class(agents.backend).supports_answer_distributions


def prompt_style(agents: AgentsConfig) -> str:
    """The prompt shape ``agents.backend`` will use ("completion" or "chat")."""
    if agents.backend == "llamacpp":
        return agents.llamacpp.prompt_style
    if agents.backend == "openai":
        return "chat" if agents.openai.api == "chat" else "completion"
    return "completion"


def build_policy(agents: AgentsConfig) -> AgentPolicy:
    if agents.backend == "scripted":
        from simpipe.agents.scripted import ScriptedAgents  # noqa: PLC0415

        s = agents.scripted
        return ScriptedAgents(s.tau, s.noise, s.latency_s, s.depth_shift)
    from simpipe.agents.llm import LLMAgents  # noqa: PLC0415

    return LLMAgents(build_backend(agents), agents)


def get_policy(agents: AgentsConfig) -> AgentPolicy:
    key = agents.model_dump_json()
    with _lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _policies[key] = build_policy(agents)
        return policy


def process_counters() -> dict[str, dict]:
    """Per-endpoint counters of every policy in this process (run on each worker)."""
    with _lock:
        policies = list(_policies.values())
    total: dict[str, dict] = {}
    for policy in policies:
        for endpoint, counts in policy.counters().items():
            slot = total.setdefault(endpoint, {})
            for key, value in counts.items():
                if isinstance(value, int | float):
                    slot[key] = slot.get(key, 0) + value
    return total


def warm_policy(agents: AgentsConfig, requests: Sequence[GenerationRequest] = ()) -> None:
    """Create this process's policy now (load the model, open sessions); run on workers.

    ``requests`` (LLM back-ends only) are sent through the back-end once, so that prompt
    caches and first-batch allocations are paid before a benchmark starts its clock.
    """
    policy = get_policy(agents)
    if requests:
        from simpipe.aio import run_async  # noqa: PLC0415

        run_async(policy.backend.generate(list(requests)))  # type: ignore[attr-defined]
