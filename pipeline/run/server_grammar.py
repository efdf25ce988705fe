"""Whether a run sends the servers it starts the answer grammar in the slower of two forms.

llama.cpp's GBNF sampler checks the text of all 262,144 tokens against the grammar whenever
a drawn token breaks it, on the server's main thread, one slot after another. The same
grammar in llguidance's form (``agents.openai.constraint = "lark"``) gives the same answers
for the same seeds at about 1.4 times the requests a second (14.8 against 10.3, 400 of 400
answers equal: docs/benchmarks.md, "The answer grammar in llguidance's form").
``constraint = "auto"`` sends GBNF, which every llama.cpp server takes, so a run that starts
servers taking llguidance's form says so before it starts, with the fix. It is not switched
silently: a server built without llguidance (``simpipe engine build``) aborts on that form,
and the config then says which form its answers were drawn under.
"""

from __future__ import annotations

from simpipe.config.model import Config
from simpipe.games.registry import game_for
from simpipe.inference.settings import OpenAISettings


def slower_grammar(config: Config) -> str | None:
    """A warning when ``[cluster.servers]`` starts servers that take llguidance grammars for
    this run's agents and ``agents.openai.constraint = "auto"`` sends them GBNF; None
    otherwise (another constraint chosen, no servers started, no llguidance form of the
    answer: chain of thought)."""
    servers = config.cluster.servers
    backend = config.agents.backend
    if not servers.plugin.starts_servers or servers.endpoint_backend != backend:
        return None
    settings = getattr(config.agents, backend)
    if not isinstance(settings, OpenAISettings) or settings.constraint != "auto":
        return None
    if game_for(config.game).answer().lark() is None or not servers.plugin.takes_llguidance():
        return None
    key = f"agents.{backend}.constraint"
    return (f'{key} = "auto" sends the answer grammar as GBNF, and the '
            f'cluster.servers.kind = "{servers.kind}" servers this run starts take '
            "llguidance's form: the same answers for the same seeds at about 1.4 times the "
            "requests a second (docs/shared-answers.md, \"The answer grammar in llguidance's "
            f'form"); set {key} = "lark"')
