"""An experiment's ETA is priced from what its finished cells cost per agent-round, scaled by
each remaining cell's agents x rounds, chain-of-thought cells apart: not the mean wall time
of a finished cell times the cells left (which said 33 s with 13.5 minutes to go after a
one-number cell, with the chain-of-thought cells still to come). Real cells of a real
grid; one real experiment of scripted agents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simpipe.run.console import Console
from simpipe.run.experiment import CellCost, experiment_eta, experiment_from_dict, run_experiment
from simpipe.store.results import read_ledger


def raw_config(tmp_path: Path, grid: dict) -> dict:
    return {
        "run": {"name": "t", "seed": 5, "output_dir": str(tmp_path / "results")},
        "population": {"size": 100, "partitions": 2},
        "game": {"rounds": 2},
        "agents": {"backend": "scripted"},
        "cluster": {"kind": "local", "workers": 1, "dashboard_address": ""},
        "experiment": {"name": "eta", "grid": grid},
    }


def test_remaining_cells_are_priced_per_agent_round_and_by_kind(tmp_path):
    cells = experiment_from_dict(raw_config(tmp_path, {
        "game.prompt": ["basic", "cot"], "population.size": [100, 1000]})).cells
    small_basic, big_basic, small_cot, big_cot = (c.config for c in cells)
    # 100 agents x 2 rounds in 2 s of rounds, 1 s else.
    basic = CellCost.of(small_basic, [1.0, 1.0], 3.0)
    assert (basic.agent_rounds, basic.rounds_s, basic.other_s) == (200, 2.0, 1.0)

    eta, note = experiment_eta([basic], [(big_basic, 2)])
    assert eta == pytest.approx(1.0 + 2.0 / 200 * 1000 * 2)  # 21 s, not the 3 s a cell took
    assert note == ""
    # A chain-of-thought cell not measured yet: priced as the slowest kind measured, and said.
    eta, note = experiment_eta([basic], [(small_cot, 2)])
    assert eta == pytest.approx(3.0)
    assert note == ("no chain-of-thought scripted cell measured yet, priced as one-number "
                    "scripted")
    # Once one is measured it prices the chain-of-thought cells, the others keep theirs.
    cot = CellCost.of(small_cot, [30.0, 30.0], 61.0)
    eta, note = experiment_eta([basic, cot], [(big_basic, 2), (big_cot, 2)])
    assert eta == pytest.approx((1.0 + 20.0) + (1.0 + 60.0 / 200 * 2000))
    assert note == ""
    # A resumed cell costs only the rounds it has left.
    eta, _ = experiment_eta([basic, cot], [(big_cot, 1)])
    assert eta == pytest.approx(1.0 + 60.0 / 200 * 1000)


class _Lines(Console):
    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        super().line(text)
        self.lines.append(text)


def _seconds(text: str) -> float:
    parts = dict((unit, float(value)) for value, unit in re.findall(r"(\d+) (h|min|s)\b", text))
    return 3600 * parts.get("h", 0) + 60 * parts.get("min", 0) + parts.get("s", 0)


def test_the_first_cell_s_eta_scales_with_the_agents_left(tmp_path):
    # Cell 2 plays 50 times cell 1's agent-rounds: its ETA is at least 50 times cell 1's
    # round time (the old ETA, cell 1's wall time, was a fraction of that).
    experiment = experiment_from_dict(raw_config(tmp_path, {"population.size": [100, 5000]}))
    console = _Lines()
    run_experiment(experiment, console=console)
    first = next(line for line in console.lines if line.startswith("[1/2]"))
    assert "ETA " in first, first
    eta = _seconds(first.split("ETA ", 1)[1])
    ledger = read_ledger(experiment.cells[0].run_dir)
    rounds_s = sum(rec.elapsed_s for rec in ledger.finished_rounds().values())
    assert eta >= 50 * rounds_s - 1, (first, rounds_s)
