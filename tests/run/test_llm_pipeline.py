"""LLM agents end to end: the real Gemma model, in a Dask worker and behind a real
llama.cpp HTTP server."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.llamacpp_server import LlamaCppProcess
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_ledger, read_population, read_rounds, read_summary

from support import small_config

pytestmark = [pytest.mark.llm, pytest.mark.slow]
QUIET = Console(quiet=True)


@pytest.fixture(scope="module")
def llm_client():
    # One worker: one model copy, llama.cpp uses both cores inside it.
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            yield client


def llm_config(tmp_path, **sections):
    base = {"population": {"size": 16, "partitions": 2},
            "game": {"rounds": 2},
            "agents": {"backend": "llamacpp", "max_tokens": 4,
                       "llamacpp": {"n_parallel": 8}}}
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return small_config(tmp_path, **base)


def test_embedded_model_plays_two_rounds_with_memory(llm_client, tmp_path):
    # One call per agent (the shared path is tested below).
    config = llm_config(tmp_path / "a", agents={"share_answers": "off"})
    run_simulation(config, client=llm_client, console=QUIET)
    rows = read_rounds(config.run_dir)
    assert rows.groupby("round").size().tolist() == [16, 16]
    ok = rows["status"] == "ok"
    assert ok.mean() >= 0.9  # the grammar admits only numbers in range
    assert rows.loc[ok, "guess"].between(0, 100).all()
    assert rows.loc[~ok, "status"].isin(["unparsed", "out_of_range", "error"]).all()
    assert rows["raw"].notna().all() and (rows["tokens_out"] > 0).all()
    # Round 2 prompts carry each agent's own answer and the announced winning number.
    by_round = rows.groupby("round")["tokens_in"].mean()
    assert by_round[2] > by_round[1] + 10  # rounds numbered from 1
    summary = read_summary(config.run_dir)
    assert summary["n_valid"].sum() == ok.sum()
    ledger = read_ledger(config.run_dir)
    assert ledger.endpoints["llamacpp"]["requests"] == 32


PERSONAS = {"population": {"size": 48, "partitions": 2,
                          "persona": {"mode": "template",
                                      "template": "You have a {education} education."}}}


def test_agents_with_the_same_prompt_share_one_answer_distribution(llm_client, tmp_path):
    config = llm_config(tmp_path / "s", **PERSONAS)
    run_simulation(config, client=llm_client, console=QUIET)
    rows = read_rounds(config.run_dir)
    assert rows.groupby("round").size().tolist() == [48, 48]
    # Round 1: 8 agents per prompt in each partition, all shared. Round 2: a prompt also
    # names the agent's own answer; one held by a single agent of a partition is a call.
    assert rows.loc[rows["round"] == 1, "shared"].all()
    assert (rows["status"] == "ok").all()
    assert rows["raw"].str.fullmatch(r" ?\d+").all()
    ledger = read_ledger(config.run_dir)
    first, second = ledger.round(0), ledger.round(1)
    # Round 1: one prompt per education level; round 2 adds each agent's own answer.
    assert first.distinct_prompts == 3
    assert first.sharing_factor == 16.0
    assert first.shared_agents == 48 and first.fallback_prompts == 0
    assert 3 <= first.model_calls <= 3 * 40  # a tree per prompt, not a call per agent
    assert second.distinct_prompts > 3
    assert second.shared_agents + second.model_calls >= 48
    assert 0 <= first.unseen_mass_max <= 1e-4
    # Every token spent is on some agent's row, and the engine's counters agree.
    counters = ledger.endpoints["llamacpp"]
    assert rows["tokens_in"].sum() == counters["tokens_in"]
    assert first.model_calls + second.model_calls == counters["requests"]
    # Agents with the same prompt do not all give the same answer: they draw.
    round1 = rows[rows["round"] == 1]
    assert round1.groupby(read_population(config.run_dir)["education"].to_numpy())[
        "guess"].nunique().min() > 1


def test_same_seed_gives_the_same_guesses(llm_client, tmp_path):
    # Default settings (8 slots): shared answers are computed one lone sequence at a time,
    # so two runs draw the same answers.
    a = llm_config(tmp_path / "a", **PERSONAS)
    b = llm_config(tmp_path / "b", **PERSONAS)
    run_simulation(a, client=llm_client, console=QUIET)
    run_simulation(b, client=llm_client, console=QUIET)
    ga, gb = read_rounds(a.run_dir), read_rounds(b.run_dir)
    np.testing.assert_array_equal(ga["guess"].to_numpy(), gb["guess"].to_numpy())


def test_reproducible_per_agent_calls_give_the_same_guesses(llm_client, tmp_path):
    # One call per agent with several slots: agents.reproducible runs a batch's calls one
    # at a time, each batch starting from a clean slot.
    agents = {"share_answers": "off", "reproducible": True}
    a = llm_config(tmp_path / "a", game={"rounds": 1}, agents=agents)
    b = llm_config(tmp_path / "b", game={"rounds": 1}, agents=agents)
    run_simulation(a, client=llm_client, console=QUIET)
    run_simulation(b, client=llm_client, console=QUIET)
    ga, gb = read_rounds(a.run_dir), read_rounds(b.run_dir)
    np.testing.assert_array_equal(ga["raw"].to_numpy(), gb["raw"].to_numpy())
    assert not ga["shared"].any()


def test_openai_backend_survives_a_server_killed_mid_round(tmp_path):
    with LlamaCppProcess(parallel=2) as first, LlamaCppProcess(parallel=2) as second:
        config = llm_config(
            tmp_path, population={"size": 24, "partitions": 4}, game={"rounds": 1},
            agents={"backend": "openai",
                    "openai": {"endpoints": [first.url, second.url], "max_concurrency": 2,
                               "retries": 3, "backoff_s": 0.05, "timeout_s": 60}},
        )
        paths = RunPaths(config.run_dir)

        def kill_after_first_partition() -> None:
            while not (paths.round_dir(0).exists() and any(paths.round_dir(0).glob("part-*"))):
                time.sleep(0.02)
            first.kill()

        killer = threading.Thread(target=kill_after_first_partition, daemon=True)
        killer.start()
        with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            run_simulation(config, client=client, console=QUIET)
        killer.join(timeout=5)
        assert first.proc.poll() is not None  # it really was killed mid-round

    rows = read_rounds(config.run_dir)
    assert len(rows) == 24 and rows["agent_id"].is_unique
    assert set(rows["status"]) <= {"ok", "error", "unparsed", "out_of_range"}
    assert (rows["status"] == "ok").sum() >= 20  # the survivor served the rest
    endpoints = read_ledger(config.run_dir).endpoints
    assert set(endpoints) == {first.url.rstrip("/"), second.url.rstrip("/")}
    survivor = max(endpoints.values(), key=lambda c: c["requests"])
    assert survivor["errors"] == 0
    assert sum(c["requests"] for c in endpoints.values()) >= 24
