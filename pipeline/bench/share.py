"""``simpipe bench share``: LLM agents at the cost of their distinct prompts.

Runs a whole simulation with the embedded model (by default the paper's population,
education x gender as template personas: 10 distinct personas) and prints, per round, the
agents, distinct prompts, sharing factor, model calls, wall time, agents/s and the peak RSS
of the process tree during the round. The reference row, in the same run, is the per-agent
path: one sampled call per agent for a sample of the same round-1 agents, on the same model
and settings, in this process.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simpipe.agents.base import Turn
from simpipe.agents.llm import build_requests
from simpipe.aio import run_async
from simpipe.config import Config, apply_override, config_from_dict
from simpipe.inference.llamacpp import LlamaCppBackend
from simpipe.memory import PeakMemory
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.results import read_ledger, read_population
from simpipe.tables import markdown_table

FORMATS = {"agents": "{:,}", "distinct_prompts": "{:,}", "sharing_factor": "{:,.1f}",
           "model_calls": "{:,}", "wall_s": "{:.1f}", "agents_per_s": "{:,.1f}",
           "peak_rss_gib": "{:.2f}", "x_per_agent": "{:,.0f}"}
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
        "cluster": {"kind": "local", "workers": 1, "threads_per_worker": 2,
                    "dashboard_address": ""},
    }
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw, source="bench share")


def per_agent_reference(config: Config, sample: int) -> dict:
    """One sampled call per agent for the first ``sample`` agents' round-1 prompts."""
    population = read_population(config.run_dir).iloc[:sample]
    turn = Turn(config.game, config.run.seed, 0, 0, np.empty((len(population), 0)))
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


def run_share_bench(config: Config | None, agents: int, rounds: int, sample: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="simpipe-share-") as tmp:
        out = Path(tmp)
        if config is None:
            config = default_config(agents, rounds, out)
        else:
            config = config.model_copy(update={"run": config.run.model_copy(
                update={"output_dir": str(out), "name": "share-bench"})})
        with PeakMemory(interval_s=0.25, timeline=True) as rss:
            run_simulation(config, console=Console(quiet=True))
        ledger = read_ledger(config.run_dir)
        rows = []
        for r, rec in ledger.finished_rounds().items():
            start, wall = rec.started_at or 0.0, rec.elapsed_s or 0.0
            rows.append({
                "case": f"shared answers, round {r + 1}", "agents": rec.n,
                "distinct_prompts": rec.distinct_prompts,
                "sharing_factor": rec.sharing_factor, "model_calls": rec.model_calls,
                "wall_s": wall, "agents_per_s": rec.agents_per_s,
                "peak_rss_gib": rss.peak_gib_between(start, start + wall),
                "valid": rec.n_valid / rec.n,
            })
        reference = per_agent_reference(config, sample)
    for row in [*rows, reference]:
        row["x_per_agent"] = row["agents_per_s"] / reference["agents_per_s"]
    return [*rows, reference]


def format_table(rows: list[dict]) -> str:
    return markdown_table(rows, FORMATS | {"valid": "{:.1%}"})
