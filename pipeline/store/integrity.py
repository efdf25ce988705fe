"""A run's files read as untrusted input: each is checked before anything trusts it.

What is on disk may be truncated (a full disk, a killed copy), replaced by hand or damaged;
the run, ``simpipe show``, ``simpipe report`` and the web page all read through these
functions, so a bad file is named the same way everywhere (``CorruptFile``: its path and what
is wrong) and costs that file, never the reader.

A part file (``rounds/round=<r>/part-<k>.parquet``, ``population/part-<k>.parquet``) holds
the agents of one partition, ids ``start..stop-1`` in order. Checking it costs its Parquet
footer (row count, schema) and its ``agent_id`` column, not a read of every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simpipe.core.records import CorruptFile, error_reason
from simpipe.store.layout import RunPaths, numbered_from_one

AgentRange = tuple[int, int]  # [start, stop) of one partition's agent ids
# What to do about a corrupt part or summary file: the run repairs its own files.
RESUME_REPAIRS = "`simpipe run CONFIG --resume` moves it aside and rebuilds it"



# --- part files -------------------------------------------------------------------------------

def _checked_table(path: Path, agents: AgentRange, required: Sequence[str],
                   read: Sequence[str]) -> pa.Table:
    start, stop = agents
    read = ["agent_id", *(c for c in read if c != "agent_id")]
    try:
        with pq.ParquetFile(path) as parquet:
            names = parquet.schema_arrow.names
            missing = [c for c in dict.fromkeys([*read, *required]) if c not in names]
            if missing:
                raise CorruptFile(path, f"no column {', '.join(missing)}")
            rows = parquet.metadata.num_rows
            if rows != stop - start:
                raise CorruptFile(path, f"{rows} rows, expected {stop - start} "
                                        f"(agents {start}..{stop - 1})")
            table = parquet.read(columns=read)
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise CorruptFile(path, f"not a readable Parquet file ({error_reason(exc)})") from None
    ids = table.column("agent_id")
    if ids.null_count or not pa.types.is_integer(ids.type):
        raise CorruptFile(path, "agent_id is not a column of integers")
    values = ids.to_numpy()
    if values.size and (values[0] != start or values[-1] != stop - 1
                        or not np.all(np.diff(values) == 1)):
        raise CorruptFile(path, f"agent ids {values.min()}..{values.max()} are not this "
                                f"partition's {start}..{stop - 1} in order")
    return table


def read_part(path: Path, agents: AgentRange, columns: Sequence[str] = (),
              required: Sequence[str] = ()) -> pd.DataFrame:
    """``agent_id`` and ``columns`` of one part file, after checking that it holds exactly
    the agents ``agents`` (``[start, stop)``, in order) and has the ``required`` columns too;
    CorruptFile otherwise."""
    table = _checked_table(path, agents, required, columns)
    try:
        return table.to_pandas()
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptFile(path, f"unreadable columns ({error_reason(exc)})") from None


def check_part(path: Path, agents: AgentRange, columns: Sequence[str] = ()) -> None:
    """CorruptFile unless ``path`` holds exactly the agents ``agents`` and has ``columns``.
    Reads the footer and the agent_id column only."""
    _checked_table(path, agents, columns, ())


def round_problems(paths: RunPaths, round_index: int, bounds: Sequence[AgentRange],
                   columns: Sequence[str] = ()) -> list[CorruptFile]:
    """Every part of one round that is missing or corrupt (empty: the round is whole)."""
    problems = []
    for k, agents in enumerate(bounds):
        try:
            check_part(paths.round_part(round_index, k), agents, columns)
        except CorruptFile as exc:
            problems.append(exc)
    return problems


# --- summary.parquet ----------------------------------------------------------------------------

#: Summary columns that files written before them lack (read as 0: no such answers then).
ADDED_LATER = ("n_truncated", "n_no_final_answer")


def read_summary(path: Path, columns: Sequence[str], *, first_round: int) -> pd.DataFrame:
    """``summary.parquet`` with every summary column of its game (``Game.summary_columns``),
    its ``round`` column numbered from 1 (``first_round``: the number of the run's first
    round on disk, ``RunRecord.first_round``); CorruptFile otherwise."""
    try:
        summary = pd.read_parquet(path)
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptFile(path, f"not a readable Parquet file ({error_reason(exc)})") from None
    for column in ADDED_LATER:
        # Counts of statuses an older version did not have: none of its answers had them.
        if column in columns and column not in summary.columns:
            summary[column] = np.zeros(len(summary), np.int64)
    missing = [c for c in columns if c not in summary.columns]
    if missing:
        raise CorruptFile(path, f"no column {', '.join(missing)}")
    if not pd.api.types.is_integer_dtype(summary["round"]):
        raise CorruptFile(path, "the round column is not integers")
    return numbered_from_one(summary, first_round)


