"""SLURM job logs go under the run's folder (or the persistent cluster's), never into the
directory simpipe was started from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simpipe.cluster.process_identity import check_manager

from cluster_helpers import our_jobs, wait_no_jobs

TOML = """
[run]
name = "logs"
seed = 3
output_dir = "{output_dir}"
[population]
size = 200
partitions = 2
[game]
rounds = 1
[agents]
backend = "scripted"
[cluster]
kind = "slurm"
jobs = 1
cores = 1
memory = "1GB"
walltime = "00:10:00"
interface = "lo"
dashboard_address = ""
"""


def simpipe(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"SIMPIPE_HOME": str(home)} if home else {})}
    proc = subprocess.run([sys.executable, "-m", "simpipe.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "logs.toml"
    path.write_text(TOML.format(output_dir=tmp_path / "out"))
    (tmp_path / "cwd").mkdir()
    return path


@pytest.mark.slurm
@pytest.mark.slow
def test_run_job_logs_go_under_the_run_folder(tmp_path, config, slurm_controller):
    simpipe("run", str(config), cwd=tmp_path / "cwd")
    assert list((tmp_path / "cwd").iterdir()) == []
    logs = sorted(p.name for p in (tmp_path / "out" / "logs" / "logs" / "slurm").iterdir())
    # dask-jobqueue names them <job name>-<job id>.out/.err
    ids = {name.rsplit("-", 1)[1].split(".")[0] for name in logs
           if name.startswith("simpipe-worker-")}
    assert ids, logs
    assert not ids & set(our_jobs("simpipe-worker")), "the run left its worker job behind"


@pytest.mark.slurm
@pytest.mark.slow
def test_cluster_up_logs_to_the_cluster_folder_and_down_stops_its_manager(
        tmp_path, config, simpipe_home, slurm_controller):
    cwd = tmp_path / "cwd"
    simpipe("cluster", "up", str(config), "--name", "t13", cwd=cwd, home=simpipe_home)
    try:
        state = json.loads((simpipe_home / "clusters" / "t13.json").read_text())
        assert check_manager(state).verdict == "ours"
        assert state["manager_cmdline"][-3:] == ["-m", "simpipe.run.manager", "t13"]
    finally:
        simpipe("cluster", "down", "t13", cwd=cwd, home=simpipe_home)
    assert check_manager(state).verdict == "gone"
    assert not wait_no_jobs("simpipe-t13-", 30)
    assert list(cwd.iterdir()) == []
    logs = sorted(p.name for p in (simpipe_home / "clusters" / "t13" / "logs").iterdir())
    assert any(name.startswith("simpipe-t13-worker-") for name in logs), logs


def test_sbatch_script_logs_under_the_run_folder(tmp_path, config):
    script = simpipe("sbatch", str(config), "--output", "-", cwd=tmp_path / "cwd").stdout
    log_dir = tmp_path / "out" / "logs" / "logs" / "slurm"
    assert f"#SBATCH --output={log_dir}/%x-%j.out" in script.splitlines()
    assert log_dir.is_dir()  # SLURM does not create it; the job would fail to start
    assert list((tmp_path / "cwd").iterdir()) == []
