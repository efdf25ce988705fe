"""The default model made ready by the run itself, before any worker asks for it.

A first run on a fresh machine assembles the default model from its package, checks its
hash and writes its copy with the Q5_0 weights stored as Q8_0
(``simpipe.inference.llamacpp.model_files``). Left to the workers, that happened inside
round 1 (or the persona build) with nothing said: round 1 of the 1,000 x 5 run took 6.3 s
instead of 2.5 s, and its agents/s looked like the engine's speed. The client does it
first (its files are where the workers look: ``$SIMPIPE_HOME``, the same home on a
cluster's shared file system), with a line saying what it does and how long it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from simpipe.config.model import Config
from simpipe.config.population_mix import llm_groups
from simpipe.inference.llamacpp.model_files import default_model_ready, engine_model_path


def uses_default_model(config: Config) -> bool:
    """Whether the run loads the default model: some agents or the persona generator on a
    back-end that does with their settings (the embedded engine without a ``model_path``)."""
    users = [g.agents for g in llm_groups(config.agents)]
    if config.population.persona.mode == "llm":
        users.append(config.persona_agents)
    return any(a.plugin.loads_default_model(a.settings) for a in users)


def prepare_default_model(config: Config, say: Callable[[str], None],
                          warn: Callable[[str], None]) -> None:
    """Make the default model ready here when the run loads it and it is not ready yet,
    saying so. A file system this process cannot write is only warned about: the workers
    (perhaps on other nodes, with a home of their own) prepare it as before and report
    what stops them there."""
    if not uses_default_model(config) or default_model_ready():
        return
    say("preparing the default model for this machine (once): assembling it from its "
        "package, checking its sha256, writing its copy with the Q5_0 weights as Q8_0")
    started = time.perf_counter()
    try:
        path = engine_model_path()
    except OSError as exc:
        warn(f"could not prepare the default model here ({exc}); each worker will")
        return
    say(f"  ready in {time.perf_counter() - started:.1f} s: {path}")
