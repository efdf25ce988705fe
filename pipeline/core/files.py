"""Atomic file writes: a reader never sees a half-written Parquet or JSON file.

Temporary files are hidden (leading dot) in the target's own directory, so Parquet dataset
readers skip them and ``os.replace`` stays on one filesystem.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded where a Parquet file is written: `simpipe validate` writes none
    import pandas as pd
    import pyarrow as pa

TEMP_SUFFIX = ".tmp"
CORRUPT_MARK = ".corrupt-"


def _temp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")


def write_parquet_atomic(frame: pd.DataFrame | pa.Table, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = (frame if isinstance(frame, pa.Table)
             else pa.Table.from_pandas(frame, preserve_index=False))
    tmp = _temp_for(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_for(path)
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temps(root: Path) -> int:
    """Delete temp files a killed run left behind; returns how many."""
    n = 0
    for tmp in root.rglob(f".*{TEMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        n += 1
    return n


def move_aside(path: Path) -> Path:
    """Rename a file found corrupt to ``.<name>.corrupt-<UTC time>`` beside it and return
    the new path. Hidden, so Parquet readers skip it; kept, so nothing is lost unseen."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f".{path.name}{CORRUPT_MARK}{stamp}")
    n = 1
    while target.exists():  # never replace an earlier one
        target = path.with_name(f".{path.name}{CORRUPT_MARK}{stamp}-{n}")
        n += 1
    path.rename(target)
    return target


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``lock_path``, created if absent, for
    processes that must take turns. The file is left in place: removing it would let a
    waiter lock a file that a newcomer no longer sees."""
    import fcntl  # POSIX only: imported where a lock is taken, not with this module

    with lock_path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
