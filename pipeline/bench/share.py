"""``simpipe bench share``: LLM agents at the cost of their distinct prompts.

Runs a whole simulation with the embedded model (by default the paper's population,
education x gender as template personas: 10 distinct personas) and prints, per round, the
agents, distinct prompts, sharing factor, model calls, wall time, agents/s and the peak RSS
of the process tree during the round. The reference row, in the same run, is the per-agent
path: one sampled call per agent for a sample of the same round-1 agents, on the same model
and settings, in this process.

Other cases (``--case``): ``paper``, the same default config at 1,000 agents x 5 rounds;
``openai``, that run through the ``openai`` back-end to a llama.cpp HTTP server started by
the bench (the same model; no per-agent reference row); ``emulate``, 1M agents x 3 rounds as
a dry run (``--emulate``) against emulated vLLM servers (32 A100 by default), once with
sharing (``share_answers = "auto"``) and once without (``"off"``), each round with the
emulated GPU-seconds its requests took, their ratio, and how the round plan answered its
distinct prompts (prompts per method: an answer tree, ``n`` samples per request, one request
per agent; ``simpipe.answers.planner``) with the GPU-seconds it predicted. Every row
reports what the back-end did: the distinct prompts, model calls and GPU time the run records.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simpipe.agents.base import Turn
from simpipe.agents.llm import build_requests
from simpipe.answers.planner import METHODS
from simpipe.config.model import Config, apply_override, config_from_dict
from simpipe.core.aio import run_async
from simpipe.core.memory import PeakMemory
from simpipe.core.tables import markdown_table
from simpipe.games.registry import game_for
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.engine_setup import server_constraint
from simpipe.inference.llamacpp.model_files import resolve_model_path
from simpipe.run.console import Console
from simpipe.run.server_slots import connections_that_fit
from simpipe.run.simulation import run_simulation
from simpipe.servers.llamacpp_server import LlamaCppProcess
from simpipe.store.results import read_ledger, read_population
from simpipe.store.round_record import RoundRecord

FORMATS = {"agents": "{:,}", "distinct_prompts": "{:,}", "sharing_factor": "{:,.1f}",
           "model_calls": "{:,}", "wall_s": "{:.1f}", "agents_per_s": "{:,.1f}",
           "peak_rss_gib": "{:.2f}", "x_per_agent": "{:,.0f}", "gpu_s": "{:,.3f}",
           "gpu_s_ratio": "{:.3f}", "predicted_gpu_s": "{:,.3f}",
           **{f"{name}_prompts": "{:,}" for name in METHODS}}
#: ``--case``: (agents, rounds) when not given.
CASES = {"default": (1_000_000, 2), "paper": (1_000, 5), "openai": (1_000, 5),
         "emulate": (1_000_000, 3)}
EMULATED_PROFILE = "a100-llama3-8b"
#: Samples per request when the emulated fleet shares (OpenAI's cap on `n`; vLLM takes more).
EMULATED_N = 128
PAPER_EDUCATION = ("Elementary School", "High School", "Bachelor's Degree", "Master's Degree",
                   "Ph.D.")


def default_config(agents: int, rounds: int, output_dir: Path,
                   overrides: Sequence[str] = ()) -> Config:
    """The paper's population (education x gender, template personas), embedded model;
    ``key=value`` overrides (``--set``) applied last. ConfigError naming a bad one."""
    raw = {
        "run": {"name": "share-bench", "seed": 42, "output_dir": str(output_dir)},
        "population": {
            "size": agents, "partitions": max(2, min(16, agents // 10_000)),
            "attributes": {"education": {"values": dict.fromkeys(PAPER_EDUCATION, 0.2)},
                           "gender": {"values": {"female": 0.5, "male": 0.5}}},
            "persona": {"mode": "template",
                        "template": "You are a {gender} person whose highest level of "
                                    "education is {education}."},
        },
        "game": {"rounds": rounds},
        "agents": {"backend": "llamacpp", "max_tokens": 6, "llamacpp": {"n_parallel": 8}},
        # Two single-thread engines: 1,000 agents x 5 rounds took 5 min 19 s so, 7 min 41 s
        # on one two-thread worker (docs/benchmarks.md): lone probe chains do not scale
        # with threads as well as two chains side by side do.
        "cluster": {"kind": "local", "workers": 2, "threads_per_worker": 1,
                    "dashboard_address": ""},
    }
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw, source="bench share")


def per_agent_reference(config: Config, sample: int) -> dict:
    """One sampled call per agent for the first ``sample`` agents' round-1 prompts."""
    population = read_population(config.run_dir).iloc[:sample]
    turn = Turn(game_for(config.game), config.run.seed, 0, 0, np.empty((len(population), 0)))
    requests = build_requests(population, turn, "completion", config.agents)
    backend = LlamaCppBackend(config.agents.llamacpp)
    try:
        warm = config.agents.llamacpp.n_parallel
        run_async(backend.generate(requests[:warm]))  # as a long run amortises the first batch
        start = time.perf_counter()
        with PeakMemory(interval_s=0.25) as rss:
            results = run_async(backend.generate(requests))
        wall = time.perf_counter() - start
    finally:
        run_async(backend.aclose())
    return {"case": "one call per agent, round 1 (the reference)", "agents": len(requests),
            "distinct_prompts": len({r.prompt for r in requests}), "sharing_factor": None,
            "model_calls": len(requests), "wall_s": wall, "agents_per_s": len(requests) / wall,
            "peak_rss_gib": rss.peak_gib,
            "valid": sum(r.status == "ok" for r in results) / len(results)}


