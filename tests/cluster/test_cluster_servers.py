"""`simpipe cluster up/status/down` with llama.cpp servers as SLURM jobs, `run --cluster`
against them, fail-over when a server job is cancelled mid-round, and `simpipe sbatch`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from simpipe.store.results import read_ledger, read_rounds

from cluster_helpers import our_jobs, simpipe, wait_no_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PORT = 18731  # far from the defaults other tests' servers use


def _config(tmp_path: Path, size: int, partitions: int) -> Path:
    cfg = tmp_path / "llm.toml"
    cfg.write_text(f"""
[run]
name = "llm"
output_dir = "{tmp_path / 'results'}"
[population]
size = {size}
partitions = {partitions}
[game]
rounds = 1
[agents]
backend = "openai"
max_tokens = 6
[agents.openai]
max_concurrency = 2
timeout_s = 60
retries = 8
backoff_max_s = 2
[cluster]
kind = "slurm"
jobs = 1
memory = "1GB"
walltime = "00:15:00"
interface = "lo"
dashboard_address = ""
[cluster.servers]
kind = "llamacpp"
per_node = 2
cpus_per_server = 1
memory = "1GB"
port = {PORT}
extra_args = "--parallel 2"
startup_timeout_s = 240
""")
    return cfg


def _server_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "llamacpp_server" in cmd and (f"--port {PORT} " in cmd or f"--port {PORT + 1} " in cmd):
            found.append(p)
    return found


def test_cluster_up_run_failover_down(tmp_path: Path, simpipe_home: Path,
                                      no_jobs_left: None) -> None:
    cfg = _config(tmp_path, 24, 6)
    try:
        up = simpipe("cluster", "up", str(cfg), "--name", "t")
        assert "server 1: http://127.0.0.1:" in up.stdout
        state = json.loads((simpipe_home / "clusters/t.json").read_text())
        assert state["state"] == "ready" and len(state["servers"]) == 2
        status = json.loads(simpipe("cluster", "status", "t", "--json").stdout)
        assert [s["health"] for s in status["servers"]] == ["ok", "ok"]
        assert len(status["workers"]) == 1
        assert {j["state"] for j in status["jobs"]} == {"RUNNING"} and len(status["jobs"]) == 3

        # A server job cancelled mid-round: the other one takes the rest.
        proc = subprocess.Popen(
            ["simpipe", "run", str(cfg), "--cluster", "t"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        part_dir = tmp_path / "results/llm/rounds/round=1"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(part_dir.glob("part-*.parquet")):
            time.sleep(0.2)
        subprocess.run(["scancel", state["servers"][0]["job_id"]], check=True)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        rounds = read_rounds(tmp_path / "results/llm")
        assert len(rounds) == 24 and rounds["agent_id"].is_unique
        assert (rounds["status"] != "error").all(), rounds["error"].dropna().tolist()
        counters = read_ledger(tmp_path / "results/llm").endpoints
        survivor = state["servers"][1]["url"]
        assert counters[survivor]["requests"] - counters[survivor]["errors"] > 0
        status = json.loads(simpipe("cluster", "status", "t", "--json").stdout)
        assert status["servers"][0]["health"] != "ok"  # reported as down
    finally:
        simpipe("cluster", "down", "t", check=False)
    assert wait_no_jobs("simpipe-t-") == []
    assert not (simpipe_home / "clusters/t.json").exists()
    deadline = time.monotonic() + 20
    while _server_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _server_processes() == []
    managers = [p for p in psutil.process_iter(["cmdline"])
                if " ".join(p.info["cmdline"] or []).endswith("simpipe.run.manager t")]
    assert managers == []


def test_run_with_servers_for_one_run(tmp_path: Path, no_jobs_left: None) -> None:
    """kind = "slurm" with [cluster.servers] and no --cluster: servers live for the run."""
    cfg = _config(tmp_path, 8, 2)
    out = simpipe("run", str(cfg), "--set", f"cluster.log_directory={tmp_path / 'logs'}").stdout
    assert "servers healthy" in out
    rounds = read_rounds(tmp_path / "results/llm")
    assert len(rounds) == 8 and (rounds["status"] == "ok").sum() >= 6
    assert our_jobs("simpipe-run-llm") == [] or wait_no_jobs("simpipe-run-llm") == []


def test_sbatch_script_runs(tmp_path: Path, no_jobs_left: None) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text(f"""
[run]
name = "batch"
output_dir = "{tmp_path / 'results'}"
[population]
size = 3000
partitions = 4
[game]
rounds = 2
[cluster]
kind = "slurm"
memory = "1GB"
walltime = "00:10:00"
interface = "lo"
dashboard_address = ""
""")
    script = tmp_path / "run.sbatch"
    simpipe("sbatch", str(cfg), "--output", str(script), "--overcommit", "--mem", "3GB",
            "--job-log", str(tmp_path / "job.out"))
    done = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True,
                          timeout=300, check=False)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, log
    rounds = read_rounds(tmp_path / "results/batch")
    assert len(rounds) == 6000
    assert read_ledger(tmp_path / "results/batch").state == "finished"
