"""run.json as a typed record (``simpipe.store.record``): what the writer saves reads back the
same, the methods answer what callers used to compute from the keys, files of the previous
version still read, and the library functions of the Python API return data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import simpipe
from simpipe.core.records import CorruptFile
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import Ledger
from simpipe.store.record import RunRecord, read_ledger
from simpipe.store.round_record import RoundRecord
from simpipe.store.states import RunState

from support import one_error_line, simpipe_cli, small_config

PREVIOUS = Path(__file__).parents[1] / "data" / "run_json_previous.json"
QUIET = Console(quiet=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, dask_client) -> Path:
    """A finished run: 300 agents in 3 partitions, 3 rounds."""
    root = tmp_path_factory.mktemp("record")
    config = small_config(root, population={"size": 300, "partitions": 3}, game={"rounds": 3})
    run_simulation(config, client=dask_client, console=QUIET)
    return config.run_dir


def test_what_the_writer_saves_reads_back_the_same(finished):
    record = simpipe.read_ledger(finished)
    assert isinstance(record, RunRecord) and record.path == RunPaths(finished).ledger
    on_disk = json.loads((finished / "run.json").read_text())
    assert record.to_json() == on_disk  # every key, extra ones (a game's numbers) included
    assert RunRecord.model_validate(record.to_json()).at(record.path) == record


def test_the_methods_answer_what_callers_computed(finished):
    record = read_ledger(RunPaths(finished).ledger)
    assert record.is_finished and record.state == "finished"
    assert record.completed_rounds() == [0, 1, 2] and record.rounds_done == 3
    assert record.first_incomplete_round() is None and record.resume_point(
        RunPaths(finished)) is None
    assert record.partition_bounds() == [(0, 100), (100, 200), (200, 300)]
    assert record.backend == "scripted" and record.game().kind == "beauty_contest"
    summary = simpipe.read_summary(finished)
    for r, rec in record.finished_rounds().items():
        rows = summary[summary["round"] == r + 1]  # indices from 0, rounds numbered from 1
        assert rec.n == rows["n"].sum() == 300 and rec.n_invalid == 300 - rec.n_valid
        assert rec.mean == pytest.approx(rows["mean"].iloc[0])
    totals = record.totals()
    rounds = simpipe.read_rounds(finished, columns=["status"])
    assert totals.ok == int((rounds["status"] == "ok").sum())
    assert sum(totals.counts().values()) == len(rounds) == 900
    assert record.wall_s is not None and record.wall_s > record.timing("population_s") > 0


def test_resume_point_is_the_first_round_and_its_missing_partitions(finished, tmp_path):
    run = tmp_path / "t"
    shutil.copytree(finished, run)
    paths = RunPaths(run)
    data = json.loads(paths.ledger.read_text())
    del data["rounds"]["2"], data["rounds"]["3"]  # killed inside round 2 ...
    data["state"] = "interrupted"
    paths.ledger.write_text(json.dumps(data))
    paths.round_part(1, 2).unlink()  # ... with partitions 0 and 1 of it written
    record = read_ledger(paths.ledger)
    assert record.completed_rounds() == [0] and record.first_incomplete_round() == 1
    assert record.resume_point(paths) == (1, [2])
    assert record.missing_partitions(paths, 2) == []  # round 3's files are on disk
    assert record.round(1) is None and record.round(0).complete
    show = simpipe_cli("show", str(run))
    assert show.returncode == 0, show.stderr
    assert "run t: interrupted, 1/3 rounds, 300 agents" in show.stdout
    assert "--resume continues with round 2: 1 of 3 partitions to play" in show.stdout


def test_the_writer_records_rounds_progress_endpoints_and_state(tmp_path):
    config = small_config(tmp_path)
    paths = RunPaths(config.run_dir)
    paths.root.mkdir(parents=True)
    ledger = Ledger.new(paths, config)
    ledger.record_progress(0, 1, 4, 150, 0.5, force=True)
    assert read_ledger(paths.ledger).progress.partitions_done == 1
    import numpy as np  # a reduce's float64 is a float

    rec = ledger.record_round(0, RoundRecord(n=600, n_valid=598, mean=np.float64(31.5),
                                             elapsed_s=1.25, game_numbers={"mean_payoff": 12.0}))
    ledger.set_endpoints({"http://a": {"requests": 7, "errors": 0}})
    ledger.add_timing("wall_s", 2.0)
    ledger.set_state(RunState.INTERRUPTED, pid=12345, host="h")
    back = read_ledger(paths.ledger)
    assert back == ledger.record and isinstance(rec, RoundRecord) and rec.complete
    assert back.round(0).n == 600 and type(back.round(0).n) is int
    assert back.round(0).numbers == {"mean": 31.5, "mean_payoff": 12.0}
    assert back.progress is None and back.endpoints == {"http://a": {"requests": 7, "errors": 0}}
    assert (back.state, back.pid, back.host, back.wall_s) == ("interrupted", 12345, "h", 2.0)
    assert back.first_incomplete_round() == 1 and back.rounds_total == 3
    assert json.loads(paths.ledger.read_text())["endpoints"]["http://a"]["requests"] == 7


# --- files of the previous version ----------------------------------------------------------------

def test_a_run_json_of_the_previous_version_reads_and_keeps_every_field():
    record = read_ledger(PREVIOUS)
    old = json.loads(PREVIOUS.read_text())
    assert record.completed_rounds() == [0, 1] and record.n_partitions == 3
    assert record.round(0).started_at == old["rounds"]["0"]["started_at"]
    dumped = record.to_json()
    assert {k: v for k, v in dumped.items() if k in old and k != "rounds"} == {
        k: v for k, v in old.items() if k != "rounds"}
    for key, rec in old["rounds"].items():
        assert {k: v for k, v in dumped["rounds"][key].items() if k in rec} == rec
        # Statuses the previous version did not have: none of its answers had them.
        new = dumped["rounds"][key]
        assert new["n_truncated"] == new["n_no_final_answer"] == 0


def test_an_older_run_json_without_the_later_fields_reads_with_defaults(tmp_path):
    old = json.loads(PREVIOUS.read_text())
    for key in ("population_hash", "versions", "progress", "endpoints", "scheduler", "pid",
                "host"):
        del old[key]
    old["rounds"]["0"] = {k: old["rounds"]["0"][k] for k in ("complete", "n", "n_valid", "mean")}
    old["surprise"] = {"kept": True}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(old))
    record = read_ledger(path)
    assert record.endpoints == {} and record.progress is None and record.pid is None
    assert record.round(0).tokens_in == 0 and record.round(0).started_at is None
    assert record.to_json()["surprise"] == {"kept": True}


def test_a_run_json_this_version_cannot_read_is_one_line_naming_the_file(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    old = json.loads(PREVIOUS.read_text())
    (run / "run.json").write_text(json.dumps({**old, "rounds": [old["rounds"]["0"]]}))
    with pytest.raises(CorruptFile, match=r"run.json: rounds: input should be a valid dict"):
        read_ledger(run / "run.json")
    line = one_error_line(simpipe_cli("show", str(run)))
    assert line.startswith(f"error: {run / 'run.json'}: rounds: input should be a valid dict")
    assert line.endswith("restore it from a copy (it records the run's config and rounds)")


# --- library functions of the Python API --------------------------------------------------------

def test_build_population_returns_what_it_built(tmp_path, dask_client):
    config = small_config(tmp_path, run={"name": "pop"}, population={"size": 200,
                                                                     "partitions": 2})
    built = simpipe.build_population(config, client=dask_client)
    assert built.path == RunPaths(config.run_dir).population and built.wall_s > 0
    assert (built.n_agents, built.n_partitions) == (200, 2)
    population = simpipe.read_population(config.run_dir)
    assert population["agent_id"].tolist() == list(range(200))
    # The run then starts in the folder the build prepared and reuses it.
    run_simulation(config, client=dask_client, console=QUIET)
    assert read_ledger(RunPaths(config.run_dir).ledger).is_finished


def test_build_report_returns_its_tables_and_paths(finished, tmp_path):
    report = simpipe.build_report([finished], out=tmp_path / "rep")
    assert report.html == tmp_path / "rep" / "report.html" and report.html.is_file()
    runs = report.section("runs").frame
    assert isinstance(runs, pd.DataFrame) and runs["n_agents"].tolist() == [300]
    assert (tmp_path / "rep" / "tables" / "rounds.csv").is_file()


def test_read_summary_of_a_run_with_no_finished_round_is_empty(tmp_path):
    config = small_config(tmp_path)
    paths = RunPaths(config.run_dir)
    paths.root.mkdir(parents=True)
    Ledger.new(paths, config)
    summary = simpipe.read_summary(paths.root)
    assert summary.empty and "mean" in summary.columns
    show = simpipe_cli("show", str(paths.root))
    assert show.returncode == 0 and "(no round finished yet)" in show.stdout
