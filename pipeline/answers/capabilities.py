"""What the configured back-end can do, asked of its class without building it (no model
load, no connection): the engine class of ``agents.backend`` (``simpipe.config.backends``) and the
capabilities it declares on ``simpipe.inference.base.Backend``. The planner, the round plan
and the agents registry ask here, never probing an engine object for its methods."""

from __future__ import annotations

from simpipe.config.backends import BACKENDS
from simpipe.config.model import AgentsConfig
from simpipe.inference.base import Backend


def backend_class(name: str) -> type[Backend]:
    """The engine class of the LLM back-end ``name`` (importing it loads no model)."""
    plugin = BACKENDS.get(name)
    if plugin is None or not plugin.is_llm:
        raise ValueError(f"agents.backend = {name!r} is not an LLM back-end")
    return plugin.engine_class()


def backend_supports_distributions(agents: AgentsConfig) -> bool:
    """Whether ``agents.backend`` can compute shared answer distributions (no model load)."""
    return agents.plugin.is_llm and \
        backend_class(agents.backend).shares_answers(agents.settings)


def backend_walks_lazily(agents: AgentsConfig) -> bool:
    """Whether ``agents.backend`` walks answer trees lazily in a chain of probes (the
    embedded engine): the round plan then keeps full trees for prompts many agents share
    and walks the others' agents once for the round."""
    return agents.plugin.is_llm and backend_class(agents.backend).chains_probes


def prompt_style(agents: AgentsConfig) -> str:
    """The prompt shape ``agents.backend`` will use ("completion" or "chat")."""
    return agents.plugin.prompt_style(agents.settings)
