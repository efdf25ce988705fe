"""Round records and states as types (``simpipe.store.round_record``,
``simpipe.store.states``): a misspelled field fails where a round's record is built, a
run.json whose round holds a key simpipe never writes costs that file (one line naming the
file and the key, in ``simpipe show`` and the web UI alike), a run.json of the previous
layout (the game's numbers beside a round's fields) still reads, and states go through the
files as their words and come back as members."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from simpipe.core.records import CorruptFile
from simpipe.report.build import build_report
from simpipe.run.console import Console
from simpipe.run.simulation import RunCancelled, run_simulation
from simpipe.store.experiment import CellRecord, ExperimentRecord, read_experiment, write_experiment
from simpipe.store.layout import LAYOUT, RunPaths, layout_on_resume
from simpipe.store.ledger import Ledger
from simpipe.store.record import read_ledger
from simpipe.store.round_record import MixSplit, RoundRecord, ValueSplit
from simpipe.store.states import CellState, RunState
from simpipe.ui.runs import RunFiles, list_runs, run_detail

from support import CancelAfterFirstRound, one_error_line, simpipe_cli, small_config

DATA = Path(__file__).parents[1] / "data"
PREVIOUS = DATA / "run_json_previous.json"  # layout 1: rounds from 0, no layout field
LAYOUT_2 = DATA / "run_json_layout2_public_goods.json"  # game numbers beside the fields
QUIET = Console(quiet=True)
SMALL = {"size": 60, "partitions": 2}


def write_run(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(data))
    return folder / "run.json"


# --- written as a type ------------------------------------------------------------------------

def test_a_misspelled_field_fails_where_the_round_record_is_built():
    with pytest.raises(ValidationError, match="n_vaild"):
        RoundRecord(n=10, n_vaild=9)
    # A game's number has its own place; beside the fields it is a stray key too.
    with pytest.raises(ValidationError, match="mean_payoff"):
        RoundRecord(n=10, mean_payoff=12.0)
    with pytest.raises(ValidationError, match="bakend"):
        MixSplit(attribute="model", values={"rules": {"bakend": "scripted"}})
    with pytest.raises(ValidationError, match="n_agents"):
        ValueSplit(backend="scripted", n_agents=3)


def test_the_game_numbers_and_a_mix_split_have_typed_places():
    rec = RoundRecord(n=8, n_valid=8, mean=6.0,
                      game_numbers={"contribution_pct": 30.0, "mean_payoff": 23.6},
                      by=MixSplit(attribute="model", values={
                          "rules": ValueSplit(backend="scripted", n=4, n_valid=4, mean=5.0)}))
    assert rec.numbers == {"mean": 6.0, "contribution_pct": 30.0, "mean_payoff": 23.6}
    assert rec.value("mean_payoff") == 23.6 and rec.value("n") == 8
    assert rec.value("no_such_number") is None
    assert rec.by.values["rules"].backend == "scripted"
    with pytest.raises(ValidationError, match="game_numbers"):
        RoundRecord(game_numbers={"mean_payoff": "high"})


# --- read back as untrusted input -----------------------------------------------------------

def _layout_3(tmp_path: Path) -> dict:
    """PREVIOUS as this version writes it: layout 3, rounds from 1."""
    data = json.loads(PREVIOUS.read_text())
    data["layout"] = LAYOUT
    data["rounds"] = {str(int(k) + 1): v for k, v in data["rounds"].items()}
    return data


def test_an_unknown_key_in_a_round_on_disk_is_one_line_naming_the_file_and_the_key(tmp_path):
    data = _layout_3(tmp_path)
    data["rounds"]["2"]["n_vaild"] = 300
    ledger = write_run(tmp_path / "results" / "bad", data)
    with pytest.raises(CorruptFile) as caught:
        read_ledger(ledger)
    assert caught.value.path == ledger
    assert caught.value.problem == ("rounds.2.n_vaild: unknown key 'n_vaild', not one "
                                    "simpipe writes there")
    line = one_error_line(simpipe_cli("show", str(ledger.parent)))
    assert line.startswith(f"error: {ledger}: rounds.2.n_vaild: unknown key 'n_vaild'")

    # One bad file costs that run's line in the web UI, never the list.
    good = _layout_3(tmp_path)
    write_run(tmp_path / "results" / "good", good)
    rows = {row["name"]: row for row in list_runs(tmp_path / "results")}
    assert rows["good"]["state"] == RunState.FINISHED and rows["good"]["problem"] is None
    assert rows["bad"]["state"] == "broken"
    assert rows["bad"]["problem"].startswith("run.json: rounds.2.n_vaild: unknown key")


def test_a_game_number_beside_the_fields_is_refused_in_a_file_of_this_layout(tmp_path):
    data = _layout_3(tmp_path)
    data["rounds"]["1"]["mean_payoff"] = 12.0
    with pytest.raises(CorruptFile, match=r"rounds\.1\.mean_payoff: unknown key"):
        read_ledger(write_run(tmp_path / "r", data))


def test_a_run_json_of_layout_2_reads_its_game_numbers_from_beside_the_fields(tmp_path):
    old = json.loads(LAYOUT_2.read_text())
    record = read_ledger(LAYOUT_2)
    assert record.layout == 2 and record.game().kind == "public_goods"
    assert record.completed_rounds() == [0, 1]
    for index, key in ((0, "1"), (1, "2")):
        rec, flat = record.round(index), old["rounds"][key]
        assert rec.game_numbers == {"contribution_pct": flat["contribution_pct"],
                                    "mean_payoff": flat["mean_payoff"]}
        assert rec.numbers["mean"] == flat["mean"] == rec.mean
    # Written back in this version's form: the numbers nested, nothing lost.
    dumped = record.to_json()["rounds"]["1"]
    assert "mean_payoff" not in dumped and dumped["game_numbers"]["mean_payoff"] == (
        old["rounds"]["1"]["mean_payoff"])
    # Any other unknown key of an old file is still an error.
    bad = json.loads(LAYOUT_2.read_text())
    bad["rounds"]["1"]["mean_payof"] = 1.0
    with pytest.raises(CorruptFile, match=r"rounds\.1\.mean_payof: unknown key"):
        read_ledger(write_run(tmp_path / "r", bad))


def as_layout_2(run_dir: Path) -> None:
    """Turn a run into what layout 2 wrote: the game's numbers beside each round's fields."""
    data = json.loads((run_dir / "run.json").read_text())
    assert data["layout"] == LAYOUT
    data["layout"] = 2
    for rec in data["rounds"].values():
        rec.update(rec.pop("game_numbers"))
    (run_dir / "run.json").write_text(json.dumps(data))


def test_a_layout_2_public_goods_run_shows_reports_and_resumes_into_this_layout(
        tmp_path, dask_client):
    game = {"kind": "public_goods", "rounds": 2}
    whole = small_config(tmp_path, run={"name": "whole"}, game=game, population=SMALL)
    run_simulation(whole, client=dask_client, console=QUIET)
    config = small_config(tmp_path, run={"name": "old"}, game=game, population=SMALL)
    with pytest.raises(RunCancelled):
        run_simulation(config, client=dask_client, console=QUIET,
                       observer=CancelAfterFirstRound(config.run_dir))
    run = config.run_dir
    as_layout_2(run)
    first = read_ledger(run / "run.json").round(0)
    assert set(first.game_numbers) == {"contribution_pct", "mean_payoff"}
    show = simpipe_cli("show", str(run))
    assert show.returncode == 0, show.stderr
    assert "--resume continues with round 2" in show.stdout
    detail = run_detail(RunFiles.open(run.parent, run.name))
    assert detail["problem"] is None and [r["round"] for r in detail["rounds"]] == [1]
    build_report([run], tmp_path / "report")

    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    on_disk = json.loads((run / "run.json").read_text())
    assert on_disk["layout"] == LAYOUT and on_disk["state"] == "finished"
    assert all("mean_payoff" not in rec and "mean_payoff" in rec["game_numbers"]
               for rec in on_disk["rounds"].values())
    resumed, reference = read_ledger(run / "run.json"), read_ledger(whole.run_dir / "run.json")
    for r in range(2):
        assert resumed.round(r).numbers == pytest.approx(reference.round(r).numbers)


def test_a_resumed_run_is_saved_in_the_current_layout_unless_its_numbering_differs():
    assert layout_on_resume(2) == LAYOUT == 3
    assert layout_on_resume(LAYOUT) == LAYOUT
    assert layout_on_resume(1) == 1  # rounds from 0 on disk: it goes on so


# --- states ------------------------------------------------------------------------------------

def test_run_states_go_through_run_json_as_their_words(tmp_path):
    config = small_config(tmp_path)
    paths = RunPaths(config.run_dir)
    paths.root.mkdir(parents=True)
    ledger = Ledger.new(paths, config)
    assert read_ledger(paths.ledger).state is RunState.CREATED
    for state in (RunState.RUNNING, RunState.FAILED, RunState.INTERRUPTED, RunState.FINISHED):
        ledger.set_state(state)
        assert json.loads(paths.ledger.read_text())["state"] == state.value
        back = read_ledger(paths.ledger)
        assert back.state is state and back.state == state.value
    assert back.is_finished


def test_a_state_simpipe_never_writes_is_a_corrupt_file(tmp_path):
    data = _layout_3(tmp_path)
    data["state"] = "finishd"
    with pytest.raises(CorruptFile, match=r"run.json: state: input should be 'created'"):
        read_ledger(write_run(tmp_path / "r", data))
    # A file without a state still reads, as unknown.
    del data["state"]
    (tmp_path / "r" / "run.json").write_text(json.dumps(data))
    assert read_ledger(tmp_path / "r" / "run.json").state is RunState.UNKNOWN


def test_cell_and_experiment_states_go_through_experiment_json(tmp_path):
    record = ExperimentRecord(name="e", grid={"game.rounds": [1, 2]}, state=RunState.RUNNING,
                              cells=[CellRecord(name="a", overrides={}),
                                     CellRecord(name="b", overrides={},
                                                state=CellState.FAILED)])
    write_experiment(tmp_path, record)
    on_disk = json.loads((tmp_path / "experiment.json").read_text())
    assert on_disk["state"] == "running"
    assert [c["state"] for c in on_disk["cells"]] == ["pending", "failed"]
    back = read_experiment(tmp_path)
    assert back.state is RunState.RUNNING
    assert [c.state for c in back.cells] == [CellState.PENDING, CellState.FAILED]
    on_disk["cells"][0]["state"] = "done"
    (tmp_path / "experiment.json").write_text(json.dumps(on_disk))
    with pytest.raises(CorruptFile, match=r"experiment.json: cells.0.state"):
        read_experiment(tmp_path)
