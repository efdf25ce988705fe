"""The round loop end to end on a real Dask LocalCluster, real Parquet files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from simpipe.games.beauty_contest.environment import target_of
from simpipe.run.console import Console
from simpipe.run.simulation import RunCancelled, run_simulation
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import RunDirError
from simpipe.store.results import read_ledger, read_rounds, read_summary

from support import REPO, small_config

QUIET = Console(quiet=True)
ROW_COLUMNS = ["agent_id", "group_id", "guess", "status", "raw", "tokens_in", "tokens_out",
               "latency_s", "error"]


def test_run_writes_the_documented_layout(dask_client, tmp_path):
    config = small_config(tmp_path)
    result = run_simulation(config, client=dask_client, console=QUIET)
    paths = RunPaths(config.run_dir)
    assert sorted(p.name for p in paths.population.glob("*.parquet")) == [
        f"part-{k:05d}.parquet" for k in range(4)]
    population = pd.read_parquet(paths.population)
    assert list(population["agent_id"]) == list(range(600))
    assert {"education", "age"} <= set(population.columns)

    rounds = pd.read_parquet(paths.rounds)  # the public way: every round, with a round column
    assert set(rounds["round"].astype(int)) == {1, 2, 3}  # numbered from 1 (round=1, ...)
    assert set(ROW_COLUMNS) <= set(rounds.columns)
    for _, frame in rounds.groupby("round", observed=True):
        assert len(frame) == 600 and frame["agent_id"].is_unique
    assert (rounds["status"] == "ok").all() and rounds["guess"].between(0, 100).all()

    summary = read_summary(config.run_dir)
    assert list(summary.columns[:9]) == ["round", "group_id", "n", "n_valid", "mean", "median",
                                         "target", "winning_guess", "n_winners"]
    pd.testing.assert_frame_equal(summary, result.summary)
    for r, frame in read_rounds(config.run_dir).groupby("round"):
        row = summary.set_index("round").loc[r]
        assert row["mean"] == pytest.approx(frame["guess"].mean())
        assert row["median"] == pytest.approx(frame["guess"].median())
        assert row["target"] == pytest.approx(2 / 3 * frame["guess"].mean())
        closest = (frame["guess"] - row["target"]).abs()
        assert row["n_winners"] == (closest == closest.min()).sum()
    # rounds move towards the equilibrium (0)
    assert summary["mean"].is_monotonic_decreasing

    ledger = read_ledger(config.run_dir)
    assert ledger.state == "finished" and ledger.config_hash == config.results_hash()
    assert ledger.completed_rounds() == [0, 1, 2] and ledger.is_finished
    assert "round 3/3" in paths.log.read_text()


def test_groups_get_their_own_targets_and_feedback(dask_client, tmp_path):
    config = small_config(tmp_path, game={"group_size": 7, "ratio": "1/2", "offset": 5})
    run_simulation(config, client=dask_client, console=QUIET)
    summary = read_summary(config.run_dir)
    rounds = read_rounds(config.run_dir)
    assert summary.groupby("round")["n"].sum().tolist() == [600, 600, 600]
    assert len(summary[summary["round"] == 1]) == 600 // 7
    per_group = rounds[rounds["round"] == 1].groupby("group_id")["guess"].mean()
    first = summary[summary["round"] == 1].set_index("group_id")
    np.testing.assert_allclose(first["target"], target_of(per_group, config.game))


def test_same_seed_gives_identical_parquet(dask_client, tmp_path):
    a = small_config(tmp_path / "a")
    b = small_config(tmp_path / "b")
    run_simulation(a, client=dask_client, console=QUIET)
    run_simulation(b, client=dask_client, console=QUIET)
    pd.testing.assert_frame_equal(read_rounds(a.run_dir), read_rounds(b.run_dir))
    pd.testing.assert_frame_equal(read_summary(a.run_dir), read_summary(b.run_dir))
    c = small_config(tmp_path / "c", run={"seed": 4})
    run_simulation(c, client=dask_client, console=QUIET)
    assert not read_rounds(a.run_dir)["guess"].equals(read_rounds(c.run_dir)["guess"])


def test_existing_results_are_never_silently_replaced(dask_client, tmp_path):
    config = small_config(tmp_path, game={"rounds": 1})
    run_simulation(config, client=dask_client, console=QUIET)
    before = read_summary(config.run_dir)
    with pytest.raises(RunDirError, match="--resume.*--force"):
        run_simulation(config, client=dask_client, console=QUIET)
    other = small_config(tmp_path, game={"rounds": 1, "ratio": "1/2"})
    with pytest.raises(RunDirError, match="different config.*--force"):
        run_simulation(other, client=dask_client, console=QUIET, resume=True)
    pd.testing.assert_frame_equal(read_summary(config.run_dir), before)
    run_simulation(other, client=dask_client, console=QUIET, force=True)
    assert read_ledger(other.run_dir).config_hash == other.results_hash()


def test_population_is_built_once_and_reused(dask_client, tmp_path):
    first = small_config(tmp_path, run={"name": "one"}, game={"rounds": 1})
    second = small_config(tmp_path, run={"name": "two"}, game={"rounds": 1, "ratio": "1/2"})
    run_simulation(first, client=dask_client, console=QUIET)
    part = RunPaths(first.run_dir).population_part(0)
    stamp = part.stat().st_mtime_ns
    run_simulation(second, client=dask_client, console=QUIET)
    reused = RunPaths(second.run_dir).population_part(0)
    assert reused.stat().st_ino == part.stat().st_ino  # a link to the same build
    assert part.stat().st_mtime_ns == stamp


def test_cancelled_run_resumes_to_the_same_summary(dask_client, tmp_path):
    reference = small_config(tmp_path / "ref")
    run_simulation(reference, client=dask_client, console=QUIET)

    config = small_config(tmp_path / "cancel")
    paths = RunPaths(config.run_dir)

    def cancel_after_first_round() -> None:
        while not (paths.ledger.exists() and '"1": {' in paths.ledger.read_text()):
            time.sleep(0.01)
        paths.cancel_flag.touch()

    watcher = threading.Thread(target=cancel_after_first_round, daemon=True)
    watcher.start()
    with pytest.raises(RunCancelled):
        run_simulation(config, client=dask_client, console=QUIET)
    ledger = read_ledger(config.run_dir)
    assert ledger.state == "interrupted" and 0 < ledger.rounds_done < 3
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    pd.testing.assert_frame_equal(read_summary(config.run_dir), read_summary(reference.run_dir))
    pd.testing.assert_frame_equal(read_rounds(config.run_dir), read_rounds(reference.run_dir))


@pytest.mark.slow
def test_killed_run_resumes_to_the_identical_summary(dask_client, tmp_path):
    """SIGKILL the whole `simpipe run` process group mid-round, then --resume."""
    overrides = {"population": {"partitions": 8}, "agents": {"scripted": {"latency_s": 0.4}}}
    reference = small_config(tmp_path / "ref", **overrides)
    run_simulation(reference, client=dask_client, console=QUIET)

    out = tmp_path / "killed"
    args = [sys.executable, "-m", "simpipe.cli", "run", str(REPO / "examples" / "scripted.toml"),
            "--set", f"run.output_dir='{out}'", "--set", "run.name=t", "--set", "run.seed=3",
            "--set", "population.size=600", "--set", "population.partitions=8",
            "--set", "population.attributes.education.values="
                     "{'High School'=1,\"Bachelor's Degree\"=1,'Ph.D.'=1}",
            "--set", "agents.scripted.latency_s=0.4", "--set", "cluster.dashboard_address=''"]
    proc = subprocess.Popen(args, cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    paths = RunPaths(out / "t")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if paths.round_dir(1).exists() and any(paths.round_dir(1).glob("part-*.parquet")):
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(list(paths.round_dir(1).glob("part-*.parquet"))) < 8  # really mid-round

    resumed = subprocess.run([*args, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    pd.testing.assert_frame_equal(read_summary(paths.root), read_summary(reference.run_dir))
    rounds = read_rounds(paths.root)
    assert rounds.groupby("round").size().tolist() == [600, 600, 600]
    assert not list(paths.root.rglob(".*.tmp"))


@pytest.mark.slow
def test_worker_killed_mid_round_still_gives_exactly_n_rows(tmp_path):
    import logging

    from distributed import Client, LocalCluster

    overrides = {"population": {"partitions": 8}, "agents": {"scripted": {"latency_s": 0.5}},
                 "game": {"rounds": 2}}
    config = small_config(tmp_path / "kill", **overrides)
    reference = small_config(tmp_path / "ref", **overrides)
    paths = RunPaths(config.run_dir)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        run_simulation(reference, client=client, console=QUIET)
        pids = list(client.run(os.getpid).values())
        killed = threading.Event()

        def kill_one_worker() -> None:
            while not (paths.round_dir(0).exists()
                       and len(list(paths.round_dir(0).glob("part-*.parquet"))) >= 2):
                time.sleep(0.01)
            os.kill(pids[0], signal.SIGKILL)
            killed.set()

        threading.Thread(target=kill_one_worker, daemon=True).start()
        run_simulation(config, client=client, console=QUIET)
        assert killed.is_set()
    rounds = read_rounds(config.run_dir)
    for _, frame in rounds.groupby("round"):
        assert len(frame) == 600 and frame["agent_id"].is_unique
    pd.testing.assert_frame_equal(read_summary(config.run_dir), read_summary(reference.run_dir))


def test_cli_run_and_show(tmp_path):
    out = tmp_path / "cli"
    args = ["--set", f"run.output_dir='{out}'", "--set", "population.size=2000",
            "--set", "game.rounds=2"]
    proc = subprocess.run([sys.executable, "-m", "simpipe.cli", "run",
                           str(REPO / "examples" / "scripted.toml"), *args],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Dask dashboard: http" in proc.stdout
    assert "round 1/2: mean" in proc.stdout and "agents/s" in proc.stdout
    show = subprocess.run([sys.executable, "-m", "simpipe.cli", "show", str(out / "classic")],
                          capture_output=True, text=True)
    assert show.returncode == 0 and "finished, 2/2 rounds" in show.stdout
    again = subprocess.run([sys.executable, "-m", "simpipe.cli", "run",
                            str(REPO / "examples" / "scripted.toml"), *args],
                           cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr and "Traceback" not in again.stderr
