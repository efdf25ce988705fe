"""A run ends with a state and an exit status that say what happened: SIGTERM (scancel,
timeout) is handled as Ctrl-C is, a run whose every answer failed does not exit 0, and
`[cluster]` values a run cannot use are refused by `simpipe validate`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from support import SCRIPTED, one_error_line, simpipe_cli

SLOW_RUN = """
[run]
name = "term"
seed = 7
output_dir = "results"
[population]
size = 400
partitions = 4
[game]
rounds = 2
[agents]
backend = "scripted"
[agents.scripted]
latency_s = 1.5
[cluster]
kind = "local"
workers = 2
dashboard_address = ""
"""

ALL_FAIL = """
[run]
name = "allfail"
output_dir = "results"
[population]
size = 40
partitions = 2
[game]
rounds = 2
[agents]
backend = "tgi"
[agents.tgi]
endpoints = ["http://127.0.0.1:1"]
retries = 0
[cluster]
workers = 1
dashboard_address = ""
"""


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("whole_group", [False, True], ids=["timeout", "scancel"])
def test_sigterm_marks_the_run_interrupted_exits_143_and_it_resumes(tmp_path, whole_group):
    """`timeout` signals the run's process; scancel every process of the job step (the
    local Dask workers too)."""
    (tmp_path / "c.toml").write_text(SLOW_RUN)
    run_dir = tmp_path / "results" / "term"
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.cli", "run", "c.toml"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, process_group=0)
    try:
        wait_for(lambda: any((run_dir / "rounds" / "round=1").glob("part-*.parquet")), 120,
                 "the first partition of round 1")
        if whole_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == ("terminated (SIGTERM); resume with: "
                                            "simpipe run c.toml --resume")
    ledger = json.loads((run_dir / "run.json").read_text())
    assert ledger["state"] == "interrupted" and len(ledger["rounds"]) < 2

    resumed = simpipe_cli("run", "c.toml", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    rounds = pd.read_parquet(run_dir / "rounds")
    assert rounds.groupby("round", observed=True)["agent_id"].nunique().tolist() == [400] * 2


def test_a_run_whose_every_answer_failed_exits_4_naming_where_the_errors_are(tmp_path):
    (tmp_path / "c.toml").write_text(ALL_FAIL)
    proc = simpipe_cli("run", "c.toml", cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: every answer failed: 80 of 80 ")
    assert str(Path("results") / "allfail" / "rounds") in line and "error" in line
    assert "127.0.0.1:1" in line  # the first reason, as the round files hold it
    ledger = json.loads((tmp_path / "results" / "allfail" / "run.json").read_text())
    assert ledger["state"] == "finished"  # played to the end: --resume has nothing to add


def test_a_run_with_some_good_answers_exits_0(tmp_path):
    proc = simpipe_cli("run", str(SCRIPTED), "--set", "run.output_dir='results'",
                       "--set", "population.size=40", "--set", "population.partitions=2",
                       "--set", "game.rounds=1", "--set", "cluster.workers=1",
                       "--set", 'cluster.dashboard_address=""', cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


SLURM_CONFIG = ('[cluster]\nkind = "slurm"\njobs = 1\ninterface = "lo"\n'
                'dashboard_address = ""\n')


@pytest.mark.parametrize(("setting", "key"), [
    ("cluster.jobs=0", "cluster.jobs"),
    ('cluster.queue=""', "cluster.queue"),
    ('cluster.queue="debug gpu"', "cluster.queue"),
    ('cluster.queue="debug\\n#SBATCH --uid=0"', "cluster.queue"),
    ('cluster.account=""', "cluster.account"),
])
def test_validate_refuses_cluster_values_a_run_cannot_use(tmp_path, setting, key):
    (tmp_path / "c.toml").write_text(SLURM_CONFIG)
    line = one_error_line(simpipe_cli("validate", "c.toml", "--set", setting, cwd=tmp_path))
    assert key in line


def test_validate_accepts_real_partition_and_account_names(tmp_path):
    (tmp_path / "c.toml").write_text(SLURM_CONFIG)
    proc = simpipe_cli("validate", "c.toml", "--set", 'cluster.queue="gpu-a100,debug"',
                       "--set", 'cluster.account="proj_01.x"', "--set", "cluster.jobs=1",
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
