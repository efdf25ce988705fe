"""The beauty contest behind the game interface gives what it gave before the interface:
fixed-seed scripted runs compared with summaries (and a digest of every guess) first recorded
with the code of commit b81ae74, the last one before ``simpipe.games.base.Game``.

Recorded again, on purpose, when the scripted agents were fitted to Nagel (1995) (level 0
repeats the previous mean, reasoning deepens each round, tau 1.2): the same procedure
reproduced the b81ae74 files bit for bit on the code before that change."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.results import read_rounds, read_summary

from support import REPO, small_config

DATA = REPO / "tests" / "data"
CASES = {
    "classic": ({}, "f7bdd28e9a1dd7c9ad866b1ba3031c5b905b33ed6fd0d3fceee53cdfd65d57fa"),
    "groups": ({"game": {"group_size": 7, "ratio": "1/2", "offset": 5, "rounds": 4},
                "agents": {"backend": "scripted",
                           "scripted": {"depth_shift": {"education": {"Ph.D.": 1.0}}}}},
               "99b9b222439e6647e4344c56af12072264de5cf5622c29e53e893da798d50aea"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_summary_and_every_guess_are_as_before(name, dask_client, tmp_path):
    sections, digest = CASES[name]
    config = small_config(tmp_path, **sections)
    run_simulation(config, client=dask_client, console=Console(quiet=True))
    summary = read_summary(config.run_dir)
    before = pd.read_csv(DATA / f"beauty_contest_{name}_summary.csv")
    before["round"] += 1  # recorded when summaries numbered rounds from 0
    assert list(summary.columns) == list(before.columns)
    for column in before.columns:  # bit for bit: the CSV holds 17 significant digits
        np.testing.assert_array_equal(summary[column].to_numpy(np.float64),
                                      before[column].to_numpy(np.float64), err_msg=column)
    guesses = (read_rounds(config.run_dir).sort_values(["round", "agent_id"])["guess"]
               .to_numpy(np.float64))
    assert hashlib.sha256(guesses.tobytes()).hexdigest() == digest
