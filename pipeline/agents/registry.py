"""The worker process's policies and engines, built from ``simpipe.config.backends.BACKENDS``.

One engine per worker process and back-end settings (``[agents.<backend>]``), shared by
every user in the process: the game's agents of every partition and round, and the persona
generator of the population build. A run whose personas and agents use the same model
(``population.persona.agents`` and ``[agents]`` with the same ``llamacpp`` table) therefore
loads it once per worker. One policy per agents config, reused likewise.

The engines are closed when the worker shuts down: ``close_engines_on_shutdown`` registers
a worker plugin that does it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from distributed import Client, WorkerPlugin
from distributed.core import Status

from simpipe.agents.base import AgentPolicy
from simpipe.answers.capabilities import backend_class
from simpipe.config.model import AgentsConfig
from simpipe.core.aio import process_loop, run_async
from simpipe.inference.base import Backend, GenerationRequest

EngineFactory = Callable[[AgentsConfig], Backend]

_lock = threading.Lock()
_policies: dict[str, AgentPolicy] = {}
_engines: dict[str, Backend] = {}


def build_backend(agents: AgentsConfig) -> Backend:
    """A new engine for ``agents.backend`` (an LLM back-end), not cached."""
    return backend_class(agents.backend)(agents.settings)  # type: ignore[call-arg]


def process_backend(agents: AgentsConfig, factory: EngineFactory | None = None) -> Backend:
    """This process's engine for ``agents.backend`` and its settings table, built on first
    use; ``factory`` replaces the engine (tests inject one; cached apart)."""
    key = f"{getattr(factory, '__qualname__', 'engine')}:{agents.backend}:" \
          f"{agents.settings.model_dump_json()}"
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = (factory or build_backend)(agents)
        return engine


def process_engines() -> list[str]:
    """The keys of the engines this process holds (back-end and settings)."""
    with _lock:
        return sorted(_engines)


def scripted_policy(settings: Any) -> AgentPolicy:
    """The ``scripted`` back-end's policy (``simpipe.config.backends``): cognitive-hierarchy
    agents."""
    # Each back-end's agents are imported when it is used (the LLM ones bring the
    # inference stack).
    from simpipe.agents.scripted import ScriptedAgents

    return ScriptedAgents(settings, settings.latency_s)


def build_policy(agents: AgentsConfig) -> AgentPolicy:
    if not agents.plugin.is_llm:
        return agents.plugin.policy_factory()(agents.settings)
    from simpipe.agents.llm import LLMAgents  # see scripted_policy

    return LLMAgents(process_backend(agents), agents)


def get_policy(agents: AgentsConfig) -> AgentPolicy:
    key = agents.model_dump_json()
    with _lock:
        policy = _policies.get(key)
    if policy is None:
        # Built outside the lock: its engine takes the lock itself (and loads a model).
        built = build_policy(agents)
        with _lock:
            policy = _policies.setdefault(key, built)
    return policy


def process_counters() -> dict[str, dict]:
    """Per-endpoint counters of every engine in this process (run on each worker)."""
    # Counters belong to engines (policies without one have none), and one engine serves
    # every policy and persona builder on the same settings: summing over policies would
    # count an engine once per agents config that used it.
    with _lock:
        engines = list(_engines.values())
    total: dict[str, dict] = {}
    for engine in engines:
        for endpoint, counts in engine.counters().items():
            slot = total.setdefault(endpoint, {})
            for key, value in counts.items():
                if isinstance(value, int | float):
                    slot[key] = slot.get(key, 0) + value
    return total


def warm_policy(agents: AgentsConfig, requests: Sequence[GenerationRequest] = ()) -> None:
    """Create this process's policy now (open sessions); run on workers.

    ``requests`` (LLM back-ends only) are sent through the back-end once, so that the model
    load (the embedded server starts on its first request), prompt caches and first-batch
    allocations are paid before a benchmark starts its clock.
    """
    policy = get_policy(agents)
    if requests:

        run_async(policy.backend.generate(list(requests)))  # type: ignore[attr-defined]


async def close_engines() -> int:
    """Close every engine of this process and forget them and their policies; how many."""
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
        _policies.clear()
    for engine in engines:
        await engine.aclose()
    return len(engines)


class EngineCloser(WorkerPlugin):
    """Closes the worker's engines (models, HTTP sessions) when the worker shuts down.

    Only then: registering the plugin again (every run does) replaces it on a live worker,
    which must keep its loaded model for the partitions it is playing.
    """

    name = "simpipe-engines"

    async def teardown(self, worker: Any) -> None:
        if worker.status not in (Status.closing, Status.closing_gracefully, Status.closed):
            return
        # Closing an engine takes a while, and dask stops a worker's heartbeat only after
        # its plugins are torn down: without this, a scheduler that closed meanwhile shows
        # up as a "Failed to communicate with scheduler during heartbeat" traceback.
        heartbeat = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
        if heartbeat is not None:
            heartbeat.stop()
        # On the loop the engines were made on: their sessions and tasks live there.
        closing = asyncio.run_coroutine_threadsafe(close_engines(), process_loop())
        await asyncio.wrap_future(closing)


def close_engines_on_shutdown(client: Client) -> None:
    """Every current and future worker of ``client`` closes its engines when it shuts down."""
    client.register_plugin(EngineCloser(), name=EngineCloser.name)
