"""``simpipe experiment``: a grid of runs on one cluster. Real runs of scripted agents on a
real LocalCluster: the cells share one scheduler, a cancelled cell resumes, finished cells
are skipped, and a bad grid value is refused, naming the cell and the key, before anything
starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import simpipe
from simpipe.config.model import DIR_NAME, ConfigError
from simpipe.games.beauty_contest.reference import load_references
from simpipe.run.console import Console
from simpipe.run.experiment import (
    cell_names,
    experiment_from_dict,
    load_experiment,
    run_experiment,
)
from simpipe.run.simulation import RunCancelled
from simpipe.store.experiment import read_experiment
from simpipe.store.results import read_ledger, read_rounds

from support import REPO, cancel_after_first_round, one_error_line, simpipe_cli

QUIET = Console(quiet=True)
GRID = {"game.prompt": ["basic", "cot"], "game.ratio": ["1/2", "2/3"]}


def raw_config(tmp_path: Path, grid: dict | None = None) -> dict:
    return {
        "run": {"name": "t", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 200, "partitions": 2,
                       "attributes": {"education": {"values": {"High School": 1, "Ph.D.": 1}}}},
        "game": {"rounds": 3},
        "agents": {"backend": "scripted"},
        "cluster": {"kind": "local", "workers": 1, "dashboard_address": ""},
        "experiment": {"name": "grid", "grid": grid or GRID},
    }


def test_a_2x2_grid_runs_on_one_scheduler_resumes_a_cancelled_cell_and_skips_finished_ones(
        tmp_path: Path) -> None:
    experiment = experiment_from_dict(raw_config(tmp_path))
    names = [c.name for c in experiment.cells]
    assert names == ["prompt-basic__ratio-1_2", "prompt-basic__ratio-2_3",
                     "prompt-cot__ratio-1_2", "prompt-cot__ratio-2_3"]
    dirs = [experiment.folder / n for n in names]
    assert experiment.folder == tmp_path / "results" / "grid"

    cancel_after_first_round(dirs[2])  # the third cell stops after its first round
    with pytest.raises(RunCancelled):
        run_experiment(experiment, console=QUIET)
    record = read_experiment(experiment.folder)
    assert record.state == "interrupted"
    assert [c.state for c in record.cells] == ["finished", "finished", "interrupted", "pending"]
    assert record.cells[2].overrides == {"game.prompt": "cot", "game.ratio": "1/2"}
    ledgers = [read_ledger(d) for d in dirs[:3]]
    assert ledgers[0].scheduler and len({led.scheduler for led in ledgers}) == 1
    assert 0 < ledgers[2].rounds_done < 3 and not dirs[3].exists()
    first_cell = (dirs[0] / "run.json").read_bytes()

    result = run_experiment(experiment, console=QUIET)  # again: resumes
    assert result.state == "finished" and [c.skipped for c in result.cells] == [
        True, True, False, False]
    assert (dirs[0] / "run.json").read_bytes() == first_cell  # a finished cell is left alone
    ledgers = [read_ledger(d) for d in dirs]
    assert all(led.state == "finished" and led.rounds_done == 3 for led in ledgers)
    assert ledgers[2].scheduler == ledgers[3].scheduler != ledgers[0].scheduler
    assert ledgers[2].section("game")["prompt"] == "cot"
    assert len(read_rounds(dirs[2])) == 3 * 200  # each round once, none played twice
    assert [c.state for c in read_experiment(experiment.folder).cells] == ["finished"] * 4

    again = run_experiment(experiment, console=QUIET)  # nothing left: no cluster started
    assert all(c.skipped for c in again.cells) and again.state == "finished"

    # The comparison report of the experiment folder.
    report = simpipe.build_report([experiment.folder])
    rounds = report.section("conditions_rounds").frame
    assert len(rounds) == 4 * 3 and set(rounds["condition"]) == set(names)
    assert (rounds["mean_ci_low"] <= rounds["mean"]).all()
    assert (rounds["mean"] <= rounds["mean_ci_high"]).all()
    refs = load_references()  # period 1: Nagel's first-round figure, as the run report's
    nagel = (refs.human_for("2/3", 0).mean, *refs.period_means("2/3")[1:])
    two_thirds = rounds[rounds["condition"] == names[1]]
    assert two_thirds["human_mean"].tolist() == pytest.approx(list(nagel[:3]))
    pairs = report.section("pairwise").frame
    assert len(pairs) == 4 and set(pairs["factor"]) == {"game.prompt", "game.ratio"}
    tested = pairs["rank_p"].notna()  # scripted agents ignore the prompt: nothing to test
    assert (pairs.loc[tested, "rank_p_holm"] >= pairs.loc[tested, "rank_p"]).all()
    assert set(pairs["design"]) == {"paired"}  # one seed: the cells share their draws
    assert (report.out / "report.md").read_text().count("## ") == len(report.sections)
    assert any(f.section == "conditions_rounds" for f in report.figures)


def test_a_bad_grid_value_names_the_cell_and_key_before_anything_starts(
        tmp_path: Path) -> None:
    raw = raw_config(tmp_path, {"game.prompt": ["basic", "cott"], "game.ratio": ["1/2", "2/3"]})
    with pytest.raises(ConfigError) as caught:
        experiment_from_dict(raw, source="e.toml")
    [line] = str(caught.value).splitlines()  # one problem, one line, for both cells that have it
    assert line.startswith("e.toml: experiment cell prompt-cott__ratio-1_2 (and 1 more cell): "
                           "game.prompt = 'cott'")
    assert not (tmp_path / "results").exists()

    path = tmp_path / "e.toml"
    path.write_text(
        f'[run]\noutput_dir = "{tmp_path / "results"}"\n[agents]\nbackend = "scripted"\n'
        '[experiment]\ngrid = { "game.rounds" = [1, 2], "population.size" = [10, -1] }\n')
    line = one_error_line(simpipe_cli("experiment", str(path)))
    assert re.match(r"error: .*e\.toml: experiment cell rounds-1__size--1 \(and 1 more cell\): "
                    r"population\.size = -1", line)
    assert not (tmp_path / "results").exists()
    line = one_error_line(simpipe_cli("run", str(path)))
    assert "has an [experiment] table" in line and "simpipe experiment" in line
    for grid, problem in (({"run.name": ["a", "b"]}, "not a grid key"),
                          ({"cluster.workers": [1, 2]}, "not a grid key"),
                          ({"game.rounds": []}, "no values"),
                          ({"game.rounds": [1, 1]}, "listed twice"),
                          ({"game": [{"ratio": "2/3"}], "game.ratio": ["1/2"]}, "overlap")):
        with pytest.raises(ConfigError, match=f"experiment.grid: .*{problem}"):
            experiment_from_dict(raw_config(tmp_path, grid))


def test_cell_names_are_stable_safe_and_distinct() -> None:
    grid = {"game.ratio": ["2/3", "51/100"], "game": [{"ratio": "1/2", "offset": 5}, {}],
            "agents.temperature": [0.7], "population.persona.temperature": [0.7],
            "population.persona.template": ["You are {age}.", "You are {age}!", "x" * 300]}
    named = cell_names(grid)
    names = [name for name, _ in named]
    assert len(set(names)) == len(names) == 2 * 2 * 3
    assert all(DIR_NAME.fullmatch(name) for name in names)
    assert names == [name for name, _ in cell_names(json.loads(json.dumps(grid)))]
    assert names[0].startswith("ratio-2_3__ratio-1_2-offset-5__agents.temperature-0.7__"
                               "population.persona.temperature-0.7__template-You_are_age")
    # "{age}." and "{age}!" clean to the same text: a hash tells them apart
    assert names[0] != names[1] and names[1].split("__")[:-1] == names[0].split("__")[:-1]
    assert "game-base" in names[3] and len(max(names, key=len)) <= 128


def test_the_shipped_grid_is_the_issue_s_two_by_two_by_two_on_the_embedded_model():
    experiment = load_experiment(REPO / "examples" / "experiment-grid.toml")
    assert len(experiment.cells) == 8
    values = {tuple(sorted(cell.overrides.items())) for cell in experiment.cells}
    assert len(values) == 8
    for cell in experiment.cells:
        config = cell.config
        assert config.population.size == 200 and config.game.rounds == 3
        assert config.agents.backend == "llamacpp" and config.agents.cot_max_tokens == 128
    assert {c.config.game.prompt for c in experiment.cells} == {"basic", "cot"}
    assert {c.config.game.ratio for c in experiment.cells} == {"2/3", "1/2"}
    assert {c.config.population.persona.mode for c in experiment.cells} == {"none", "template"}


# --- issue 27: cells never share a folder -------------------------------------------------

CLASHING = ["You are {gender}", "You_are {gender}", "You_are_gender-9237c23e"]


def _persona_toml(tmp_path: Path, values: list[str], name: str = "clash") -> Path:
    """A tiny scripted experiment over persona templates, as a config file."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[run]\nname = "{name}"\nseed = 1\noutput_dir = {json.dumps(str(tmp_path / "results"))}\n'
        '[population]\nsize = 20\npartitions = 1\n'
        '[population.attributes.gender]\nvalues = { "female" = 1, "male" = 1 }\n'
        '[population.persona]\nmode = "template"\ntemplate = "You are {gender}"\n'
        '[game]\nrounds = 1\n[agents]\nbackend = "scripted"\n'
        '[cluster]\nkind = "local"\nworkers = 1\ndashboard_address = ""\n'
        f'[experiment]\ngrid = {{ "population.persona.template" = {json.dumps(values)} }}\n')
    return path


