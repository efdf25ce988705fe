"""SLURM worker jobs that sbatch refuses end the run within seconds, with sbatch's own
words on one line (not after `cluster.start_timeout_s` with AssertionError tracebacks);
an adaptive cluster from zero workers starts its jobs for the round's tasks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simpipe.config.model import config_from_dict
from simpipe.run.population import build_population
from simpipe.run.simulation import run_simulation

from cluster_helpers import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONFIG = """
[run]
name = "refused"
output_dir = "results"
[population]
size = 100
partitions = 2
[game]
rounds = 1
[agents]
backend = "scripted"
[cluster]
kind = "slurm"
jobs = 1
walltime = "00:10:00"
interface = "lo"
dashboard_address = ""
"""


def run_cli(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "c.toml").write_text(CONFIG)
    # start_timeout_s stays at its default, 600 s: the run must not wait for it.
    return subprocess.run([sys.executable, "-m", "simpipe.cli", "run", "c.toml", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def assert_one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "AssertionError" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    return line


def test_an_unknown_partition_is_sbatchs_own_message(tmp_path, slurm_controller):
    line = assert_one_line(run_cli(tmp_path, "--set", 'cluster.queue="nope"'))
    assert "invalid partition specified: nope" in line and "cluster.queue" in line


def test_a_job_sbatch_rejects_at_submission_is_its_message(tmp_path, slurm_controller):
    """A job the site's limits refuse only when it is submitted (a QOS job limit): the
    `--test-only` check passes, the submission fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --test-only "*) exec ' + shutil.which("sbatch") + ' "$@";; esac\n'
        "echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2\n"
        "echo 'sbatch: error: Batch job submission failed: Job violates accounting/QOS "
        "policy (job submit limit, user'\"'\"'s size and/or time limits)' >&2\n"
        "exit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    line = assert_one_line(run_cli(tmp_path, env=env))
    assert "QOSMaxSubmitJobPerUserLimit" in line and "job submit limit" in line


def test_adapt_from_zero_jobs_plays_the_run(tmp_path, no_jobs_left, dask_client):
    raw = {
        "run": {"name": "adapt", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 200, "partitions": 2},
        "game": {"rounds": 2},
        "agents": {"backend": "scripted"},
        "cluster": {"kind": "slurm", "adapt": {"maximum": 2}, "cores": 1, "memory": "1GB",
                    "walltime": "00:10:00", "interface": "lo", "dashboard_address": "",
                    "log_directory": str(tmp_path / "logs")},
    }
    config = config_from_dict(raw)
    build_population(config, client=dask_client)  # the round is the first task it sends
    assert Path.cwd().resolve().is_relative_to(REPO)  # our_jobs counts jobs from here
    result = run_simulation(config)
    assert result.state == "finished"
    rounds = result.rounds()
    assert len(rounds) == 400 and (rounds["status"] == "ok").all()
