"""Command-line options that used to end in a traceback, name the wrong key or be ignored:
each is refused in one line naming the option (or applied), before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpipe.bench.share import default_config

from support import SCRIPTED, one_error_line, simpipe_cli


@pytest.mark.parametrize("args,says", [
    (["--agents", "abc"], "--agents"),
    (["--agents", "-5"], "--agents"),
    (["--agents", "1000,0"], "--agents"),
    (["--agents", ""], "--agents"),
    (["--rounds", "0"], "--rounds"),
    (["--workers", "0"], "--workers"),
    (["--threads", "0"], "--threads"),
    (["--partitions", "-1"], "--partitions"),
    (["--latency", "inf"], "--latency"),
])
def test_bench_scale_refuses_a_bad_option_naming_it(args, says):
    proc = simpipe_cli("bench", "scale", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"Invalid value for '{says}'" in proc.stderr, proc.stderr
    assert "population" not in proc.stderr and "game." not in proc.stderr


def test_bench_share_applies_set_to_its_default_config(tmp_path):
    config = default_config(100, 2, tmp_path, ["game.rounds=4", "agents.max_tokens=5",
                                                "population.size=300"])
    assert (config.game.rounds, config.agents.max_tokens) == (4, 5)
    assert config.population.size == 300  # --set comes last: it wins over --agents
    assert config.run.output_dir == str(tmp_path)


def test_bench_share_refuses_a_bad_set_without_config_in_one_line():
    # Before: without --config the overrides were ignored and the benchmark ran.
    line = one_error_line(simpipe_cli("bench", "share", "--agents", "2", "--rounds", "1",
                                      "--sample", "1", "--set", "game.rounds=0"))
    assert "game.rounds = 0" in line and "greater than or equal to 1" in line, line


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli-options")
    proc = simpipe_cli("run", str(SCRIPTED), "--set", f"run.output_dir={root}",
                       "--set", "run.name=r", "--set", "population.size=200",
                       "--set", "population.partitions=2", "--set", "game.rounds=1",
                       "--set", "cluster.workers=1", "--set", 'cluster.dashboard_address=""')
    assert proc.returncode == 0, proc.stderr
    return root / "r"


@pytest.mark.parametrize("out,says", [
    ("/proc/self", "cannot write the report there"),
    ("/proc/self/report", "cannot write the report there"),
])
def test_report_to_a_folder_it_cannot_write_is_one_line(run_dir, out, says):
    line = one_error_line(simpipe_cli("report", str(run_dir), "--out", out, "--quiet"))
    assert line.startswith(f"error: {out}: ") and says in line, line

