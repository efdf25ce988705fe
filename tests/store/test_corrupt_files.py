"""Corrupt files on disk (a truncated part or summary, a broken run.json): the run detects,
reports and repairs them on --resume; `simpipe show` and `simpipe report` name them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from simpipe.cli import main
from simpipe.config.model import Config
from simpipe.core.records import CorruptFile
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.integrity import check_part
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import RunDirError
from simpipe.store.record import read_ledger
from simpipe.store.results import read_rounds, read_summary

from support import small_config

QUIET = Console(quiet=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, dask_client) -> Path:
    """An uncorrupted, finished 3-round run: its output_dir (results/, run "t" inside)."""
    root = tmp_path_factory.mktemp("corrupt-ref")
    run_simulation(small_config(root), client=dask_client, console=QUIET)
    return root / "results"


def copy_of(reference: Path, tmp_path: Path) -> tuple[Config, RunPaths]:
    """The finished reference run, copied: the same config under tmp_path."""
    shutil.copytree(reference, tmp_path / "results", symlinks=True)
    config = small_config(tmp_path)
    return config, RunPaths(config.run_dir)


def truncate(path: Path, size: int = 100) -> None:
    """What `truncate -s 100 FILE` or a full disk leaves."""
    os.truncate(path, size)


def assert_same_results(run: RunPaths, reference: Path) -> None:
    ref = RunPaths(reference / "t")
    pd.testing.assert_frame_equal(read_summary(run.root), read_summary(ref.root))
    pd.testing.assert_frame_equal(read_rounds(run.root), read_rounds(ref.root))


def moved_aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.corrupt-*"))


def test_corrupt_part_of_a_finished_round_is_replayed_on_resume(reference, tmp_path,
                                                                 dask_client):
    config, paths = copy_of(reference, tmp_path)
    part = paths.round_part(1, 0)
    truncate(part)
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert_same_results(paths, reference)
    [aside] = moved_aside(part)  # kept, hidden from Parquet readers, never deleted
    assert aside.stat().st_size == 100
    log = paths.log.read_text()
    assert f"WARNING {part}: not a readable Parquet file" in log
    assert "round 2 is played again" in log
    ledger = read_ledger(paths.ledger)
    assert ledger.state == "finished" and ledger.round(1).partitions_reused == 3


def test_part_of_another_partition_is_replayed_not_trusted(reference, tmp_path, dask_client):
    # A readable file with the wrong agents (copied over from the partition next door).
    config, paths = copy_of(reference, tmp_path)
    shutil.copyfile(paths.round_part(2, 1), paths.round_part(2, 3))
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert_same_results(paths, reference)
    assert "are not this partition's 450..599" in paths.log.read_text()


def test_corrupt_part_of_the_round_in_progress_is_replayed(reference, tmp_path, dask_client):
    config, paths = copy_of(reference, tmp_path)
    # What a run killed inside round 3 leaves: run.json without that round, parts on disk.
    ledger = json.loads(paths.ledger.read_text())
    del ledger["rounds"]["2"]
    ledger["state"] = "interrupted"
    paths.ledger.write_text(json.dumps(ledger))
    part = paths.round_part(2, 1)
    truncate(part)
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert_same_results(paths, reference)
    assert len(moved_aside(part)) == 1
    assert f"WARNING {part}: not a readable Parquet file" in paths.log.read_text()


def test_corrupt_summary_is_rebuilt_from_the_round_files(reference, tmp_path, dask_client):
    config, paths = copy_of(reference, tmp_path)
    truncate(paths.summary)
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert_same_results(paths, reference)
    assert len(moved_aside(paths.summary)) == 1
    assert f"WARNING {paths.summary}: not a readable Parquet file" in paths.log.read_text()


def test_corrupt_population_part_is_built_again(tmp_path, dask_client, reference):
    # A fresh run: its population parts are hard links into the shared build, so truncating
    # one truncates both.
    config = small_config(tmp_path)
    run_simulation(config, client=dask_client, console=QUIET)
    paths = RunPaths(config.run_dir)
    ledger = json.loads(paths.ledger.read_text())
    del ledger["rounds"]["2"]
    paths.ledger.write_text(json.dumps(ledger))
    shutil.rmtree(paths.round_dir(2))
    part = paths.population_part(1)
    truncate(part)
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert_same_results(paths, reference)
    check_part(part, (150, 300))
    assert len(moved_aside(part)) == 1
    assert f"WARNING {part}: not a readable Parquet file" in paths.log.read_text()


def test_broken_run_json_refuses_resume_with_one_line(reference, tmp_path, dask_client):
    config, paths = copy_of(reference, tmp_path)
    paths.ledger.write_text('{"state": "finished", "rounds": {"0": {"n": "600"}}}')
    with pytest.raises(RunDirError, match=r"run.json: rounds.0.n: .*valid integer.*--force"):
        run_simulation(config, client=dask_client, console=QUIET, resume=True)


@pytest.mark.parametrize("agents, columns, problem", [
    ((0, 150), ("nope",), "no column nope"),
    ((0, 151), (), "150 rows, expected 151"),
    ((150, 300), (), "agent ids 0..149 are not this partition's 150..299"),
])
def test_part_check_names_what_is_wrong(reference, agents, columns, problem):
    part = RunPaths(reference / "t").round_part(0, 0)
    with pytest.raises(CorruptFile, match=problem) as err:
        check_part(part, agents, columns)
    assert err.value.path == part


@pytest.mark.parametrize("text, problem", [
    ("[1, 2]", "a JSON array, expected an object"),
    ('{"state": "finished"', "not valid JSON"),
    ('{"state": "finished", "n_agents": "600"}', "n_agents: input should be a valid integer"),
    ('{"state": "running", "pid": -1}', "pid: input should be greater than or equal to 1"),
    ('{"rounds": {"x": {}}}', "rounds.x: string should match pattern"),
])
def test_run_json_check_names_the_field(tmp_path, text, problem):
    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(CorruptFile, match=problem):
        read_ledger(path)


def test_show_and_report_name_a_broken_file_with_exit_2(reference, tmp_path):
    _, paths = copy_of(reference, tmp_path)
    cli = CliRunner()
    truncate(paths.round_part(1, 0))
    report = cli.invoke(main, ["report", str(paths.root), "--quiet"])
    assert report.exit_code == 2 and "Traceback" not in report.output
    assert report.output.strip().splitlines() == [
        f"error: {paths.round_part(1, 0)}: not a readable Parquet file (Parquet magic bytes "
        "not found in footer); `simpipe run CONFIG --resume` moves it aside and rebuilds it"]

    truncate(paths.summary)
    for args in (["show", str(paths.root)], ["report", str(paths.root), "--quiet"]):
        result = cli.invoke(main, args)
        assert result.exit_code == 2, args
        assert f"error: {paths.summary}: not a readable Parquet file" in result.output

    paths.ledger.write_text("[]")
    for args in (["show", str(paths.root)], ["report", str(paths.root), "--quiet"]):
        result = cli.invoke(main, args)
        assert result.exit_code == 2, args
        assert result.output.splitlines() == [
            f"error: {paths.ledger}: a JSON array, expected an object; restore it from a copy"
            + (" (it records the run's config and rounds)" if args[0] == "show" else "")]
