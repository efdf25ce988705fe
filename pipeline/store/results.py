"""Reading a run's results back (the public layout, with pandas).

``read_summary`` and ``read_ledger`` check what they read: a corrupt file raises
``simpipe.core.records.CorruptFile`` (a ValueError) naming it. ``read_ledger`` gives
``run.json`` as a typed ``RunRecord`` (``simpipe.store.record``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simpipe.store import integrity, record
from simpipe.store.layout import RunPaths, numbered_from_one
from simpipe.store.record import RunRecord


def read_summary(run_dir: str | Path) -> pd.DataFrame:
    """``summary.parquet`` (one row per round and group; what ``simpipe show`` prints),
    checked for the columns of the run's game (from run.json), rounds numbered from 1 (also
    for a run written when files numbered them from 0). A run with no finished round yet has
    none: an empty frame with the game's columns."""
    paths = RunPaths(Path(run_dir))
    ledger = record.read_ledger(paths.ledger)
    game = ledger.game()
    if not ledger.completed_rounds() and not paths.summary.exists():
        return pd.DataFrame(columns=list(game.summary_columns))
    return integrity.read_summary(paths.summary, game.summary_columns,
                                  first_round=ledger.first_round)


def read_rounds(run_dir: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Every round's rows; ``round`` (int64, numbered from 1) comes from the ``round=<r>``
    directories (numbered from 0 in a run written before; shifted here)."""
    paths = RunPaths(Path(run_dir))
    frame = pd.read_parquet(paths.rounds, columns=columns)
    return numbered_from_one(frame, record.read_ledger(paths.ledger).first_round)


def read_population(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_parquet(RunPaths(Path(run_dir)).population)


def read_ledger(run_dir: str | Path) -> RunRecord:
    """``run.json``: the run's state, config, per-round records, progress, timings and
    endpoint counters, typed (``RunRecord``), with the methods callers need
    (``completed_rounds()``, ``first_incomplete_round()``, ``totals()``, ...)."""
    return record.read_ledger(RunPaths(Path(run_dir)).ledger)
