"""One numbering and one vocabulary. Rounds are numbered from 1 wherever a user reads them
(the console, the prompts, ``simpipe show``, the report, the web UI) and on disk (the
``round=<r>`` folders, the ``round`` column of the rounds and of summary.parquet, run.json's
round keys); a run written when files numbered them from 0 (run.json without ``layout``)
still reads with rounds from 1, and resumes numbering its files as it began. The number the
agents are told is the target (in the prompts' and the paper's words, the winning number);
the valid guess closest to it is the winning guess. Real scripted and stub-server runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simpipe.games.text import fmt_number
from simpipe.report.build import build_report
from simpipe.run.agent_prompt import rebuild_prompt
from simpipe.run.console import Console
from simpipe.run.simulation import RunCancelled, run_simulation
from simpipe.servers.stub import StubProcess
from simpipe.store.layout import LAYOUT, RunPaths
from simpipe.store.results import read_ledger, read_rounds, read_summary
from simpipe.ui.runs import RunFiles, run_detail

from support import CancelAfterFirstRound, simpipe_cli, small_config

QUIET = Console(quiet=True)
SMALL = {"size": 60, "partitions": 2}


def as_written_before(run_dir: Path) -> None:
    """Turn a run into what the version before numbered from 0: folders round=0.., the
    summary's round column, run.json's round keys and progress; run.json without layout."""
    rounds = run_dir / "rounds"
    for folder in sorted(rounds.glob("round=*"), key=lambda p: int(p.name.split("=")[1])):
        folder.rename(rounds / f"round={int(folder.name.split('=')[1]) - 1}")
    summary = pd.read_parquet(run_dir / "summary.parquet")
    summary["round"] -= 1
    summary.to_parquet(run_dir / "summary.parquet", index=False)
    data = json.loads((run_dir / "run.json").read_text())
    assert data.pop("layout") == LAYOUT
    data["rounds"] = {str(int(k) - 1): v for k, v in data["rounds"].items()}
    if data.get("progress"):
        data["progress"]["round"] -= 1
    (run_dir / "run.json").write_text(json.dumps(data))


def folders(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "rounds").iterdir())


def test_a_run_numbers_its_rounds_from_one_on_disk_and_wherever_they_are_read(
        tmp_path, dask_client):
    config = small_config(tmp_path, population=SMALL)
    run_simulation(config, client=dask_client, console=QUIET)
    run = config.run_dir
    assert folders(run) == ["round=1", "round=2", "round=3"]
    on_disk = json.loads((run / "run.json").read_text())
    assert on_disk["layout"] == LAYOUT and list(on_disk["rounds"]) == ["1", "2", "3"]
    assert pd.read_parquet(run / "summary.parquet")["round"].tolist() == [1, 2, 3]
    raw = pd.read_parquet(run / "rounds", columns=["agent_id", "round"])
    assert sorted(int(r) for r in raw["round"].unique()) == [1, 2, 3]
    assert read_summary(run)["round"].tolist() == [1, 2, 3]
    assert sorted(read_rounds(run)["round"].unique()) == [1, 2, 3]
    assert read_ledger(run).round(0).n == 60  # code keeps indices from 0

    show = simpipe_cli("show", str(run))
    assert show.returncode == 0, show.stderr
    table = show.stdout.splitlines()[1:5]
    assert table[0].split()[:2] == ["round", "group_id"]
    assert [line.split()[0] for line in table[1:]] == ["1", "2", "3"]

    report = build_report([run], tmp_path / "report")
    assert report.section("rounds").frame["round"].tolist() == [1, 2, 3]
    assert any("numbered from 1" in note for note in report.section("rounds").notes)
    assert report.section("runs").frame["rounds_to_within_1"].isna().all() or \
        report.section("runs").frame["rounds_to_within_1"].iloc[0] >= 1

    detail = run_detail(RunFiles.open(run.parent, run.name))
    assert [r["round"] for r in detail["rounds"]] == [1, 2, 3]
    assert detail["histogram"]["round"] == 3 and detail["histogram"]["n"] == 60


def test_a_run_written_before_reads_from_one_and_resumes_numbering_as_it_began(
        tmp_path, dask_client):
    reference = small_config(tmp_path, run={"name": "whole"}, population=SMALL)
    run_simulation(reference, client=dask_client, console=QUIET)
    config = small_config(tmp_path, run={"name": "old"}, population=SMALL)
    with pytest.raises(RunCancelled):
        run_simulation(config, client=dask_client, console=QUIET,
                       observer=CancelAfterFirstRound(config.run_dir))
    run = config.run_dir
    as_written_before(run)
    assert folders(run) == ["round=0"] and "layout" not in json.loads(
        (run / "run.json").read_text())
    # Read as rounds from 1 by every reader.
    assert read_summary(run)["round"].tolist() == [1]
    assert set(read_rounds(run)["round"]) == {1}
    show = simpipe_cli("show", str(run))
    assert show.returncode == 0, show.stderr
    assert "--resume continues with round 2: 2 of 2 partitions to play" in show.stdout
    assert show.stdout.splitlines()[3].split()[0] == "1"

    # --resume goes on in the run's own numbering: its files stay consistent.
    run_simulation(config, client=dask_client, console=QUIET, resume=True)
    assert folders(run) == ["round=0", "round=1", "round=2"]
    on_disk = json.loads((run / "run.json").read_text())
    assert on_disk.get("layout", 1) == 1 and list(on_disk["rounds"]) == ["0", "1", "2"]
    assert pd.read_parquet(run / "summary.parquet")["round"].tolist() == [0, 1, 2]
    # ... and its results are the uninterrupted run's, both read with rounds from 1.
    pd.testing.assert_frame_equal(read_summary(run), read_summary(reference.run_dir))
    columns = ["round", "agent_id", "guess", "status"]
    mine, whole = (read_rounds(d, columns=columns).sort_values(["round", "agent_id"])
                   .reset_index(drop=True) for d in (run, reference.run_dir))
    pd.testing.assert_frame_equal(mine, whole)

    report = build_report([run], tmp_path / "report")
    assert report.section("rounds").frame["round"].tolist() == [1, 2, 3]
    detail = run_detail(RunFiles.open(run.parent, run.name))
    assert [r["round"] for r in detail["rounds"]] == [1, 2, 3]
    assert detail["histogram"]["round"] == 3 and detail["histogram"]["n"] == 60
    assert RunPaths(run, read_ledger(run).first_round).round_dir(2).name == "round=2"


@pytest.fixture(scope="module")
def stub_run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("words")
    with StubProcess() as stub:
        config = small_config(root, run={"name": "words"}, population={"size": 20,
                                                                        "partitions": 2},
                              game={"rounds": 2},
                              agents={"backend": "tgi", "tgi": {"endpoints": [stub.url]}})
        run_simulation(config, client=dask_client, console=QUIET)
    return config


def test_the_number_told_is_the_target_and_the_closest_guess_the_winning_guess(stub_run):
    run = stub_run.run_dir
    first = read_summary(run).iloc[0]
    assert first["round"] == 1
    # The agents are told the target, in the paper's words: the winning number.
    told = rebuild_prompt(run, 0, 1).text()
    assert f"Winning number of round 1: {fmt_number(first['target'])}." in told
    # The console and run.log say which is which.
    log = RunPaths(run).log.read_text("utf-8")
    assert (f"round 1/2: mean {first['mean']:.2f}  target (announced as the winning number) "
            f"{first['target']:.2f}  winning guess {first['winning_guess']:.2f}") in log
    assert "  winning " + f"{first['winning_guess']:.2f}" not in log
    # simpipe show says it under its table; the report's chart names the winning guess.
    show = simpipe_cli("show", str(run))
    assert ("target: offset + ratio x mean, announced to the agents as the winning number; "
            "winning_guess: the valid guess closest to it") in show.stdout
    detail = run_detail(RunFiles.open(run.parent, run.name))
    assert ["winning_guess", "winning guess"] in detail["round_columns"]
    assert detail["chart"]["title"] == "mean guess, target and winning guess per round"
    # The prompt of round 2 counts rounds from 1, as show --prompt and --round do.
    shown = simpipe_cli("show", str(run), "--prompt", "0", "--round", "2")
    assert shown.returncode == 0, shown.stderr
    assert "# agent 0, round 2 of 2" in shown.stdout and "Round 2 of 2." in shown.stdout
