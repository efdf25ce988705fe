"""The scripted agents beside Nagel (1995): fitted on 2/3, the other ratios held out."""

from __future__ import annotations

import math

import pytest

from simpipe.games.base import ScriptedSettings
from simpipe.games.beauty_contest.calibration import (
    COLUMNS,
    calibration_table,
    fit_grid,
    format_table,
    main,
)
from simpipe.games.beauty_contest.level_k import DEPTH_GROWTH, TAU
from simpipe.games.beauty_contest.reference import load_references
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation

from support import small_config


@pytest.fixture(scope="module")
def table():
    return calibration_table(agents=10_000, seed=0)


def test_the_fitted_ratio_is_within_3_every_round(table) -> None:
    fitted = table[table["role"] == "fitted"]
    assert list(fitted["ratio"]) == ["2/3"] * 4 and list(fitted["round"]) == [1, 2, 3, 4]
    assert list(fitted["nagel"].round(1)) == [36.7, 23.9, 15.9, 9.2]
    assert (fitted["difference"].abs() <= 3).all() and fitted["within_3"].all()


def test_held_out_rows_are_computed_against_nagel(table) -> None:
    held = table[table["role"] == "held out"]
    assert list(table.columns) == COLUMNS
    half = held[held["ratio"] == "1/2"]
    assert list(half["nagel"].round(1)) == [27.0, 11.1, 3.8, 7.2]
    four = held[held["ratio"] == "4/3"]
    assert list(four["statistic"]) == ["mean"] + ["% choosing 100"] * 3
    assert list(four["nagel"].round(2)) == [60.12, 16.0, 59.0, 68.0]
    for row in held.itertuples():
        assert math.isfinite(row.model)
        assert row.difference == pytest.approx(row.model - row.nagel)
        assert row.within_3 == (abs(row.difference) <= 3)
    # Shares are percentages of agents; means are guesses in the range.
    assert ((held["model"] >= 0) & (held["model"] <= 100)).all()


def test_the_table_depends_on_the_settings(table) -> None:
    # Without learning the later rounds stay higher: the rows come from play, not constants.
    flat = calibration_table(ScriptedSettings(depth_growth=0.0), agents=10_000, seed=0)
    later = (flat["ratio"] == "2/3") & (flat["round"] == 4)
    assert flat.loc[later, "model"].item() > table.loc[later, "model"].item() + 1


def test_the_defaults_are_the_fit_s_best_point() -> None:
    best = fit_grid(agents=10_000, seed=0).iloc[0]
    assert (best["tau"], best["growth"]) == (TAU, DEPTH_GROWTH)
    assert ScriptedSettings().tau == TAU and ScriptedSettings().depth_growth == DEPTH_GROWTH


def test_session_averages_are_unweighted_means_of_the_sessions() -> None:
    refs = load_references()
    assert refs.period_means("2/3")[3] == pytest.approx((16.7 + 3.2 + 8.3 + 8.7) / 4)
    assert refs.period_means("0.5")[0] == pytest.approx((23.7 + 33.2 + 24.2) / 3)
    assert refs.period_means("4/3") is None and refs.high_share("4/3").shares == (0.16, 0.59, 0.68)


def test_the_command_prints_the_markdown_table(table, capsys) -> None:
    main(["--agents", "10000", "--seed", "0"])
    out = capsys.readouterr().out
    assert format_table(table) in out
    assert "| 2/3 | 4 | mean |" in out and "| 4/3 | 2 | % choosing 100 |" in out


def test_the_pipeline_run_matches_nagel_on_two_thirds(dask_client, tmp_path) -> None:
    # The same players through `simpipe run` (partitions, Parquet, the reduce): the pipeline
    # draws other random numbers than the table, so this checks the tolerance, not equality.
    config = small_config(tmp_path, population={"size": 8000, "partitions": 4},
                          game={"ratio": "2/3", "rounds": 4})
    result = run_simulation(config, client=dask_client, console=Console(quiet=True))
    means = result.summary.groupby("round")["mean"].mean().tolist()
    nagel = load_references().period_means("2/3")
    assert all(abs(m - h) <= 3 for m, h in zip(means, nagel, strict=True)), means
