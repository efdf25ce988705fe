"""Personas through the population build: a real Dask cluster, an injected junk back-end
(the one test double), the cache, and the real embedded model."""

import json
import sys
from collections.abc import Sequence

import cloudpickle
import pandas as pd
import pytest

from simpipe.config.model import ConfigError, config_from_dict
from simpipe.inference.base import Backend, GenerationRequest, GenerationResult
from simpipe.run.persona_build import process_request_count
from simpipe.run.population import ensure_population
from simpipe.store.layout import RunPaths

# Workers import by name what they can; this module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ATTRS = {
    "gender": {"values": {"female": 1, "male": 1}},
    "age": {"min": 20, "max": 70},
    "education": {"values": {"High School": 1, "Ph.D.": 1}},
}


class JunkBackend(Backend):
    """Answers every request with text that fails the persona checks."""

    def __init__(self, agents) -> None:
        self.calls = 0

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.calls += len(requests)
        return [GenerationResult(text="Name:\nName:\nName:", finish_reason="length")
                for _ in requests]


def junk_factory(agents):
    return JunkBackend(agents)


def llm_config(tmp_path, size=12, partitions=3, **persona):
    return config_from_dict({
        "run": {"name": "p", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": size, "partitions": partitions, "attributes": ATTRS,
                       "persona": {"mode": "llm", "retries": 1,
                                   "template": "A {age}-year-old {gender} ({education}).",
                                   **persona}},
        "agents": {"backend": "scripted"},
    })


def requests_on_workers(client) -> int:
    return sum(client.run(process_request_count).values())


def test_junk_falls_back_to_the_template_and_the_cache_makes_zero_calls(dask_client, tmp_path):
    config = llm_config(tmp_path)
    before = requests_on_workers(dask_client)
    out = ensure_population(dask_client, config, RunPaths(config.run_dir),
                            backend_factory=junk_factory)
    frame = pd.read_parquet(out)
    assert len(frame) == 12 and list(frame["agent_id"]) == list(range(12))  # none dropped
    assert (frame["persona_source"] == "template_fallback").all()
    row = frame.iloc[0]
    assert row["persona"] == f"A {row['age']}-year-old {row['gender']} ({row['education']})."
    first = requests_on_workers(dask_client) - before
    assert first == 12 * 2  # first try + one retry each
    meta = json.loads((out / "_population.json").read_text())
    assert meta["persona"]["sources"] == {"template_fallback": 12}
    assert meta["persona"]["this_build"]["llm_requests"] == 24
    assert meta["persona"]["generator"]["backend"] == "llamacpp"
    assert len(meta["persona"]["prompt_hash"]) == 16

    # Same spec, generator and meta-prompt: a second run reuses the cache, zero calls.
    again = config.model_copy(update={"run": config.run.model_copy(update={"name": "q"})})
    ensure_population(dask_client, again, RunPaths(again.run_dir), backend_factory=junk_factory)
    assert requests_on_workers(dask_client) - before == first
    meta = json.loads((again.run_dir / "population" / "_population.json").read_text())
    assert meta["persona"]["this_build"] == {"partitions_built": 0, "llm_requests": 0,
                                             "tokens_out": 0, "rejected": {}}


def test_generator_and_spec_are_part_of_the_cache_key(tmp_path):
    base = llm_config(tmp_path)
    model = tmp_path / "x.gguf"  # a model_path must name a GGUF file: its header will do
    model.write_bytes(b"GGUF" + bytes([3, 0, 0, 0]) + bytes(16))
    other_model = llm_config(tmp_path, agents={"llamacpp": {"model_path": str(model)}})
    other_spec = llm_config(tmp_path, max_chars=300)
    template = llm_config(tmp_path, mode="template")
    hashes = {c.population_hash() for c in (base, other_model, other_spec, template)}
    assert len(hashes) == 4
    # Where the same model runs (slots, endpoints) is not part of the key.
    more_slots = llm_config(tmp_path, agents={"llamacpp": {"n_parallel": 4}})
    assert more_slots.population_hash() == base.population_hash()


@pytest.mark.parametrize("agents,message", [
    ({"backend": "scripted"}, r"population.persona.agents.backend = 'scripted'"),
    ({"temperature": 0.5}, r"unknown key population.persona.agents.temperature"),
    ({"backend": "vllm"}, r"population.persona.agents.backend"),
])
def test_generator_config_errors_name_the_key(tmp_path, agents, message):
    with pytest.raises(ConfigError, match=message):
        llm_config(tmp_path, agents=agents)


@pytest.mark.slow
@pytest.mark.llm
def test_real_embedded_model_writes_personas(dask_client, tmp_path):
    config = llm_config(tmp_path, size=6, partitions=2, retries=2,
                        agents={"llamacpp": {"n_parallel": 6}})
    out = ensure_population(dask_client, config, RunPaths(config.run_dir))
    frame = pd.read_parquet(out)
    assert len(frame) == 6 and frame["persona"].str.len().gt(0).all()
    assert set(frame["persona_source"]) <= {"llm", "template_fallback"}
    for _, row in frame[frame["persona_source"] == "llm"].iterrows():
        assert row["persona"].startswith("I am a") and f"{row['age']}-year-old" in row["persona"]
        assert "My name is" in row["persona"]
    meta = json.loads((out / "_population.json").read_text())
    assert meta["persona"]["generator"]["model"].startswith("gemma-3-270m")
    assert sum(meta["persona"]["sources"].values()) == 6