def _template_of(run_dir: Path) -> str:
    return read_ledger(run_dir).section("population")["persona"]["template"]


def test_values_that_clean_to_one_text_get_distinct_folders_and_force_keeps_each_cell(
        tmp_path: Path) -> None:
    path = _persona_toml(tmp_path, CLASHING)
    names = [name for name, _ in cell_names({"population.persona.template": CLASHING})]
    assert len({n.lower() for n in names}) == 3
    assert names[2] == "template-You_are_gender-9237c23e"  # a value that is its own name keeps it
    assert all(re.fullmatch(r"template-You_are_gender__h[0-9a-f]{10}", n) for n in names[:2])

    proc = simpipe_cli("validate", str(path))
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  (\S+)  \(", proc.stdout, re.MULTILINE)
    assert listed == names

    experiment = load_experiment(path)
    result = run_experiment(experiment, console=QUIET)
    assert result.state == "finished" and [c.state for c in result.cells] == ["finished"] * 3
    dirs = [experiment.folder / n for n in names]
    assert [_template_of(d) for d in dirs] == CLASHING

    proc = simpipe_cli("experiment", str(path), "--force")
    assert proc.returncode == 0, proc.stderr
    assert "3/3 cells done" in proc.stdout + proc.stderr
    assert [_template_of(d) for d in dirs] == CLASHING  # each cell's own run, none replaced
    record = read_experiment(experiment.folder)
    assert [(c.name, c.state) for c in record.cells] == [(n, "finished") for n in names]
    cells = [p.name for p in experiment.folder.iterdir() if p.is_dir() and p.name[0] != "."]
    assert sorted(cells) == sorted(names)


def test_two_cells_on_one_folder_or_a_folder_of_another_cell_are_refused_even_with_force(
        tmp_path: Path) -> None:
    import dataclasses

    from simpipe.store.ledger import RunDirError

    # A cell of a grid of one value: the text of "You are {gender}" names it.
    first = load_experiment(_persona_toml(tmp_path, ["You are {gender}"]))
    assert [c.name for c in first.cells] == ["template-You_are_gender"]
    run_experiment(first, console=QUIET)
    kept = (first.cells[0].run_dir / "run.json").read_bytes()

    # Adding "You_are_gender" (its own name) gives that folder to it: the earlier cell's
    # run there is not replaced, --force or not.
    second = load_experiment(_persona_toml(tmp_path, ["You are {gender}", "You_are_gender"]))
    assert second.cells[1].name == "template-You_are_gender"
    assert second.cells[0].name.startswith("template-You_are_gender__h")
    for force in (False, True):
        with pytest.raises(RunDirError, match="holds the run of the cell .*You are"):
            run_experiment(second, force=force, console=QUIET)
    assert (first.cells[0].run_dir / "run.json").read_bytes() == kept

    # Cells made by hand that share a folder: refused before anything starts.
    a, b = second.cells
    twin = dataclasses.replace(b, config=b.config.with_sections(
        run=b.config.run.model_copy(update={"name": a.name.upper()})), name=a.name.upper())
    clash = dataclasses.replace(second, cells=(a, twin))
    with pytest.raises(RunDirError, match="would share the folder"):
        run_experiment(clash, force=True, console=QUIET)
    assert (first.cells[0].run_dir / "run.json").read_bytes() == kept


def test_an_experiment_named_another_way_before_resumes_in_its_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import simpipe.run.experiment as module

    path = _persona_toml(tmp_path, CLASHING[:2])
    new_names = [n for n, _ in cell_names({"population.persona.template": CLASHING[:2]})]
    old = ["template-You_are_gender-9237c23e", "template-You_are_gender-739ae54f"]
    real = module.cell_names
    monkeypatch.setattr(module, "cell_names",
                        lambda grid: [(n, v) for n, (_, v) in zip(old, real(grid), strict=True)])
    run_experiment(load_experiment(path), console=QUIET)  # as the names were made before
    monkeypatch.setattr(module, "cell_names", real)

    experiment = load_experiment(path)
    assert [c.name for c in experiment.cells] == old != new_names
    again = run_experiment(experiment, console=QUIET)
    assert all(c.skipped for c in again.cells)
    # A grid value that is its own name now takes a folder recorded for another cell: the
    # other keeps nothing it does not own, and the names stay distinct.
    both = load_experiment(_persona_toml(tmp_path, CLASHING))
    assert len({c.name.lower() for c in both.cells}) == 3
    assert both.cells[2].name == old[0] and both.cells[0].name == new_names[0]
    assert both.cells[1].name == old[1]


def test_a_cell_whose_first_round_has_no_valid_answer_says_no_mean_and_not_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every answer fails (a server that refuses connections): the cell's line must say the
    # round has no mean and why it is not data, not print "mean nan" or leave the part out.
    raw = raw_config(tmp_path, {"game.ratio": ["1/2"]})
    raw["population"]["size"] = 20
    raw["game"]["rounds"] = 1
    raw["agents"] = {"backend": "tgi",
                     "tgi": {"endpoints": ["http://127.0.0.1:1"], "retries": 0}}
    result = run_experiment(experiment_from_dict(raw), console=Console())
    out = capsys.readouterr().out
    [cell_line] = [line for line in out.splitlines() if "finished in" in line]
    assert "(first-round no mean, n 0 valid of 20; NOT VALID ENOUGH: " in cell_line, cell_line
    assert "nan" not in cell_line
    [run_dir] = result.run_dirs  # played to the end: one error row per agent
    assert (read_rounds(run_dir)["status"] == "error").sum() == 20
