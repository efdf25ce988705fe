"""SLURMCluster workers on the real local SLURM: a round runs, and a worker job cancelled
mid-round still leaves exactly one row per agent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpipe.config.model import config_from_dict
from simpipe.run.simulation import run_simulation
from simpipe.store.results import read_rounds

from cluster_helpers import our_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _raw(tmp_path: Path, name: str, **agents: object) -> dict:
    return {
        "run": {"name": name, "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 2000, "partitions": 8},
        "game": {"rounds": 1},
        "agents": {"backend": "scripted", "scripted": agents},
        "cluster": {"kind": "slurm", "jobs": 2, "cores": 1, "memory": "1GB",
                    "walltime": "00:10:00", "interface": "lo", "dashboard_address": "",
                    "log_directory": str(tmp_path / "logs")},
    }


def test_two_worker_jobs_run_a_round(tmp_path: Path, no_jobs_left: None) -> None:
    result = run_simulation(config_from_dict(_raw(tmp_path, "two")))
    rounds = result.rounds()
    assert len(rounds) == 2000 and rounds["agent_id"].is_unique
    assert (rounds["status"] == "ok").all()


def test_worker_job_cancelled_mid_round(tmp_path: Path, no_jobs_left: None) -> None:
    raw = _raw(tmp_path, "cancel", latency_s=1.5)
    raw["population"]["partitions"] = 12
    cfg = tmp_path / "c.toml"
    cfg.write_text(_toml(raw))
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.cli", "run", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    part_dir = tmp_path / "results/cancel/rounds/round=1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(part_dir.glob("part-*.parquet")):
        time.sleep(0.2)
    assert list(part_dir.glob("part-*.parquet")), "the round never started"
    workers = our_jobs("simpipe-worker")
    assert len(workers) == 2
    subprocess.run(["scancel", workers[0]], check=True)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    rounds = read_rounds(tmp_path / "results/cancel")
    assert len(rounds) == 2000 and rounds["agent_id"].is_unique


def _toml(raw: dict, prefix: str = "") -> str:
    lines, tables = [], []
    for key, value in raw.items():
        if isinstance(value, dict):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(f"{key} = {_value(value)}")
    text = "\n".join(lines) + "\n"
    for name, table in tables:
        text += f"[{name}]\n" + _toml(table, f"{name}.")
    return text


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value)
