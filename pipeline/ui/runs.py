"""Runs as the UI sees them: read only from the public files of each run directory.

A run publishes its progress through ``run.json`` alone (the ledger, rewritten atomically by
the client at most twice a second while a round runs and once per finished round), so the UI
needs no connection to the run's process or its Dask scheduler and works for runs on any
host that shares the results directory.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from simpipe.cluster.state import pid_alive
from simpipe.layout import RunPaths
from simpipe.ui.security import safe_child

# A "running" ledger that nothing has touched for this long belongs to a process that died
# (killed, node lost). Only a fallback: a ledger that names its pid and host is checked exactly.
STALE_AFTER_S = float(os.environ.get("SIMPIPE_UI_STALE_S", "900"))
HIST_BINS = 20
DELETABLE = {"finished", "failed", "interrupted"}


class RunNotFound(LookupError):
    pass


class ActionRefused(RuntimeError):
    """The action does not apply to the run in its current state (HTTP 409)."""


@dataclass(frozen=True)
class RunFiles:
    root: Path
    paths: RunPaths

    @classmethod
    def open(cls, results_root: Path, name: str) -> "RunFiles":
        """Raises UnsafeName for a name that is not a plain run name, RunNotFound if absent."""
        path = safe_child(results_root, name)
        paths = RunPaths(path)
        if not paths.ledger.is_file():
            raise RunNotFound(name)
        return cls(path, paths)


def read_ledger(paths: RunPaths) -> dict[str, Any] | None:
    try:
        return json.loads(paths.ledger.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def version(files: RunFiles) -> tuple:
    """Changes whenever anything the live view shows changes (cheap: a few stats)."""
    out: list[Any] = []
    for p in (files.paths.ledger, files.paths.summary, files.paths.cancel_flag,
              files.root / "report" / "report.html"):
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


# --- state ------------------------------------------------------------------------------------

def _last_activity(paths: RunPaths, ledger: dict[str, Any]) -> float:
    """Newest mtime among the files a live run keeps touching."""
    progress = ledger.get("progress") or {}
    candidates = [paths.ledger, paths.log]
    if "round" in progress:
        candidates.append(paths.round_dir(int(progress["round"])))
    times = []
    for p in candidates:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def effective_state(paths: RunPaths, ledger: dict[str, Any],
                    now: float | None = None) -> tuple[str, str | None]:
    """(state to show, why it differs from the ledger's). A process that died leaves
    ``running`` in its ledger forever; that run is shown as interrupted (resumable)."""
    state = str(ledger.get("state", "unknown"))
    if state not in ("running", "created"):
        return state, None
    pid, host = ledger.get("pid"), ledger.get("host")
    if isinstance(pid, int) and host == socket.gethostname():
        if not pid_alive(pid):
            return "interrupted", f"its process {pid} is gone"
        return state, None
    now = time.time() if now is None else now
    idle = now - _last_activity(paths, ledger)
    if idle > STALE_AFTER_S:
        return "interrupted", f"no sign of life for {idle / 60:.0f} min"
    return state, None


# --- rows and details -------------------------------------------------------------------------

def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _complete_rounds(ledger: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r): rec for r, rec in (ledger.get("rounds") or {}).items() if rec.get("complete")}


def run_row(files: RunFiles, ledger: dict[str, Any]) -> dict[str, Any]:
    """One line of the runs list."""
    state, why = effective_state(files.paths, ledger)
    rounds = _complete_rounds(ledger)
    counts = {"ok": 0, "unparsed": 0, "out_of_range": 0, "error": 0}
    tokens_in = tokens_out = 0
    for rec in rounds.values():
        counts["ok"] += int(rec.get("n_valid", 0))
        counts["unparsed"] += int(rec.get("n_unparsed", 0))
        counts["out_of_range"] += int(rec.get("n_out_of_range", 0))
        counts["error"] += int(rec.get("n_error", 0))
        tokens_in += int(rec.get("tokens_in", 0) or 0)
        tokens_out += int(rec.get("tokens_out", 0) or 0)
    wall = _num((ledger.get("timings") or {}).get("wall_s"))
    if state == "running":
        created = _parse_time(ledger.get("created_at"))
        wall = time.time() - created if created else wall
    config = ledger.get("config") or {}
    return {
        "name": files.root.name,
        "config_hash": ledger.get("config_hash"),
        "state": state,
        "ledger_state": ledger.get("state"),
        "state_note": why,
        "backend": (config.get("agents") or {}).get("backend"),
        "rounds_done": len(rounds),
        "rounds_total": ledger.get("rounds_total"),
        "n_agents": ledger.get("n_agents"),
        "counts": counts,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "wall_s": round(wall, 1) if wall is not None else None,
        "updated_at": ledger.get("updated_at"),
        "cancel_requested": files.paths.cancel_flag.exists(),
        "has_report": (files.root / "report" / "report.html").is_file(),
        "progress": ledger.get("progress") if state == "running" else None,
    }


def _parse_time(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def list_runs(results_root: Path) -> list[dict[str, Any]]:
    rows = []
    if not results_root.is_dir():
        return rows
    for child in sorted(results_root.iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        try:
            files = RunFiles.open(results_root, child.name)
        except (RunNotFound, ValueError):
            continue
        ledger = read_ledger(files.paths)
        if ledger is not None:
            rows.append(run_row(files, ledger))
    # Live runs first, then the newest.
    rows.sort(key=lambda r: (r["state"] != "running", -(_parse_time(r["updated_at"]) or 0)))
    return rows


def _equilibrium(game: dict[str, Any]) -> float | None:
    from simpipe.games.beauty_contest import equilibrium  # noqa: PLC0415
    from simpipe.games.config import GameConfig  # noqa: PLC0415

    try:
        return equilibrium(GameConfig(**game))
    except (TypeError, ValueError):
        return None


def run_detail(files: RunFiles) -> dict[str, Any]:
    """Everything the live view draws: progress, per-round chart, histogram, endpoints."""
    ledger = read_ledger(files.paths)
    if ledger is None:
        raise RunNotFound(files.root.name)
    row = run_row(files, ledger)
    config = ledger.get("config") or {}
    game = config.get("game") or {}
    done = _complete_rounds(ledger)
    per_round = _summary_by_round(files.paths)
    chart = []
    for r in sorted(done):
        rec, summ = done[r], per_round.get(r, {})
        chart.append({
            "round": r, "n": rec.get("n"), "n_valid": rec.get("n_valid"),
            "n_unparsed": rec.get("n_unparsed"), "n_out_of_range": rec.get("n_out_of_range"),
            "n_error": rec.get("n_error"), "mean": _num(rec.get("mean")),
            "median": summ.get("median"), "target": summ.get("target"),
            "winning_guess": summ.get("winning_guess"), "elapsed_s": rec.get("elapsed_s"),
            "agents_per_s": rec.get("agents_per_s"),
        })
    histogram = None
    if done:
        last = max(done)
        histogram = _histogram(files.paths, last, _num(game.get("low")) or 0.0,
                               _num(game.get("high")) or 100.0)
        if histogram is not None:
            histogram["target"] = per_round.get(last, {}).get("target")
    return {
        **row,
        "game": {k: game.get(k) for k in ("ratio", "offset", "low", "high", "rounds",
                                          "group_size", "prompt")},
        "equilibrium": _equilibrium(game),
        "n_partitions": ledger.get("n_partitions"),
        "progress": ledger.get("progress") if row["state"] == "running" else None,
        "rounds": chart,
        "histogram": histogram,
        "endpoints": ledger.get("endpoints") or {},
        "timings": ledger.get("timings") or {},
        "error": ledger.get("error"),
        "scheduler": ledger.get("scheduler"),
        "created_at": ledger.get("created_at"),
    }


# Parquet reads are the only costly part of a refresh: cache them by file version.
_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 64


def _cached(key: tuple, compute):
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    value = compute()
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))
        _cache[key] = value
    return value


def _summary_by_round(paths: RunPaths) -> dict[int, dict[str, float | None]]:
    try:
        st = paths.summary.stat()
    except OSError:
        return {}

    def compute() -> dict[int, dict[str, float | None]]:
        summary = pd.read_parquet(paths.summary, columns=["round", "median", "target",
                                                          "winning_guess"])
        # Several groups: averaged over groups, as the report's rounds table does.
        means = summary.groupby("round").mean(numeric_only=True)
        return {int(r): {k: _num(v) for k, v in row.items()} for r, row in means.iterrows()}

    return _cached(("summary", str(paths.summary), st.st_mtime_ns, st.st_size), compute)


def _histogram(paths: RunPaths, round_index: int, low: float,
               high: float) -> dict[str, Any] | None:
    round_dir = paths.round_dir(round_index)
    try:
        st = round_dir.stat()
    except OSError:
        return None

    def compute() -> dict[str, Any] | None:
        table = ds.dataset(round_dir, format="parquet").to_table(columns=["guess", "status"])
        frame = table.to_pandas()
        valid = frame.loc[frame["status"] == "ok", "guess"].dropna().to_numpy(np.float64)
        counts, edges = np.histogram(valid, bins=HIST_BINS, range=(low, high))
        return {"round": round_index, "edges": [float(e) for e in edges],
                "counts": [int(c) for c in counts], "n_valid": int(valid.size),
                "n": int(len(frame))}

    return _cached(("hist", str(round_dir), st.st_mtime_ns, low, high), compute)


# --- actions ----------------------------------------------------------------------------------

def cancel_run(files: RunFiles) -> dict[str, Any]:
    """Ask the run to stop at its next clean point; it stays resumable."""
    ledger = read_ledger(files.paths) or {}
    state, _ = effective_state(files.paths, ledger)
    if state not in ("running", "created"):
        raise ActionRefused(f"run {files.root.name} is {state}, not running")
    files.paths.cancel_flag.touch()
    return {"name": files.root.name, "cancel_requested": True}


def delete_run(files: RunFiles, confirm: str | None) -> dict[str, Any]:
    """Remove a run directory that no process writes to any more."""
    if confirm != files.root.name:
        raise ActionRefused("type the run's name to confirm deleting it")
    ledger = read_ledger(files.paths) or {}
    state, _ = effective_state(files.paths, ledger)
    if state not in DELETABLE:
        raise ActionRefused(f"run {files.root.name} is {state}; only finished, failed or "
                            "interrupted runs can be deleted")
    shutil.rmtree(files.root)
    return {"name": files.root.name, "deleted": True}
