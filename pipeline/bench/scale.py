"""``simpipe bench scale``: scripted agents through the whole pipeline at growing N.

Each case runs the real pipeline (population build, one Dask task per partition, Parquet
writes, reduce) on a fresh local cluster, timed end to end, and the same agents' decisions
in this process without Dask (the "raw" row: the policy called directly on each partition
in turn) so the ratio shows what the distribution costs or gains.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simpipe.agents.base import Turn
from simpipe.agents.registry import build_policy
from simpipe.config.model import Config, config_from_dict
from simpipe.core.memory import PeakMemory
from simpipe.core.tables import markdown_table
from simpipe.games.registry import game_for
from simpipe.personas.sampling import sample_partition
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation


@dataclass
class ScaleCase:
    agents: int
    rounds: int
    latency_s: float
    partitions: int
    workers: int
    threads: int


#: The benchmarks' population: two attributes, no personas.
ATTRIBUTES = {
    "education": {"values": {"High School": 1, "Bachelor's Degree": 1, "Ph.D.": 1}},
    "age": {"min": 18, "max": 80},
}


def bench_config(case: ScaleCase, output_dir: Path) -> Config:
    return config_from_dict({
        "run": {"name": f"scale-{case.agents}", "seed": 7, "output_dir": str(output_dir)},
        "population": {"size": case.agents, "partitions": case.partitions,
                       "attributes": ATTRIBUTES},
        "game": {"rounds": case.rounds},
        "agents": {"backend": "scripted", "scripted": {"latency_s": case.latency_s}},
        "cluster": {"kind": "local", "workers": case.workers,
                    "threads_per_worker": case.threads, "dashboard_address": ""},
    })


def run_case(case: ScaleCase, raw: bool = True) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="simpipe-bench-") as tmp:
        config = bench_config(case, Path(tmp))
        with PeakMemory() as mem:
            start = time.perf_counter()
            result = run_simulation(config, console=Console(quiet=True))
            wall = time.perf_counter() - start
        agent_rounds = case.agents * case.rounds
        rows.append({
            "case": "pipeline", "agents": case.agents, "rounds": case.rounds,
            "latency_s": case.latency_s, "partitions": case.partitions,
            "workers_x_threads": f"{case.workers}x{case.threads}",
            "wall_s": wall, "rounds_s": sum(result.round_times),
            "agents_per_s": agent_rounds / wall,
            "us_per_agent_round": 1e6 * sum(result.round_times) / agent_rounds,
            "peak_rss_gib": mem.peak_gib,
            "first_mean": float(result.summary.loc[result.summary["round"] == 1, "mean"].iloc[0]),
        })
        if raw:
            rows.append(_raw_case(case, config))
    base = rows[-1]["agents_per_s"] if raw else None
    for row in rows:
        row["ratio_to_raw"] = row["agents_per_s"] / base if base else None
    return rows


def _raw_case(case: ScaleCase, config: Config) -> dict:
    """The same policy on the same partitions, in this process, one after another."""
    policy = build_policy(config.agents)
    game = game_for(config.game)
    with PeakMemory() as mem:
        start = time.perf_counter()
        for r in range(case.rounds):
            for k in range(case.partitions):
                agents = sample_partition(config.population, config.run.seed, k)
                past = np.full((len(agents), r), 30.0)
                turn = Turn(game, config.run.seed, r, k, past)
                policy.decide(agents, turn)
        wall = time.perf_counter() - start
    agent_rounds = case.agents * case.rounds
    return {
        "case": "raw (1 process, no Dask)", "agents": case.agents, "rounds": case.rounds,
        "latency_s": case.latency_s, "partitions": case.partitions, "workers_x_threads": "1x1",
        "wall_s": wall, "rounds_s": wall, "agents_per_s": agent_rounds / wall,
        "us_per_agent_round": 1e6 * wall / agent_rounds, "peak_rss_gib": mem.peak_gib,
        "first_mean": float("nan"),
    }


FORMATS = {
    "wall_s": "{:.2f}", "rounds_s": "{:.2f}", "agents_per_s": "{:,.0f}",
    "us_per_agent_round": "{:.2f}", "peak_rss_gib": "{:.2f}", "first_mean": "{:.2f}",
    "ratio_to_raw": "{:.2f}", "agents": "{:,}",
}


def format_table(rows: list[dict]) -> str:
    return markdown_table(rows, FORMATS)
