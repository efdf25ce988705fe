"""Ctrl-C in a terminal: one line, exit 130, the run marked interrupted and resumable; the
local Dask workers (in the terminal's process group too) stay quiet."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from simpipe.cluster import slurm
from simpipe.cluster.config import LocalClusterConfig
from simpipe.run.executor import cluster_client

pytestmark = pytest.mark.slow

CONFIG = """
[run]
name = "ctrlc"
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
dashboard_address = ""
"""
CLUSTERS = {
    "local": 'kind = "local"\nworkers = 2\n',
    "slurm": 'kind = "slurm"\njobs = 1\ncores = 2\nprocesses = 2\nmemory = "2GB"\n'
             'walltime = "00:10:00"\ninterface = "lo"\n',
}


def simpipe(*args: str, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simpipe.cli", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_ctrl_c_is_one_line_exit_130_and_the_run_resumes(tmp_path, kind):
    if kind == "slurm" and (problem := slurm.controller_problem(timeout=10)):
        pytest.skip(f"no SLURM controller ({problem})")
    (tmp_path / "c.toml").write_text(CONFIG + CLUSTERS[kind])
    run_dir = tmp_path / "results" / "ctrlc"
    # Its own process group, as a shell gives a foreground job; the SIGINT goes to the whole
    # group, the client and its worker processes alike, as a terminal's Ctrl-C does.
    proc = simpipe("run", "c.toml", cwd=tmp_path, process_group=0)
    try:
        wait_for(lambda: any((run_dir / "rounds" / "round=1").glob("part-*.parquet")), 120,
                 "the first partition of round 1")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "interrupted; resume with: simpipe run c.toml --resume"
    ledger = json.loads((run_dir / "run.json").read_text())
    assert ledger["state"] == "interrupted" and len(ledger["rounds"]) < 2

    resumed = simpipe("run", "c.toml", "--resume", cwd=tmp_path)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out + err
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    rounds = pd.read_parquet(run_dir / "rounds")
    assert rounds.groupby("round", observed=True)["agent_id"].nunique().tolist() == [400] * 2
    assert len(rounds) == 800
    if kind == "slurm":  # the worker jobs of both invocations are gone
        logs = run_dir / "logs" / "slurm"
        ids = {p.stem.rsplit("-", 1)[1] for p in logs.glob("simpipe-worker-*.out")}
        assert len(ids) == 2 and not wait_ids_gone(ids)


def wait_ids_gone(ids: set[str], timeout: float = 60) -> list[str]:
    """The job ids among ``ids`` that squeue still lists after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [j for j in ids if j in slurm.jobs(job_ids=sorted(ids))]) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _sigint_handler() -> str:
    return repr(signal.getsignal(signal.SIGINT))


def test_local_workers_ignore_sigint_also_after_a_restart():
    before = signal.getsignal(signal.SIGINT)
    with cluster_client(LocalClusterConfig(workers=2, dashboard_address="")) as client:
        started = client.run(_sigint_handler)
        assert set(started.values()) == {repr(signal.SIG_IGN)}
        # New worker processes, spawned while the client has its handler (generous timeout:
        # a loaded machine takes a while to start them).
        client.restart(timeout=300)
        restarted = client.run(_sigint_handler)
        assert set(restarted.values()) == {repr(signal.SIG_IGN)}
        assert set(restarted) != set(started)
    assert signal.getsignal(signal.SIGINT) is before  # the client's own handler is back


def _teardown_logging() -> tuple[int, int]:
    import logging

    return (logging.getLogger("distributed.worker").getEffectiveLevel(),
            logging.getLogger("tornado.application").getEffectiveLevel())


def test_local_workers_stop_logging_before_their_cluster_closes():
    # A local worker writes to the client's terminal; one whose scheduler closed first
    # logged two tracebacks after a SIGTERM under load (2 of 15 with four busy loops
    # beside). Before the cluster closes, its workers are told to stop.
    import logging

    from simpipe.cluster.ctrl_c import quiet_local_workers

    with cluster_client(LocalClusterConfig(workers=2, dashboard_address="")) as client:
        speaking = client.run(_teardown_logging)
        assert all(level <= logging.ERROR for pair in speaking.values() for level in pair)
        quiet_local_workers(client)
        quiet = client.run(_teardown_logging)
        assert len(quiet) == 2
        assert all(level > logging.CRITICAL for pair in quiet.values() for level in pair)
    # This process (the client, and the nannies a LocalCluster keeps in it) logs as before:
    # only an interrupt silences it.
    assert logging.getLogger("distributed.worker").getEffectiveLevel() <= logging.ERROR
