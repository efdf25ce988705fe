"""Emulated GPU servers as a SLURM job through the cluster code: one job serving two emulated
GPUs on consecutive ports, a small pipeline through them, the estimate at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpipe.store.results import read_rounds

from cluster_helpers import simpipe, wait_no_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PORT = 18840  # far from the defaults other tests' servers use


def test_emulated_servers_as_one_slurm_job_serve_a_run(tmp_path: Path, no_jobs_left: None):
    cfg = tmp_path / "emu.toml"
    cfg.write_text(f"""
[run]
name = "emu"
output_dir = "{tmp_path / 'results'}"
[population]
size = 600
partitions = 3
[game]
rounds = 2
[agents]
backend = "tgi"
[agents.tgi]
max_concurrency = 16
[cluster]
kind = "slurm"
jobs = 1
memory = "1GB"
walltime = "00:15:00"
interface = "lo"
dashboard_address = ""
log_directory = "{tmp_path / 'logs'}"
[cluster.servers]
kind = "emulated"
per_node = 2
memory = "512MB"
port = {PORT}
startup_timeout_s = 120
[cluster.servers.emulated]
profile = "a100-llama3-8b"
time_scale = 10
gpus_per_process = 2
""")
    out = simpipe("run", str(cfg)).stdout
    assert "servers: 2 in 1 SLURM job(s) submitted" in out
    assert f"http://127.0.0.1:{PORT}, http://127.0.0.1:{PORT + 1}" in out
    rounds = read_rounds(tmp_path / "results/emu")
    assert len(rounds) == 1200 and (rounds["status"] == "ok").all()
    run = json.loads((tmp_path / "results/emu/run.json").read_text())
    counters = run["endpoints"]
    assert set(counters) == {f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT + 1}"}
    assert all(c["requests"] > 0 for c in counters.values())  # both GPUs took work
    est = run["estimate"]
    assert (est["servers"], est["servers_read"], est["time_scale"]) == (2, 2, 10)
    assert [r["round"] for r in est["rounds"]] == [1, 2]
    assert "Estimate for the real run (2 x 1x A100 80GB" in out
    assert wait_no_jobs("simpipe-run-emu") == []
