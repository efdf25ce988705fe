"""``simpipe bench engine``: the embedded engine alone vs. the pipeline, same prompts.

Rows, run one after another on the same machine, each with its model already loaded and
the first ``n_parallel`` prompts sent once before the clock starts (prompt caches and
first-batch allocations are a one-off cost a long run amortises):

1. raw engine: xllamacpp called directly, one thread per slot (the fastest in-process
   set-up measured), no Dask, no Parquet, the answer grammar sent as the pipeline sends it
   (llguidance); then with llama.cpp's GBNF grammar, and without a grammar (what each form
   of the constraint costs: its throughput against the others');
2. pipeline, ``llamacpp`` back-end: a full round through Dask (one worker process that
   plays two partitions at a time, so the slots never drain between partitions); then the
   same with ``agents.reproducible = true`` (calls one at a time: what reproducibility costs);
3. pipeline, ``openai`` back-end against llama.cpp's HTTP server (the same engine,
   ``python -m simpipe.servers.llamacpp_server``) on localhost.

All three get the prompts the pipeline renders for round 1 of the same population, the same
grammar and the same per-agent seeds.
"""

from __future__ import annotations

import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

from simpipe.agents.base import Turn
from simpipe.agents.llm import build_requests
from simpipe.agents.registry import warm_policy
from simpipe.config.model import Config, config_from_dict
from simpipe.core.memory import PeakMemory
from simpipe.core.tables import markdown_table
from simpipe.games.parsing import parse_many
from simpipe.games.registry import game_for
from simpipe.inference.base import GenerationRequest
from simpipe.inference.llamacpp.completions import request_body
from simpipe.inference.llamacpp.engine_setup import (
    build_has_llguidance,
    build_params,
    open_engine,
    server_constraint,
)
from simpipe.inference.llamacpp.model_files import resolve_model_path
from simpipe.run.console import Console
from simpipe.run.population import ensure_population
from simpipe.run.simulation import run_simulation
from simpipe.servers.llamacpp_server import LlamaCppProcess
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_population, read_rounds

FORMATS = {"prompts_per_s": "{:.2f}", "gen_tokens_per_s": "{:.1f}", "p50_latency_s": "{:.2f}",
           "p95_latency_s": "{:.2f}", "wall_s": "{:.1f}", "ratio_to_raw": "{:.2f}",
           "peak_rss_gib": "{:.2f}"}


def engine_config(agents: int, n_parallel: int, output_dir: Path, backend: str = "llamacpp",
                  endpoint: str | None = None) -> Config:
    raw: dict = {
        "run": {"name": f"engine-{backend}", "seed": 11, "output_dir": str(output_dir)},
        "population": {"size": agents, "partitions": min(4, agents),
                       "attributes": {"age": {"min": 18, "max": 80},
                                      "education": {"values": {"High School": 1,
                                                               "Bachelor's Degree": 1,
                                                               "Ph.D.": 1}}}},
        "game": {"rounds": 1},
        # One call per agent: the engine's own speed is what is compared (shared answers
        # have their own benchmark, `simpipe bench share`).
        "agents": {"backend": backend, "max_tokens": 6, "share_answers": "off",
                   "llamacpp": {"n_parallel": n_parallel}},
        "cluster": {"kind": "local", "workers": 1, "threads_per_worker": 2,
                    "dashboard_address": ""},
    }
    if endpoint:
        # The server is this xllamacpp build: the answer grammar goes in the form the raw
        # engine's row sends it.
        raw["agents"]["openai"] = {"endpoints": [endpoint], "max_concurrency": n_parallel,
                                   "constraint": server_constraint()}
    return config_from_dict(raw)


def _requests(config: Config) -> list[GenerationRequest]:
    """Round-1 requests exactly as the pipeline's LLM policy builds them."""
    population = read_population(config.run_dir)
    turn = Turn(game_for(config.game), config.run.seed, 0, 0, np.empty((len(population), 0)))
    return build_requests(population, turn, "completion", config.agents)


def _latency_row(name: str, latencies: np.ndarray, tokens_out: int, wall: float) -> dict:
    n = len(latencies)
    return {
        "engine": name, "prompts": n, "wall_s": wall, "prompts_per_s": n / wall,
        "gen_tokens_per_s": tokens_out / wall,
        "p50_latency_s": float(np.percentile(latencies, 50)),
        "p95_latency_s": float(np.percentile(latencies, 95)),
    }


RAW_ROWS = {
    "pipeline": "raw engine (xllamacpp, in-process threads)",
    "gbnf": "raw engine, GBNF answer grammar",
    "none": "raw engine, no answer grammar",
}


