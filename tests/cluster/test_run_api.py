"""The Python API with ``[cluster.servers]`` on SLURM: ``run_simulation`` submits the server
jobs, waits until they are healthy, points the agents at them, runs, and cancels them; the
run's worker jobs end with it too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import simpipe
from simpipe.cluster import slurm
from simpipe.store.results import read_ledger, read_rounds

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PORT = 18870  # far from the defaults other tests' servers use


def _jobs_still_listed(ids: set[str], timeout: float = 60.0) -> list[str]:
    """The job ids among ``ids`` that squeue still lists after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := sorted(set(slurm.jobs(job_ids=sorted(ids))) & ids)) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_run_simulation_starts_server_jobs_runs_on_them_and_leaves_no_job(
        tmp_path: Path, slurm_controller: None, capsys) -> None:
    logs = tmp_path / "logs"
    config = simpipe.config_from_dict({
        "run": {"name": "api", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 200, "partitions": 2},
        "game": {"rounds": 2},
        "agents": {"backend": "tgi", "tgi": {"max_concurrency": 16}},
        "cluster": {
            "kind": "slurm", "jobs": 1, "memory": "1GB", "walltime": "00:15:00",
            "interface": "lo", "dashboard_address": "", "log_directory": str(logs),
            "servers": {"kind": "emulated", "per_node": 2, "memory": "512MB", "port": PORT,
                        "startup_timeout_s": 120,
                        "emulated": {"profile": "fast", "time_scale": 10,
                                     "gpus_per_process": 2}},
        },
    })
    result = simpipe.run_simulation(config)
    out = capsys.readouterr().out
    urls = [f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT + 1}"]
    assert "servers: 2 in 1 SLURM job(s) submitted, waiting for health" in out
    assert f"servers healthy: {', '.join(urls)}" in out
    rounds = read_rounds(result.run_dir)
    assert len(rounds) == 400 and (rounds["status"] == "ok").all()
    ledger = read_ledger(result.run_dir)
    assert ledger.state == "finished"
    assert sorted(ledger.endpoints) == urls
    assert all(c["requests"] > 0 for c in ledger.endpoints.values())
    # Every job this run started (named in its job logs): the server job and the worker job.
    ids = {p.stem.rsplit("-", 1)[1] for p in logs.glob("*.out")}
    assert {p.name.split("-")[1] for p in logs.glob("*.out")} == {"run", "worker"}
    assert _jobs_still_listed(ids) == []
