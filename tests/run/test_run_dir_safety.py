"""`--force` replaces only what simpipe wrote; bad run folders and config files are one
error line (exit 2), and nothing on disk is touched."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from simpipe.run.console import Console
from simpipe.run.population import ensure_population
from simpipe.run.simulation import run_simulation
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import RunDirError

from support import SCRIPTED, one_error_line, simpipe_cli, small_config

QUIET = Console(quiet=True)


def run_cli(tmp_path: Path, output_dir: str, name: str,
            *extra: str) -> subprocess.CompletedProcess:
    return simpipe_cli("run", str(SCRIPTED), "--set", f"run.output_dir={json.dumps(output_dir)}",
                       "--set", f"run.name={name}", "--set", "population.size=100",
                       "--set", 'cluster.dashboard_address=""', *extra, cwd=tmp_path)


@pytest.fixture
def finished_run(tmp_path, dask_client) -> Path:
    config = small_config(tmp_path, run={"name": "x"}, population={"size": 40, "partitions": 2},
                          game={"rounds": 1})
    run_simulation(config, client=dask_client, console=QUIET)
    return config.run_dir


def test_force_leaves_a_folder_that_is_not_a_run_alone(tmp_path):
    (tmp_path / "r" / "x").mkdir(parents=True)
    (tmp_path / "r" / "x" / "important.txt").write_text("keep me")
    line = one_error_line(run_cli(tmp_path, "r", "x", "--force"))
    assert "not a simpipe run" in line and "--force leaves it alone" in line
    assert "pass --force" not in line
    assert (tmp_path / "r" / "x" / "important.txt").read_text() == "keep me"


def test_without_force_a_foreign_folder_is_not_offered_to_force(tmp_path):
    (tmp_path / "r" / "x").mkdir(parents=True)
    (tmp_path / "r" / "x" / "important.txt").write_text("keep me")
    line = one_error_line(run_cli(tmp_path, "r", "x"))
    assert "not a simpipe run" in line and "--force" not in line


def test_force_leaves_a_run_with_foreign_files_alone(tmp_path, finished_run):
    (finished_run / "notes.txt").write_text("mine")
    (finished_run / "run.log.d").mkdir()
    ledger = (finished_run / "run.json").read_text()
    line = one_error_line(run_cli(tmp_path, str(finished_run.parent), "x", "--force"))
    assert "notes.txt" in line and "run.log.d" in line and "did not write" in line
    assert (finished_run / "notes.txt").read_text() == "mine"
    assert (finished_run / "run.json").read_text() == ledger


def test_force_leaves_a_forged_run_json_alone(tmp_path):
    (tmp_path / "r" / "x").mkdir(parents=True)
    (tmp_path / "r" / "x" / "run.json").write_text('["not a ledger"]')
    (tmp_path / "r" / "x" / "summary.parquet").write_text("someone's data")
    line = one_error_line(run_cli(tmp_path, "r", "x", "--force"))
    assert "no valid run.json" in line
    assert (tmp_path / "r" / "x" / "summary.parquet").read_text() == "someone's data"


def test_force_replaces_everything_simpipe_wrote(tmp_path, finished_run, dask_client):
    (finished_run / "CANCEL").touch()
    (finished_run / ".summary.parquet.0a1b2c3d.tmp").write_bytes(b"half")
    (finished_run / "report").mkdir()
    (finished_run / "report" / "report.html").write_text("<h1>old</h1>")
    (finished_run / "logs" / "slurm").mkdir(parents=True)
    config = small_config(tmp_path, run={"name": "x"}, population={"size": 40, "partitions": 2},
                          game={"rounds": 2})
    result = run_simulation(config, client=dask_client, console=QUIET, force=True)
    assert result.state == "finished"
    assert sorted(p.name for p in finished_run.iterdir()) == [
        "population", "rounds", "run.json", "run.log", "summary.parquet"]


def test_a_run_starts_in_the_folder_population_build_prepared(tmp_path):
    out = tmp_path / "r"
    common = ("--set", f"run.output_dir={json.dumps(str(out))}", "--set", "run.name=x",
              "--set", "population.size=100", "--set", 'cluster.dashboard_address=""')
    built = simpipe_cli("population", "build", str(SCRIPTED), *common, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (out / "x" / "logs" / "slurm").mkdir(parents=True)  # as a run's server jobs leave it
    ran = simpipe_cli("run", str(SCRIPTED), *common, "--set", "game.rounds=1", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads((out / "x" / "run.json").read_text())["state"] == "finished"


def test_force_in_a_folder_holding_only_a_built_population_just_runs(tmp_path, dask_client):
    # What `simpipe bench engine` does: build the population, then run with force=True.
    config = small_config(tmp_path, run={"name": "x"}, population={"size": 40, "partitions": 2},
                          game={"rounds": 1})
    ensure_population(dask_client, config, RunPaths(config.run_dir))
    result = run_simulation(config, client=dask_client, console=QUIET, force=True)
    assert result.state == "finished"


def test_force_never_deletes_through_a_symlinked_run_folder(tmp_path, finished_run, dask_client):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(finished_run, elsewhere)
    results = tmp_path / "linked"
    results.mkdir()
    (results / "x").symlink_to(elsewhere, target_is_directory=True)
    before = sorted(p.name for p in elsewhere.rglob("*"))
    line = one_error_line(run_cli(tmp_path, str(results), "x", "--force"))
    assert "symbolic link" in line
    assert (results / "x").is_symlink() and sorted(p.name for p in elsewhere.rglob("*")) == before
    config = small_config(tmp_path, run={"name": "x", "output_dir": str(results)})
    with pytest.raises(RunDirError, match="symbolic link"):
        run_simulation(config, client=dask_client, console=QUIET, force=True)


def test_output_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    line = one_error_line(run_cli(tmp_path, "afile", "x"))
    assert "run.output_dir" in line and "is a file" in line
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_output_dir_below_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    line = one_error_line(run_cli(tmp_path, "afile/sub", "x"))
    assert "run.output_dir" in line


def test_config_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[run]\nname = "caf\u00e9"\n'.encode("latin-1"))
    line = one_error_line(simpipe_cli("validate", str(bad), cwd=tmp_path))
    assert "latin1.toml, line 2" in line and "UTF-8" in line
