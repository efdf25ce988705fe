"""The round plan (simpipe.answers.round_plan): a round's distinct prompts merged over the
partitions, the ones worth a distribution cut into chunks that do not depend on the workers,
and each distribution's cost charged to one partition."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from distributed import Client, LocalCluster

from simpipe.answers.distribution import AnswerDistribution, WalkedAnswers
from simpipe.answers.round_plan import (
    EMPTY_HASHES,
    TREE_PROMPT_S,
    WALK_PROMPT_S,
    PlannedChunk,
    PromptTally,
    chunk_size,
    layout,
    planned_for,
    plans_rounds,
    prompt_group,
    prompt_tally,
    walk_chunk_size,
    walkers_of,
)
from simpipe.answers.shared import Lookup, prompt_hash
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.results import read_ledger, read_rounds

from support import small_config


def tally(partition: int, counts: dict[int, int], played: bool = True) -> PromptTally:
    hashes = np.array(sorted(counts), np.uint64)
    return PromptTally(partition, played, hashes,
                       np.array([counts[h] for h in hashes.tolist()], np.int64))


def test_a_prompt_worth_a_distribution_is_counted_over_all_partitions():
    # Prompt 7 has one agent in each of two partitions: worth one distribution for the round,
    # though neither partition alone would share it. Prompt 9 has one agent in all.
    plan = layout([tally(0, {7: 1, 5: 30}), tally(1, {7: 1, 9: 1, 5: 2})], min_agents=2)
    assert plan.distinct == 3
    assert [c.tolist() for c in plan.chunks] == [[5], [7]]  # two prompts: one task each
    assert plan.planned == 2
    # The lowest-numbered partition holding a prompt carries its cost, once.
    assert {k: v.tolist() for k, v in plan.owned.items()} == {0: [5, 7]}


def test_few_prompts_are_spread_over_tasks_and_many_are_chunks_of_eight():
    # The chunk size depends on the number of planned prompts only (never on the workers):
    # round 1's few shared prompts become at least 2 tasks, a big round chunks of 8.
    assert [chunk_size(n) for n in (1, 4, 8, 10, 16, 32, 33, 1010)] == [1, 2, 4, 5, 8, 8, 8, 8]
    tallies = [tally(0, {h: 2 for h in range(8)})]
    assert [c.size for c in layout(tallies, min_agents=2).chunks] == [4, 4]


def test_chunks_are_fixed_size_in_hash_order_whatever_order_tallies_arrive_in():
    tallies = [tally(k, {h: 2 for h in range(k * 10, k * 10 + 15)}) for k in range(4)]
    a = layout(tallies, min_agents=2, chunk_prompts=4)
    b = layout(list(reversed(tallies)), min_agents=2, chunk_prompts=4)
    flat = np.concatenate(a.chunks)
    assert flat.tolist() == sorted(set(flat.tolist())) == list(range(45))
    assert [c.size for c in a.chunks] == [4] * 11 + [1]
    assert [c.tolist() for c in a.chunks] == [c.tolist() for c in b.chunks]
    assert {k: v.tolist() for k, v in a.owned.items()} == \
        {k: v.tolist() for k, v in b.owned.items()}
    # Prompts 10-14 are in partitions 0 and 1: partition 0 pays for them.
    assert set(range(10, 15)) <= set(a.owned[0].tolist())
    assert not set(range(10, 15)) & set(a.owned[1].tolist())


def test_prompts_that_differ_only_in_their_last_lines_share_chunks():
    # Two groups whose hashes interleave: ordered by group, then hash, each chunk holds one
    # group's prompts (its chain then evaluates only their last lines).
    hashes = np.arange(16, dtype=np.uint64)
    groups = np.where(hashes % 2 == 0, 100, 50).astype(np.uint64)
    plan = layout([PromptTally(0, True, hashes, np.full(16, 2, np.int64), groups)],
                  min_agents=2, chunk_prompts=4)
    assert [c.tolist() for c in plan.chunks] == [[1, 3, 5, 7], [9, 11, 13, 15],
                                                  [0, 2, 4, 6], [8, 10, 12, 14]]
    assert [a.tolist() for a in plan.agents] == [[2] * 4] * 4
    prompt = "Rules.\nYou are a teacher.\nWinning number: 26.\nYour number: 35.\nMy number:"
    assert prompt_group(prompt) == prompt_group(prompt.replace("35", "7"))
    assert prompt_group(prompt) != prompt_group(prompt.replace("teacher", "nurse"))


def test_a_resumed_round_plans_only_prompts_of_partitions_still_to_play():
    # Partition 0's file is on disk: its agents count for the rule (prompt 3's two agents
    # make it worth a distribution, as in the first attempt), but a prompt only it holds
    # needs none, and it pays for nothing.
    plan = layout([tally(0, {3: 1, 4: 50}, played=False), tally(1, {3: 1, 6: 1})],
                  min_agents=2)
    assert plan.distinct == 3
    assert [c.tolist() for c in plan.chunks] == [[3]]
    assert {k: v.tolist() for k, v in plan.owned.items()} == {1: [3]}


def test_the_embedded_engine_walks_every_prompt_once_for_the_whole_round():
    # Prompt 7: 5 agents over two partitions, walked once by the plan, not once in each
    # partition; prompt 5 (32 agents) is walked too: its agents probe only the nodes their
    # draws reach, never more than its full tree; prompt 8 is held only by a partition
    # already on disk: nothing to plan.
    tallies = [tally(0, {7: 2, 5: 30}), tally(1, {7: 3, 9: 1, 5: 2}),
               tally(2, {8: 1}, played=False)]
    plan = layout(tallies, min_agents=2, lazy_walks=True)
    assert plan.chunks == []
    assert [c.tolist() for c in plan.walk_chunks] == [[5, 7], [9]]  # two tasks at least
    assert plan.planned == 3
    assert plan.methods["walk"] == {"prompts": 4, "agents": 39}
    assert plan.methods["tree"] == {"prompts": 0, "agents": 0}
    assert {k: v.tolist() for k, v in plan.owned.items()} == {0: [5, 7], 1: [9]}
    # Without the embedded engine's lazy walks, rare prompts are the partitions' business.
    assert layout(tallies, min_agents=2).walk_chunks == []


def test_walk_chunks_depend_on_the_prompts_alone():
    # The fewest chunks of at most 256 (two at least), of about one size each.
    assert [walk_chunk_size(n) for n in (1, 2, 3, 89, 512, 513, 948, 54000)] == \
        [1, 1, 2, 45, 256, 171, 237, 256]
    tallies = [tally(k, {h: 1 for h in range(k * 200, k * 200 + 210)}) for k in range(4)]
    a = layout(tallies, min_agents=2, lazy_walks=True)
    b = layout(list(reversed(tallies)), min_agents=2, lazy_walks=True)
    assert [c.tolist() for c in a.walk_chunks] == [c.tolist() for c in b.walk_chunks]
    assert np.concatenate(a.walk_chunks).tolist() == list(range(810))
    assert [c.size for c in a.walk_chunks] == [203] * 3 + [201]


def test_a_walk_gets_the_ids_of_its_agents_in_each_partition():
    # Agents 100-105 hold prompts "a", "b", "a", "c", "a", "b" (codes 0, 1, 0, 2, 0, 1).
    found = prompt_tally(0, True, np.array([0, 1, 0, 2, 0, 1]), ["a", "b", "c"],
                         np.arange(100, 106))
    a, b, c = (prompt_hash(k) for k in "abc")
    got = walkers_of(found, np.array([a, c], np.uint64))
    assert {h: v.tolist() for h, v in got.items()} == {a: [100, 102, 104], c: [103]}
    assert walkers_of(found, EMPTY_HASHES) == {}


def test_no_partitions_no_plan():
    plan = layout([], min_agents=2)
    assert plan.distinct == 0 and plan.chunks == [] and plan.planned == 0


def distribution(calls: int) -> AnswerDistribution:
    return AnswerDistribution((" 1", " 2"), np.array([0.25, 0.75]), 0.0, calls, 100, calls)


def test_only_the_owning_partition_is_charged_for_a_distribution():
    chunk = PlannedChunk(
        ["prompt a", "prompt b", "prompt c"], [11, 12, 13],
        [Lookup(distribution(22), True, 22, 100, 22),
         Lookup(None, True, 40, 300, 40, "too much unseen"),
         Lookup(distribution(25), False, 0, 0, 0)])  # found in the worker's cache
    mine = planned_for([chunk], np.array([11, 12, 13], np.uint64))
    other = planned_for([chunk], np.array([], np.uint64))
    # A prompt not pinned down is not planned: its agents are answered without the plan.
    assert sorted(mine) == sorted(other) == ["prompt a", "prompt c"]
    assert (mine["prompt a"].calls, mine["prompt a"].tokens_in) == (22, 100)
    assert (other["prompt a"].calls, other["prompt a"].tokens_in) == (0, 0)
    assert mine["prompt c"].calls == 0  # this run spent nothing on it
    np.testing.assert_array_equal(other["prompt a"].probs, [0.25, 0.75])


@pytest.mark.parametrize(("agents", "game", "planned"), [
    ({"backend": "llamacpp"}, {}, True),
    ({"backend": "llamacpp", "share_answers": "off"}, {}, False),
    ({"backend": "llamacpp"}, {"prompt": "cot"}, False),
    ({"backend": "scripted"}, {}, False),
])
def test_rounds_are_planned_only_where_agents_share_answers(tmp_path, agents, game, planned):
    assert plans_rounds(small_config(tmp_path, agents=agents, game=game)) is planned


def _play_on(workers: int, config) -> None:
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            run_simulation(config, client=client, console=Console(quiet=True))


@pytest.mark.llm
@pytest.mark.slow
def test_the_same_seed_gives_the_same_guesses_on_one_worker_and_on_two(tmp_path):
    # The real embedded model; round 1's three prompts (8 agents each) are planned and
    # computed on whichever worker; round 2's prompts carry each agent's own answer, too few
    # agents each for a full tree, so the plan walks each prompt's agents lazily, once, in
    # chunks of walks that do not depend on the workers either.
    sections = {"population": {"size": 24, "partitions": 3,
                               "persona": {"mode": "template",
                                           "template": "You have a {education} education."}},
                "game": {"rounds": 2},
                "agents": {"backend": "llamacpp", "max_tokens": 4,
                           "llamacpp": {"n_parallel": 4}}}
    one, two = small_config(tmp_path / "one", **sections), small_config(tmp_path / "two",
                                                                          **sections)
    _play_on(1, one)
    _play_on(2, two)
    a, b = read_rounds(one.run_dir), read_rounds(two.run_dir)
    np.testing.assert_array_equal(a["guess"].to_numpy(), b["guess"].to_numpy())
    np.testing.assert_array_equal(a["shared"].to_numpy(), b["shared"].to_numpy())
    assert a.loc[a["round"] == 1, "shared"].all()
    for config, rows in ((one, a), (two, b)):
        ledger = read_ledger(config.run_dir)
        first, second = ledger.round(0), ledger.round(1)
        assert first.planned_prompts == first.distinct_prompts == 3
        assert second.planned_prompts == second.distinct_prompts > 0
        assert second.answer_methods["walk"]["prompts"] == second.distinct_prompts
        assert second.answer_methods["walk"]["agents"] == 24 and second.model_calls > 0
        # Each distribution was computed once, whatever the workers: the tokens on the
        # rows and the model calls in the record are what the engines counted.
        counters = ledger.endpoints["llamacpp"]
        assert rows["tokens_in"].sum() == counters["tokens_in"]
        assert first.model_calls + second.model_calls == counters["requests"]


def test_a_planned_walk_hands_each_partition_its_agents_answers_and_charges_one():
    walked = WalkedAnswers(np.array([3, 8, 20]), (" 12", None, " 40"), 1e-6, 4, 19, 4)
    chunk = PlannedChunk(["prompt w"], [31], [Lookup(walked, True, 4, 19, 4)])
    mine = planned_for([chunk], np.array([31], np.uint64))["prompt w"]
    other = planned_for([chunk], EMPTY_HASHES)["prompt w"]
    assert (mine.calls, mine.tokens_in, other.calls, other.tokens_in) == (4, 19, 0, 0)
    # Agent 8's walk reached a prefix that could not be pinned down, and agent 5 was never
    # walked: both get calls of their own (None), never another agent's answer.
    uniforms = np.zeros((4, 4))
    assert other.answers_for(np.array([20, 8, 3, 5]), uniforms) == [" 40", None, " 12", None]


def test_a_plans_tasks_are_weighed_by_method_and_size_in_submission_order():
    tallies = [tally(0, {1: 20, 2: 20, 3: 1, 4: 1, 5: 1})]
    trees = layout(tallies, min_agents=2)  # a back-end without lazy walks: trees
    assert [c.size for c in trees.chunks] == [1, 1] and trees.walk_chunks == []
    assert trees.chunk_work() == pytest.approx([TREE_PROMPT_S, TREE_PROMPT_S])
    walks = layout(tallies, min_agents=2, lazy_walks=True)
    assert walks.chunks == [] and [c.size for c in walks.walk_chunks] == [3, 2]
    assert walks.chunk_work() == pytest.approx([3 * WALK_PROMPT_S, 2 * WALK_PROMPT_S])
