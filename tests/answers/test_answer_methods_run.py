"""A planned run against emulated vLLM servers records, per round, how its distinct prompts
were answered (``answer_methods`` in run.json): prompts and agents per method, the cost the
plan predicted and what the emulated fleet spent."""

from __future__ import annotations

import pytest

import simpipe
from simpipe.answers.planner import METHODS
from simpipe.cluster.config import AddressClusterConfig
from simpipe.run.console import Console
from simpipe.store.results import read_ledger

from support import small_config

pytestmark = pytest.mark.slow


def test_run_json_records_each_rounds_answer_methods(tmp_path, dask_client):
    config = small_config(
        tmp_path,
        population={"size": 240, "partitions": 2,
                    "persona": {"mode": "template",
                                "template": "Your highest level of education is {education}."}},
        game={"rounds": 2},
        agents={"backend": "openai", "max_tokens": 6,
                "openai": {"answer_distributions": "vllm", "n_per_request": 16,
                           "model": "m"}})
    config = config.with_sections(cluster=AddressClusterConfig(
        address=dask_client.scheduler.address,
        servers={"kind": "emulated", "per_node": 2,
                 "emulated": {"profile": "a100-llama3-8b", "time_scale": 200,
                              "protocol": "openai", "model_id": "m",
                              "gpus_per_process": 2}}))
    result = simpipe.run_simulation(config, console=Console(quiet=True))
    ledger = read_ledger(result.run_dir)
    rounds = ledger.finished_rounds()
    assert len(rounds) == 2
    for rec in rounds.values():
        methods = rec.answer_methods
        assert sum(methods[m]["agents"] for m in METHODS) == rec.n == 240
        assert sum(methods[m]["prompts"] for m in METHODS) == rec.distinct_prompts
        assert methods["tree"]["prompts"] == rec.planned_prompts
        # the other prompts got calls: no partition computed a distribution of its own
        assert rec.shared_agents <= methods["tree"]["agents"]
        assert methods["predicted_gpu_s"] > 0 and methods["spent_gpu_s"] > 0
        assert methods["cost_model"] == "emulator profile a100-llama3-8b"
    # round 1: three personas, 80 agents each: a tree each; round 2: each agent's own
    # answer in its prompt, a few agents per prompt: requests
    assert rounds[0].answer_methods["tree"] == {"prompts": 3, "agents": 240}
    assert rounds[1].answer_methods["tree"]["prompts"] < rounds[1].distinct_prompts
