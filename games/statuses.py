"""Answer statuses and their counts per group: the part of every game's partial and summary
that does not depend on the game."""

from __future__ import annotations

import numpy as np
import pandas as pd

STATUSES = ("ok", "unparsed", "out_of_range", "error")
STATUS_COUNT_COLUMNS = ("n_ok", "n_unparsed", "n_out_of_range", "n_error")


def status_counts(rows: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """``(counts, valid)``: per group (sorted) ``group_id, n, n_ok, n_unparsed,
    n_out_of_range, n_error`` of a round's rows (``group_id``, ``status``), and which rows
    hold a valid answer."""
    status = pd.Categorical(rows["status"], categories=STATUSES)
    onehot = pd.get_dummies(status).astype(np.int64)
    onehot.columns = list(STATUS_COUNT_COLUMNS)
    onehot.insert(0, "n", 1)
    onehot.insert(0, "group_id", rows["group_id"].to_numpy())
    counts = onehot.groupby("group_id", sort=True).sum().reset_index()
    return counts, np.asarray(status == "ok")
