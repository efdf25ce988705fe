"""One policy object per worker process and agents config, reused across partitions and
rounds, so a model is loaded (or an HTTP session opened) once per process."""

from __future__ import annotations

import threading

from simpipe.agents.base import AgentPolicy
from simpipe.agents.scripted import ScriptedAgents
from simpipe.config import AgentsConfig

_lock = threading.Lock()
_policies: dict[str, AgentPolicy] = {}


def build_policy(agents: AgentsConfig) -> AgentPolicy:
    if agents.backend == "scripted":
        s = agents.scripted
        return ScriptedAgents(s.tau, s.noise, s.latency_s, s.depth_shift)
    raise NotImplementedError(f"agents.backend = {agents.backend!r} is not available yet")


def get_policy(agents: AgentsConfig) -> AgentPolicy:
    key = agents.model_dump_json()
    with _lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _policies[key] = build_policy(agents)
        return policy
