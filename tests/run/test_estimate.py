"""The end-of-run estimate from emulated GPU stats: arithmetic on hand-made stats, untrusted
stats refused, and a real dry run (`simpipe run --emulate`, local emulators) that writes it."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simpipe.run.estimate import (
    StatsError,
    estimate,
    fetch_stats,
    fleet_edges,
    format_estimate,
    parse_stats,
)
from simpipe.servers.emulator import EmulatorProcess
from simpipe.store.record import RunRecord

T0 = 1_000_000.0  # the emulators' start on the client's clock


def gpu_stats(busy_at: list[tuple[float, float, float, int]], scale: float = 1.0,
              url: str = "http://gpu") -> dict:
    """An /emulator/stats answer whose series is ``(t_s, busy_s, work_s, completed)``."""
    last = busy_at[-1]
    return {
        "started_unix": T0, "time_scale": scale, "now_s": last[0], "busy_s": last[1],
        "work_s": last[2], "completed": last[3], "profile": {"name": "p", "gpu": "1x G"},
        "series_columns": ["t_s", "running", "queued", "busy_s", "work_s", "completed"],
        "series": [[t, 0, 0, b, w, c] for t, b, w, c in busy_at],
    }


def ledger(*rounds: tuple[float, float, int]) -> RunRecord:
    """run.json with finished rounds ``(started_at, elapsed_s, agents)``."""
    return RunRecord.model_validate({
        "timings": {"population_s": 2.0},
        "rounds": {str(i): {"complete": True, "started_at": a, "elapsed_s": e, "n": n,
                            "tokens_in": 10 * n, "tokens_out": n}
                   for i, (a, e, n) in enumerate(rounds)}})


def test_a_busy_fleet_is_the_limit_and_the_round_costs_its_wall_time():
    # two GPUs busy 9 of the round's 10 s
    stats = [parse_stats(f"http://g{i}", gpu_stats([(0, 0, 0, 0), (10, 9, 6, 500)]))
             for i in range(2)]
    est = estimate(ledger((T0, 10.0, 1000)), stats, gpus_per_server=1)
    (r,) = est["rounds"]
    assert r["fleet_busy"] == pytest.approx(0.9) and r["limit"] == "GPUs"
    assert r["busiest_gpu_s"] == pytest.approx(9) and r["ideal_s"] == pytest.approx(6)
    assert r["estimate_s"] == 10.0
    assert est["total_s"] == pytest.approx(12.0)  # + the population build
    assert est["gpu_hours"] == pytest.approx(2 * 12 / 3600, rel=1e-3)
    assert (est["tokens_in"], est["tokens_out"]) == (10_000, 1000)
    assert est["limit"] == "GPUs" and est["fleet_agents_per_s"] == pytest.approx(1000 / 6, rel=1e-5)


def test_an_idle_fleet_means_the_pipeline_is_the_limit_with_its_agents_per_s():
    stats = [parse_stats("http://g", gpu_stats([(0, 0, 0, 0), (10, 2, 1.5, 1000)]))]
    est = estimate(ledger((T0, 10.0, 1000)), stats)
    assert est["rounds"][0]["limit"] == "pipeline" and est["limit"] == "pipeline"
    assert est["pipeline_agents_per_s"] == pytest.approx(100.0)
    assert "limit: the pipeline, at 100 agents/s" in format_estimate(est)


def test_with_a_time_scale_the_modelled_gpu_time_can_exceed_the_wall_time():
    # 10x faster than a GPU: a 5 s round is 50 modelled s, the GPU busy for 48 of them
    stats = [parse_stats("http://g", gpu_stats([(0, 0, 0, 0), (50, 48, 40, 800)], scale=10))]
    est = estimate(ledger((T0, 5.0, 800)), stats)
    (r,) = est["rounds"]
    assert r["estimate_s"] == pytest.approx(48) and r["limit"] == "GPUs"
    assert r["fleet_busy"] == pytest.approx(48 / 50)


def test_the_round_barrier_shows_as_ramp_and_tail_per_gpu():
    """Ramp: the round's start to the first running sequence; tail: the last moment with
    requests waiting to the round's end (the barrier's drain); on a 4x time scale."""
    def loaded(rows):  # (t_s, running, queued)
        return {**gpu_stats([(t, 0, 0, 0) for t, _, _ in rows], scale=4.0),
                "series": [[t, r, q, 0, 0, 0] for t, r, q in rows]}

    busy = parse_stats("http://a", loaded([(0, 0, 0), (4, 0, 0), (8, 5, 9), (36, 9, 2),
                                           (40, 3, 0), (44, 0, 0)]))
    fast = parse_stats("http://b", loaded([(0, 0, 0), (44, 0, 0)]))  # never caught busy
    edges = fleet_edges([busy, fast], T0, T0 + 11.0)  # 44 modelled seconds
    assert edges == {"ramp_s": [8.0], "tail_s": [8.0]}


def test_series_without_load_columns_still_parse():
    old = gpu_stats([(0, 0, 0, 0), (10, 9, 6, 500)])
    old["series_columns"] = ["t_s", "busy_s", "work_s", "completed"]
    old["series"] = [[t, b, w, c] for t, _, _, b, w, c in old["series"]]
    gpu = parse_stats("http://g", old)
    assert gpu.at(T0 + 10) == (9, 6, 500)
    assert fleet_edges([gpu], T0, T0 + 10) == {"ramp_s": [], "tail_s": []}


def test_rounds_are_cut_out_of_the_series_by_their_times():
    series = [(0, 0, 0, 0), (10, 8, 5, 100), (20, 8, 5, 100), (30, 9, 6, 120)]
    stats = [parse_stats("http://g", gpu_stats(series))]
    est = estimate(ledger((T0, 10.0, 100), (T0 + 20, 10.0, 20), (T0 - 50, 3.0, 5)), stats)
    assert [r["busiest_gpu_s"] for r in est["rounds"]] == [pytest.approx(8),
                                                           pytest.approx(1)]
    assert est["rounds_not_seen"] == [3]  # before the emulators started (a resumed run)


@pytest.mark.parametrize(("change", "message"), [
    ({"busy_s": -1}, "busy_s = -1 is not a number >= 0"),
    ({"now_s": math.nan}, "now_s = nan is not a number >= 0"),
    ({"time_scale": 0}, "time_scale must be > 0"),
    ({"series": "lots"}, "no series"),
    ({"series": [[1, 2]]}, "malformed series"),
])
def test_malformed_stats_are_refused_naming_the_server(change, message):
    data = {**gpu_stats([(0, 0, 0, 0), (1, 1, 1, 1)]), **change}
    with pytest.raises(StatsError, match=f"^http://bad/emulator/stats: {re.escape(message)}"):
        parse_stats("http://bad", data)


def test_fetch_reads_live_emulators_and_names_the_ones_that_fail():
    with EmulatorProcess(gpus=2, profile="fast") as emu:
        stats, problems = fetch_stats([*emu.urls, "http://127.0.0.1:9"])
    assert [s.url for s in stats] == emu.urls
    assert len(problems) == 1 and problems[0].startswith("http://127.0.0.1:9/emulator/stats:")


def test_emulated_dry_run_of_a_local_config_ends_with_the_estimate(tmp_path: Path):
    """`simpipe run --emulate` on a LocalCluster config with two TGI endpoints: two emulated
    servers (this machine), every answer valid, an estimate printed and in run.json."""
    cfg = tmp_path / "tgi.toml"
    cfg.write_text(f"""
[run]
name = "dry"
output_dir = "{tmp_path / 'results'}"
[population]
size = 400
partitions = 2
[game]
rounds = 2
[agents]
backend = "tgi"
[agents.tgi]
endpoints = ["http://gpu-a:8080", "http://gpu-b:8080"]
[cluster]
kind = "local"
workers = 1
dashboard_address = ""
[cluster.servers.emulated]
profile = "h100-llama3-8b"
time_scale = 20
""")
    proc = subprocess.run([sys.executable, "-m", "simpipe.cli", "run", str(cfg), "--emulate"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "--emulate: 2 emulated h100-llama3-8b GPU server(s) with TGI routes" in out
    assert "results go to " + str(tmp_path / "results/dry-emulated") in out
    assert "Estimate for the real run (2 x 1x H100 80GB" in out
    run = json.loads((tmp_path / "results/dry-emulated/run.json").read_text())
    est = run["estimate"]
    assert est["servers"] == 2 and est["time_scale"] == 20 and len(est["rounds"]) == 2
    assert est["tokens_in"] == sum(r["tokens_in"] for r in run["rounds"].values()) > 0
    assert all(r["n_valid"] == 400 for r in run["rounds"].values())
    assert not (tmp_path / "results/dry").exists()  # never the real run's directory
