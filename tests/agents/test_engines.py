"""The worker process's engines (``simpipe.agents.registry``): one per model, shared by the
persona generator and the game's agents, closed when the worker shuts down; and the
back-ends as plug-ins of one registry."""

from __future__ import annotations

import gc
import logging

import psutil
import pytest
from distributed import Client, LocalCluster

from simpipe.agents.registry import (
    close_engines_on_shutdown,
    get_policy,
    process_backend,
    process_engines,
)
from simpipe.answers.capabilities import prompt_style
from simpipe.config.backends import BACKENDS, llm_backends
from simpipe.config.model import ConfigError, config_from_dict
from simpipe.core.aio import run_async
from simpipe.inference.base import Backend, GenerationRequest
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.stub import StubProcess
from simpipe.store.results import read_population, read_rounds

from support import small_config


def _open_connections(port: int) -> int:
    """This process's established TCP connections to ``port`` on this machine."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def _ask_once(agents) -> str:
    """Worker task: this process's engine for ``agents`` answers one request."""
    engine = process_backend(agents)
    [answer] = run_async(engine.generate([GenerationRequest(prompt="Guess:", max_tokens=4)]))
    return answer.status


def test_a_worker_closes_its_engines_when_it_shuts_down_and_not_before():
    with StubProcess() as stub:
        port = int(stub.url.rsplit(":", 1)[1])
        agents = config_from_dict({"agents": {"backend": "tgi",
                                              "tgi": {"endpoints": [stub.url]}}}).agents
        # Engines another test built in this process (in-process planning) are not this
        # worker's: count only those that appear here.
        before = set(process_engines())
        # A worker in this process, so its engines and connections can be seen from here.
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
                Client(cluster) as client:
            close_engines_on_shutdown(client)
            assert client.submit(_ask_once, agents, pure=False).result() == "ok"
            assert len(set(process_engines()) - before) == 1 and _open_connections(port) >= 1
            # Every run registers the plug-in again: a live worker keeps its engine.
            close_engines_on_shutdown(client)
            assert len(set(process_engines()) - before) == 1 and _open_connections(port) >= 1
        assert not set(process_engines()) - before
        assert _open_connections(port) == 0


def test_every_backend_of_the_registry_is_a_config_choice_with_its_own_table():
    for name, plugin in BACKENDS.items():
        agents = config_from_dict({"agents": {"backend": name}}).agents
        assert isinstance(agents.settings, plugin.settings)
        assert prompt_style(agents) in ("completion", "chat")
        if plugin.is_llm:
            assert issubclass(plugin.engine_class(), Backend)
    assert llm_backends() == ("llamacpp", "tgi", "openai")
    chat = config_from_dict({"agents": {"backend": "openai", "openai": {"api": "chat"}}})
    assert prompt_style(chat.agents) == "chat"
    with pytest.raises(ConfigError, match=r"agents.backend = 'magic': Input should be "
                                          r"'scripted', 'llamacpp', 'tgi' or 'openai'"):
        config_from_dict({"agents": {"backend": "magic"}})
    # A rule-based back-end builds its policy from its table, reused per process.
    scripted = config_from_dict({"agents": {"scripted": {"tau": 2.0}}}).agents
    assert get_policy(scripted) is get_policy(scripted)


def _live_llamacpp_engines() -> int:
    """Loaded llama.cpp models in this process, wherever they are referenced from."""
    from simpipe.inference.llamacpp.backend import LlamaCppBackend

    gc.collect()
    return sum(1 for obj in gc.get_objects()
               if isinstance(obj, LlamaCppBackend) and obj._server is not None)


@pytest.mark.llm
@pytest.mark.slow
def test_llm_personas_and_llamacpp_agents_on_the_same_model_hold_one_engine_per_worker(
        tmp_path):
    llamacpp = {"n_parallel": 2}
    config = small_config(
        tmp_path,
        population={"size": 4, "partitions": 1,
                    "attributes": {"gender": {"values": {"female": 1, "male": 1}},
                                   "age": {"min": 20, "max": 60}},
                    "persona": {"mode": "llm", "retries": 0, "max_tokens": 24,
                                "agents": {"llamacpp": llamacpp}}},
        game={"rounds": 1},
        agents={"backend": "llamacpp", "max_tokens": 4, "llamacpp": llamacpp})
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        run_simulation(config, client=client, console=Console(quiet=True))
        engines = client.run(_live_llamacpp_engines)
    population = read_population(config.run_dir)
    assert population["persona_source"].isin(["llm", "template_fallback"]).all()
    assert len(read_rounds(config.run_dir)) == 4
    assert list(engines.values()) == [1]
