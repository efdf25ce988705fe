"""What a partition contributes to a round's reduce: its answer status counts per group (the
same for every game) and the game's own per-group digest of its valid answers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# "no_final_answer" and "truncated": a chain of thought without its marked answer, an answer
# cut at the token limit (simpipe.games.parsing); both came later, so they go last.
STATUSES = ("ok", "unparsed", "out_of_range", "error", "truncated", "no_final_answer")
STATUS_COUNT_COLUMNS = ("n_ok", "n_unparsed", "n_out_of_range", "n_error", "n_truncated",
                        "n_no_final_answer")


def status_counts(rows: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """``(counts, valid)``: per group (sorted) ``group_id, n, n_ok, n_unparsed,
    n_out_of_range, n_error, n_truncated, n_no_final_answer`` of a round's rows
    (``group_id``, ``status``), and which rows hold a valid answer."""
    status = pd.Categorical(rows["status"], categories=STATUSES)
    onehot = pd.get_dummies(status).astype(np.int64)
    onehot.columns = list(STATUS_COUNT_COLUMNS)
    onehot.insert(0, "n", 1)
    onehot.insert(0, "group_id", rows["group_id"].to_numpy())
    counts = onehot.groupby("group_id", sort=True).sum().reset_index()
    return counts, np.asarray(status == "ok")


@dataclass
class Partial:
    """One partition's part of a round: small, picklable, merged exactly by the game."""

    status_counts: pd.DataFrame  # status_counts(): group_id, n, n_ok, ... n_error
    values: pd.DataFrame  # per group, the game's digest of the valid answers

    @staticmethod
    def concat(parts: list[Partial]) -> Partial:
        return Partial(
            pd.concat([p.status_counts for p in parts], ignore_index=True),
            pd.concat([p.values for p in parts], ignore_index=True),
        )
