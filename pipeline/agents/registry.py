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


def build_backend(agents: AgentsConfig) -> Backend:
    """The LLM back-end ``agents.backend`` names (not "scripted")."""
    # Imported on demand: a scripted run never loads xllamacpp or the HTTP client.
    if agents.backend == "llamacpp":
        from simpipe.inference.llamacpp import LlamaCppBackend  # noqa: PLC0415

        return LlamaCppBackend(agents.llamacpp)
    if agents.backend == "tgi":
        from simpipe.inference.tgi import TgiBackend  # noqa: PLC0415

        return TgiBackend(agents.tgi)
    if agents.backend == "openai":
        from simpipe.inference.openai_compat import OpenAIBackend  # noqa: PLC0415

        return OpenAIBackend(agents.openai)
    raise ValueError(f"agents.backend = {agents.backend!r} is not an LLM back-end")


def build_policy(agents: AgentsConfig) -> AgentPolicy:
    if agents.backend == "scripted":
        from simpipe.agents.scripted import ScriptedAgents  # noqa: PLC0415

        s = agents.scripted
        return ScriptedAgents(s.tau, s.noise, s.latency_s, s.depth_shift)
    from simpipe.agents.llm import LLMAgents  # noqa: PLC0415

    return LLMAgents(build_backend(agents), agents, agents.max_raw_chars)


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
