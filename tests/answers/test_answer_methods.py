"""The round plan's choice, per distinct prompt, between an answer tree, requests with ``n``
samples and one request per agent: by the back-end's cost model, on the round's counts
only (the same for one partition or many), recorded per round in run.json."""

from __future__ import annotations

import numpy as np
import pytest

from simpipe.answers.planner import METHODS, AnswerCosts, answer_costs, record_spent
from simpipe.answers.round_plan import PromptTally, layout
from simpipe.answers.shared import prompt_hash
from simpipe.inference.cost_model import VLLM_A100_LLAMA3_8B, CostModel
from simpipe.servers.emulator_profiles import PROFILES

from support import small_config

A100 = PROFILES["a100-llama3-8b"].cost_model()


def costs(cap: int = 1, trees: bool = True, model: CostModel = A100) -> AnswerCosts:
    return AnswerCosts(model, trees, cap, tree_probes=22, answer_tokens=3)


def chosen(c: AnswerCosts, agents: list[int], tokens: int = 120, own: int = 20) -> list[str]:
    k = np.array(agents)
    return [METHODS[i] for i in c.choose(k, np.full(k.size, tokens), np.full(k.size, own))]


def test_few_agents_get_requests_of_their_own_many_a_tree():
    got = chosen(costs(), [1, 2, 4, 20, 200, 20_000])
    assert got[:3] == ["per_agent"] * 3 and got[3:] == ["tree"] * 3


def test_with_n_samples_offered_a_tree_pays_only_for_many_agents():
    got = chosen(costs(cap=128), [1, 2, 10, 20, 60, 2000])
    assert got == ["per_agent", "samples", "samples", "samples", "tree", "tree"]
    # without trees (no answer distributions) samples answer every shared prompt
    assert chosen(costs(cap=128, trees=False), [1, 5, 2000]) == ["per_agent", "samples",
                                                                  "samples"]


def test_without_prefix_caching_each_probe_evaluates_the_whole_prompt():
    uncached = CostModel(A100.prefill_s_per_token, A100.decode_s_per_token, 0.0, 0)
    k = [10, 60, 200, 2000]
    assert chosen(costs(cap=128, model=uncached), k) == ["samples", "samples", "samples",
                                                          "tree"]
    assert chosen(costs(cap=128), k) == ["samples", "tree", "tree", "tree"]


def test_prices_are_sums_of_the_cost_models_requests():
    c = costs(cap=4)
    per_agent, samples, tree = c.prices(np.array([10]), np.array([120]), np.array([20]))[:, 0]
    first = A100.request_cost_s(120, 0, A100.cached(120, 100))
    assert per_agent == pytest.approx(10 * A100.request_cost_s(120, 3, A100.cached(120, 100)))
    assert samples == pytest.approx(3 * first + 30 * A100.decode_s_per_token)
    probe = (A100.request_cost_s(121, 1, 112) + A100.request_cost_s(122, 1, 112)) / 2
    assert tree == pytest.approx(first + A100.decode_s_per_token + 21 * probe)


def tally(partition: int, held: dict[int, int], tokens: int = 120) -> PromptTally:
    hashes = np.array(sorted(held), np.uint64)
    n = hashes.size
    return PromptTally(partition, True, hashes, np.array([held[h] for h in sorted(held)],
                                                         np.int64),
                       None, np.full(n, tokens, np.int64), np.full(n, 20, np.int64))


def test_the_choice_is_the_same_on_one_partition_or_many():
    rng = np.random.default_rng(5)
    held = {int(prompt_hash(f"p{i}")): int(k) for i, k in
            enumerate(rng.choice([1, 3, 12, 40, 90, 700], size=60))}
    one = layout([tally(0, held)], min_agents=2, costs=costs(cap=16))
    split: list[dict[int, int]] = [{}, {}, {}, {}]
    for h, k in held.items():  # each prompt's agents spread over the four partitions
        for j, share in enumerate(np.bincount(rng.integers(0, 4, k), minlength=4).tolist()):
            if share:
                split[j][h] = share
    many = layout([tally(j, part) for j, part in enumerate(split)], min_agents=2,
                  costs=costs(cap=16))
    assert [c.tolist() for c in one.chunks] == [c.tolist() for c in many.chunks]
    for name in METHODS:
        assert one.methods[name] == many.methods[name]
    assert sum(one.methods[m]["agents"] for m in METHODS) == sum(held.values())
    assert sum(one.methods[m]["prompts"] for m in METHODS) == len(held)
    assert one.methods["tree"]["prompts"] > 0 and one.methods["samples"]["prompts"] > 0
    # the prediction counts the requests the partitions send: a prompt in four partitions
    # is up to four requests of samples
    assert many.methods["predicted_gpu_s"] >= one.methods["predicted_gpu_s"] > 0
    assert one.methods["spent_gpu_s"] is None


def test_costs_come_from_the_emulated_profile_or_the_back_ends_default(tmp_path):
    agents = {"backend": "openai", "share_answers": "auto",
              "openai": {"answer_distributions": "vllm", "n_per_request": 64}}
    real = answer_costs(small_config(tmp_path, agents=agents))
    assert real.model == VLLM_A100_LLAMA3_8B and (real.trees, real.samples_cap) == (True, 64)
    emulated = answer_costs(small_config(tmp_path, agents=agents, cluster={
        "servers": {"kind": "emulated", "emulated": {
            "profile": "h100-llama3-8b", "params": {"block_size": 32}}}}))
    h100 = PROFILES["h100-llama3-8b"].cost_model()
    assert emulated.model.prefill_s_per_token == h100.prefill_s_per_token
    assert emulated.model.prefix_block == 32
    own = answer_costs(small_config(tmp_path, agents={**agents, "cost": {
        "prefill_s_per_token": 1e-3, "prefix_block_tokens": 0, "tree_probes": 30}}))
    assert (own.model.prefill_s_per_token, own.model.prefix_block) == (1e-3, 0)
    assert own.model.decode_s_per_token == VLLM_A100_LLAMA3_8B.decode_s_per_token
    assert own.tree_probes == 30
    tgi = answer_costs(small_config(tmp_path, agents={"backend": "tgi"}))
    assert tgi is None  # nothing but one request per agent to choose from


def test_the_default_vllm_costs_are_the_a100_profiles():
    assert VLLM_A100_LLAMA3_8B.prefill_s_per_token == pytest.approx(A100.prefill_s_per_token,
                                                                    rel=1e-3)
    assert VLLM_A100_LLAMA3_8B.decode_s_per_token == pytest.approx(A100.decode_s_per_token,
                                                                   rel=1e-3)
    assert VLLM_A100_LLAMA3_8B.prefix_block == A100.prefix_block


def test_set_costs_change_the_results_hash_and_defaults_do_not(tmp_path):
    plain = small_config(tmp_path)
    assert small_config(tmp_path, agents={"cost": {"tree_probes": 22.0}}).results_hash() \
        == plain.results_hash()
    assert small_config(tmp_path, agents={"cost": {"tree_probes": 30}}).results_hash() \
        != plain.results_hash()


def test_spent_is_the_emulated_fleets_work_per_round():
    est = {"servers_read": 4, "rounds": [{"round": 1, "ideal_s": 2.5},
                                         {"round": 2, "ideal_s": 0.25}]}
    assert record_spent(est) == {0: 10.0, 1: 1.0}
    assert record_spent(None) == {}