def _in(config: Config, out: Path, name: str = "share-bench") -> Config:
    return config.model_copy(update={"run": config.run.model_copy(
        update={"output_dir": str(out), "name": name})})


def _round_rows(config: Config, label: str, emulate: bool = False) -> list[dict]:
    """Run ``config`` and return one row per round from its run.json (with the emulated
    fleet's GPU-seconds per round when ``emulate``)."""
    with PeakMemory(interval_s=0.25, timeline=True) as rss:
        result = run_simulation(config, console=Console(quiet=True), emulate=emulate)
    ledger = read_ledger(result.run_dir)
    estimate = {r["round"] - 1: r for r in (ledger.estimate or {}).get("rounds", [])}
    gpus = (ledger.estimate or {}).get("gpus", 0)
    rows = []
    for r, rec in ledger.finished_rounds().items():
        start, wall = rec.started_at or 0.0, rec.elapsed_s or 0.0
        row = {
            "case": f"{label}, round {r + 1}", "agents": rec.n,
            "distinct_prompts": rec.distinct_prompts,
            "sharing_factor": rec.sharing_factor, "model_calls": rec.model_calls,
            "wall_s": wall, "agents_per_s": rec.agents_per_s,
            "peak_rss_gib": rss.peak_gib_between(start, start + wall),
            "valid": rec.n_valid / rec.n if rec.n else 0.0,
        }
        if emulate:
            # The fleet's modelled work in the round: per-server mean x servers x GPUs each.
            row["gpu_s"] = (estimate[r]["ideal_s"] * gpus if r in estimate else None)
            row.update(_method_columns(rec))
        rows.append(row)
    return rows


def _method_columns(rec: RoundRecord) -> dict:
    """How the round plan answered the round's distinct prompts (``answer_methods``): prompts
    per method and its predicted GPU-seconds; a round without a plan (sharing off) sent one
    request per agent."""
    methods = rec.answer_methods or {"per_agent": {"prompts": rec.distinct_prompts}}
    return {f"{name}_prompts": (methods.get(name) or {}).get("prompts", 0)
            for name in METHODS} | {"predicted_gpu_s": methods.get("predicted_gpu_s")}


def run_share_bench(config: Config | None, agents: int, rounds: int, sample: int,
                    case: str = "default", servers: int = 32,
                    time_scale: float = 20.0) -> list[dict]:
    """The table's rows for ``case`` (``CASES``); ``config`` replaces the default config
    of the ``default`` and ``paper`` cases."""
    if case == "openai":
        return _openai_rows(config or default_config(agents, rounds, Path("results")))
    if case == "emulate":
        return _emulated_rows(agents, rounds, servers, time_scale)
    with tempfile.TemporaryDirectory(prefix="simpipe-share-") as tmp:
        out = Path(tmp)
        config = _in(config or default_config(agents, rounds, out), out)
        rows = _round_rows(config, "shared answers")
        reference = per_agent_reference(config, sample)
    for row in [*rows, reference]:
        row["x_per_agent"] = row["agents_per_s"] / reference["agents_per_s"]
    return [*rows, reference]


