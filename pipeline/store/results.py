"""Reading a run's results back (the public layout, with pandas).

``read_summary`` and ``read_ledger`` check what they read: a corrupt file raises
``simpipe.records.CorruptFile`` (a ValueError) naming it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simpipe.store import integrity
from simpipe.store.layout import RunPaths


def read_summary(run_dir: str | Path) -> pd.DataFrame:
    """``summary.parquet``, checked for the columns of the run's game (from run.json)."""
    paths = RunPaths(Path(run_dir))
    game = integrity.run_game(integrity.read_ledger(paths.ledger), paths.ledger)
    return integrity.read_summary(paths.summary, game.summary_columns)


def read_rounds(run_dir: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Every round's rows; ``round`` comes from the ``round=<r>`` directories."""
    frame = pd.read_parquet(RunPaths(Path(run_dir)).rounds, columns=columns)
    if "round" in frame:
        frame["round"] = frame["round"].astype("int64")
    return frame


def read_population(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_parquet(RunPaths(Path(run_dir)).population)


def read_ledger(run_dir: str | Path) -> dict:
    return integrity.read_ledger(RunPaths(Path(run_dir)).ledger)