def raw_engine(requests: list[GenerationRequest], n_parallel: int, model_path: Path,
               grammar: str = "pipeline") -> dict:
    """xllamacpp alone: one blocking call per request from n_parallel threads.

    ``grammar``: "pipeline" sends the answer constraint as the ``llamacpp`` back-end does
    (llguidance when the build has it); "gbnf" forces llama.cpp's own GBNF grammar; "none"
    sends no grammar (the answers are then read by the tolerant parser, as the valid share
    says): what each costs is its throughput against the others'.
    """
    server = open_engine(build_params(model_path, n_parallel=n_parallel, n_ctx=0, threads=0))
    if grammar == "none":
        requests = [replace(r, constraint=None) for r in requests]
    llguidance = grammar == "pipeline" and build_has_llguidance()
    bodies = [request_body(r, cache_prompt=True, llguidance=llguidance)[1] for r in requests]
    texts: list[str | None] = [None] * len(bodies)

    def call(i: int) -> tuple[float, int]:
        start = time.perf_counter()
        response = server.handle_completions(bodies[i])
        texts[i] = response["choices"][0]["text"]
        return time.perf_counter() - start, int(response["usage"]["completion_tokens"])

    with ThreadPoolExecutor(n_parallel) as pool:
        # Warm-up; the pipeline rows get the same.
        list(pool.map(call, range(min(n_parallel, len(bodies)))))
        start = time.perf_counter()
        results = list(pool.map(call, range(len(bodies))))
        wall = time.perf_counter() - start
    server = None  # the last reference: ~Server frees the model before the next row
    row = _latency_row(RAW_ROWS[grammar], np.array([r[0] for r in results]),
                       sum(r[1] for r in results), wall)
    _, statuses = parse_many(texts, 0, 100)
    return row | {"valid_share": float(np.mean(statuses == "ok"))}


def _pipeline_row(name: str, config: Config, client: Client,
                  warm: list[GenerationRequest]) -> dict:
    # Load the model and send the raw engine's warm-up prompts first, in the worker, as a
    # long run amortises both.
    client.run(warm_policy, config.agents, warm)
    result = run_simulation(config, client=client, force=True, console=Console(quiet=True))
    rows = read_rounds(config.run_dir)
    ok = (rows["status"] == "ok").mean()
    row = _latency_row(name, rows["latency_s"].to_numpy(), int(rows["tokens_out"].sum()),
                       result.round_times[0])
    row["valid_share"] = ok
    return row


def _local_cluster() -> LocalCluster:
    return LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                        dashboard_address=None, silence_logs=logging.ERROR)


def run_engine_bench(agents: int, n_parallel: int = 32) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="simpipe-engine-") as tmp:
        out = Path(tmp)
        config = engine_config(agents, n_parallel, out)
        model = resolve_model_path(config.agents.llamacpp)
        with _local_cluster() as cluster, Client(cluster) as client:
            ensure_population(client, config, RunPaths(config.run_dir))
            requests = _requests(config)
            warm = requests[:n_parallel]
            for grammar in RAW_ROWS:
                with PeakMemory() as mem:
                    row = raw_engine(requests, n_parallel, model, grammar)
                rows.append(row | {"peak_rss_gib": mem.peak_gib})
            with PeakMemory() as mem:
                row = _pipeline_row("pipeline: llamacpp back-end via Dask", config, client, warm)
            rows.append(row | {"peak_rss_gib": mem.peak_gib})
            # What bit-reproducible per-agent calls cost: the same, one at a time.
            serial = config.model_copy(update={"agents": config.agents.model_copy(
                update={"reproducible": True})})
            with PeakMemory() as mem:
                row = _pipeline_row("pipeline: llamacpp, reproducible = true", serial, client,
                                    warm)
            rows.append(row | {"peak_rss_gib": mem.peak_gib})
        with LlamaCppProcess(parallel=n_parallel, model=model) as server:
            openai = engine_config(agents, n_parallel, out, backend="openai",
                                   endpoint=server.url)
            with _local_cluster() as cluster, Client(cluster) as client, PeakMemory() as mem:
                row = _pipeline_row("pipeline: openai back-end -> llama.cpp server", openai,
                                    client, warm)
            rows.append(row | {"peak_rss_gib": mem.peak_gib})
    base = rows[0]["prompts_per_s"]
    for row in rows:
        row["ratio_to_raw"] = row["prompts_per_s"] / base
    return rows


def format_table(rows: list[dict]) -> str:
    return markdown_table(rows, FORMATS | {"valid_share": "{:.0%}"})
