"""The beauty contest behind the game interface gives what it gave before the interface:
fixed-seed scripted runs compared with summaries (and a digest of every guess) recorded
with the code of commit b81ae74, the last one before ``simpipe.games.base.Game``."""

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
    "classic": ({}, "6020d07cc5e77594ce4ad436995baa8b026a8b742aaaf87a546cbe42a8272a22"),
    "groups": ({"game": {"group_size": 7, "ratio": "1/2", "offset": 5, "rounds": 4},
                "agents": {"backend": "scripted",
                           "scripted": {"depth_shift": {"education": {"Ph.D.": 1.0}}}}},
               "14e6f04524a4f52733d4519f17b218198a98a4c5121696ed6807f0a08c3652b1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_summary_and_every_guess_are_as_before(name, dask_client, tmp_path):
    sections, digest = CASES[name]
    config = small_config(tmp_path, **sections)
    run_simulation(config, client=dask_client, console=Console(quiet=True))
    summary = read_summary(config.run_dir)
    before = pd.read_csv(DATA / f"beauty_contest_{name}_summary.csv")
    assert list(summary.columns) == list(before.columns)
    for column in before.columns:  # bit for bit: the CSV holds 17 significant digits
        np.testing.assert_array_equal(summary[column].to_numpy(np.float64),
                                      before[column].to_numpy(np.float64), err_msg=column)
    guesses = (read_rounds(config.run_dir).sort_values(["round", "agent_id"])["guess"]
               .to_numpy(np.float64))
    assert hashlib.sha256(guesses.tobytes()).hexdigest() == digest