def format_table(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))  # every row's, in order
    return markdown_table([{c: row.get(c) for c in columns} for row in rows],
                          FORMATS | {"valid": "{:.1%}"})


def _openai_rows(config: Config) -> list[dict]:
    """The config's run through the ``openai`` back-end to a llama.cpp server (the model of
    ``[agents.llamacpp]``) that the bench starts and stops, sharing answers over HTTP the
    way that server allows (``answer_distributions = "llamacpp"``), the answer grammar in
    llguidance's form, and as many connections from all workers together as it has slots."""
    embedded = config.agents.llamacpp
    model = resolve_model_path(embedded)
    processes = config.cluster.most_worker_processes or 1
    with tempfile.TemporaryDirectory(prefix="simpipe-share-") as tmp, \
            LlamaCppProcess(parallel=embedded.n_parallel, model=model) as server:
        raw = config.model_dump(mode="json")
        raw["agents"]["backend"] = "openai"
        raw["agents"]["openai"] = {**raw["agents"].get("openai", {}),
                                   "endpoints": [server.url],
                                   # every worker's connections together fill the
                                   # server's slots and no more (docs/shared-answers.md)
                                   "max_concurrency": connections_that_fit(
                                       embedded.n_parallel, processes),
                                   "answer_distributions": "llamacpp",
                                   # the server is this xllamacpp build, which has llguidance
                                   "constraint": server_constraint()}
        served = _in(config_from_dict(raw, source="bench share --case openai"), Path(tmp))
        return _round_rows(served, "openai -> llama.cpp server")


def emulated_config(agents: int, rounds: int, servers: int, time_scale: float,
                    share: str, output_dir: Path) -> Config:
    """The paper's population answered by ``servers`` emulated vLLM servers (OpenAI routes,
    one A100 each), for ``simpipe run --emulate``."""
    config = default_config(agents, rounds, output_dir, (
        f"agents.share_answers={share}", "agents.backend=openai"))
    raw = config.model_dump(mode="json")
    raw["run"]["name"] = f"share-emulated-{share}"
    raw["agents"]["openai"] = {**raw["agents"].get("openai", {}),
                               "endpoints": [f"http://gpu-{i:02d}:8000"
                                             for i in range(servers)],
                               # The emulated servers speak vLLM's log-probability routes:
                               # sharing computes answer distributions through them, and the
                               # agents of a prompt whose distribution is not worth it (or
                               # not pinned down by the top 20) share requests with n samples.
                               "answer_distributions": "vllm" if share != "off" else "off",
                               "n_per_request": EMULATED_N if share != "off" else 1}
    raw["cluster"]["servers"] = {**raw["cluster"].get("servers", {}),
                                 "emulated": {"profile": EMULATED_PROFILE,
                                              "time_scale": time_scale}}
    return config_from_dict(raw, source="bench share --case emulate")


def _emulated_rows(agents: int, rounds: int, servers: int, time_scale: float) -> list[dict]:
    rows: list[dict] = []
    totals = {}
    with tempfile.TemporaryDirectory(prefix="simpipe-share-") as tmp:
        for share in ("auto", "off"):
            config = emulated_config(agents, rounds, servers, time_scale, share, Path(tmp))
            got = _round_rows(config, f"emulated {servers} x A100 (vLLM), sharing {share}",
                              emulate=True)
            totals[share] = sum(r["gpu_s"] or 0.0 for r in got)
            rows += got
    per_round = len(rows) // 2
    for auto, off in zip(rows[:per_round], rows[per_round:], strict=True):
        if auto.get("gpu_s") is not None and off.get("gpu_s"):
            auto["gpu_s_ratio"] = auto["gpu_s"] / off["gpu_s"]  # this round, auto / off
    rows.append({"case": "emulated GPU-seconds, sharing auto / off",
                 "gpu_s": totals["auto"],
                 "gpu_s_ratio": totals["auto"] / totals["off"] if totals["off"] else None})
    return rows
