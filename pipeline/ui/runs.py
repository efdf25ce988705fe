"""Runs as the UI sees them: read only from the public files of each run directory.

A run publishes its progress through ``run.json`` alone (the ledger, rewritten atomically by
the client at most twice a second while a round runs and once per finished round), so the UI
needs no connection to the run's process or its Dask scheduler and works for runs on any
host that shares the results directory.

Every file is read through ``simpipe.store.integrity`` and must resolve under the results root: a
run whose ``run.json`` is broken is listed with state ``broken`` and the problem, and a
corrupt round or summary file is named on the run's page; neither costs the other runs.
"""

from __future__ import annotations

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

from simpipe.cluster.state import pid_alive
from simpipe.core.records import CorruptFile
from simpipe.games import validity
from simpipe.games.base import Game
from simpipe.store.integrity import RESUME_REPAIRS, read_part, read_summary
from simpipe.store.layout import RunPaths
from simpipe.store.record import RunRecord, read_ledger
from simpipe.store.states import ENDED_STATES, LIVE_STATES, RunState
from simpipe.ui.security import OutsideRoot, UnsafeName, contained, safe_child

# A "running" ledger that nothing has touched for this long belongs to a process that died
# (killed, node lost). Only a fallback: a ledger that names its pid and host is checked exactly.
STALE_AFTER_S = float(os.environ.get("SIMPIPE_UI_STALE_S", "900"))
HIST_BINS = 20
# The runs-list state of a run whose run.json cannot be read: the page's word, not a state
# any run is ever in (so not a RunState).
BROKEN = "broken"


class RunNotFound(LookupError):
    pass


class ActionRefused(RuntimeError):
    """The action does not apply to the run in its current state (HTTP 409)."""


@dataclass(frozen=True)
class RunFiles:
    root: Path
    paths: RunPaths
    results: Path  # the results root, which every file read must resolve under

    @classmethod
    def open(cls, results_root: Path, name: str) -> RunFiles:
        """Raises UnsafeName for a name that is not a plain run name, RunNotFound if absent,
        OutsideRoot if its run.json is a symlink out of the results root."""
        path = safe_child(results_root, name)
        paths = RunPaths(path)
        if not paths.ledger.is_file():
            raise RunNotFound(name)
        contained(results_root, paths.ledger)
        return cls(path, paths, results_root)

    def inside(self, path: Path) -> Path:
        """``path`` (a file of this run) resolved; OutsideRoot if a symlink leads out."""
        return contained(self.results, path)

    def report(self) -> Path | None:
        """The report page, if ``simpipe report`` made one; OutsideRoot if it leads out."""
        page = self.inside(self.root / "report" / "report.html")
        return page if page.is_file() else None


def load_ledger(files: RunFiles) -> RunRecord:
    """The run's checked run.json; RunNotFound once it is gone, CorruptFile if broken."""
    if not files.paths.ledger.exists():
        raise RunNotFound(files.root.name)
    # Read where it resolves (inside the results root); errors name it under the run.
    return read_ledger(files.inside(files.paths.ledger)).at(files.paths.ledger)


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

def _last_activity(paths: RunPaths, ledger: RunRecord) -> float:
    """Newest mtime among the files a live run keeps touching."""
    candidates = [paths.ledger, paths.log]
    if ledger.progress_round is not None:
        candidates.append(ledger.run_paths(paths.root).round_dir(ledger.progress_round))
    times = []
    for p in candidates:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def effective_state(paths: RunPaths, ledger: RunRecord,
                    now: float | None = None) -> tuple[RunState, str | None]:
    """(state to show, why it differs from the ledger's). A process that died leaves
    ``running`` in its ledger forever; that run is shown as interrupted (resumable)."""
    state = ledger.state
    if state not in LIVE_STATES:
        return state, None
    pid, host = ledger.pid, ledger.host
    if pid is not None and host == socket.gethostname():
        if not pid_alive(pid):
            return RunState.INTERRUPTED, f"its process {pid} is gone"
        return state, None
    now = time.time() if now is None else now
    idle = now - _last_activity(paths, ledger)
    if idle > STALE_AFTER_S:
        return RunState.INTERRUPTED, f"no sign of life for {idle / 60:.0f} min"
    return state, None


# --- rows and details -------------------------------------------------------------------------

def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _progress(ledger: RunRecord, state: str) -> dict[str, Any] | None:
    """The live round's progress, for a run that is running; its ``round`` numbered from 1."""
    if state != RunState.RUNNING or ledger.progress is None or ledger.progress_round is None:
        return None
    return {**ledger.progress.model_dump(), "round": ledger.progress_round + 1}


def run_row(files: RunFiles, ledger: RunRecord) -> dict[str, Any]:
    """One line of the runs list."""
    state, why = effective_state(files.paths, ledger)
    totals = ledger.totals()
    wall = _num(ledger.wall_s)
    if state == RunState.RUNNING:
        created = _parse_time(ledger.created_at)
        wall = time.time() - created if created else wall
    try:
        has_report = files.report() is not None
    except OutsideRoot:
        has_report = False
    return {
        "name": files.root.name,
        "config_hash": ledger.config_hash,
        "state": state,
        "ledger_state": ledger.state,
        "state_note": why,
        "backend": ledger.backend,
        "answers_source": ledger.answers_source,
        "rounds_done": ledger.rounds_done,
        "rounds_total": ledger.rounds_total,
        "n_agents": ledger.n_agents,
        "counts": totals.counts(),
        "tokens_in": totals.tokens_in,
        "tokens_out": totals.tokens_out,
        "wall_s": round(wall, 1) if wall is not None else None,
        "updated_at": ledger.updated_at,
        "cancel_requested": files.paths.cancel_flag.exists(),
        "has_report": has_report,
        "progress": _progress(ledger, state),
        "problem": None,
    }


def broken_row(name: str, problem: str) -> dict[str, Any]:
    """The runs-list line of a run whose run.json cannot be used: the same keys, no numbers."""
    return {
        "name": name, "config_hash": None, "state": BROKEN, "ledger_state": None,
        "state_note": None, "backend": None, "answers_source": None, "rounds_done": 0,
        "rounds_total": None,
        "n_agents": None, "counts": {"ok": 0, "unparsed": 0, "out_of_range": 0, "error": 0,
                                     "truncated": 0, "no_final_answer": 0},
        "tokens_in": 0, "tokens_out": 0, "wall_s": None, "updated_at": None,
        "cancel_requested": False, "has_report": False, "progress": None, "problem": problem,
    }


# What a broken run's page gets besides its list line: the keys of run_detail, empty.
EMPTY_DETAIL: dict[str, Any] = {
    "game": {}, "kind": None, "describe": None, "answer_plural": None, "equilibrium": None,
    "equilibrium_name": None, "chart": None, "round_columns": [], "n_partitions": None,
    "rounds": [], "histogram": None, "endpoints": {}, "timings": {}, "error": None,
    "scheduler": None, "created_at": None,
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
            rows.append(run_row(files, load_ledger(files)))
        except (RunNotFound, UnsafeName):
            continue  # not a run, or not a name the UI serves
        except (CorruptFile, OutsideRoot) as exc:
            rows.append(broken_row(child.name, _problem(child, exc)))
    # Live runs first, then the newest.
    rows.sort(key=lambda r: (r["state"] != RunState.RUNNING, -(_parse_time(r["updated_at"]) or 0)))
    return rows


def _problem(run_dir: Path, exc: Exception) -> str:
    """One line for the page: the file (relative to the run) and what is wrong with it."""
    if isinstance(exc, CorruptFile):
        repair = RESUME_REPAIRS if exc.path.suffix == ".parquet" else "restore it from a copy"
        return f"{exc.shown_under(run_dir)}; {repair}"
    return str(exc)


def run_detail(files: RunFiles) -> dict[str, Any]:
    """Everything the live view draws: progress, per-round chart, histogram, endpoints.
    A broken file is named in ``problem``; what can still be read is shown."""
    try:
        ledger = load_ledger(files)
        game = ledger.game()
    except (CorruptFile, OutsideRoot) as exc:
        return {**broken_row(files.root.name, _problem(files.root, exc)), **EMPTY_DETAIL}
    row = run_row(files, ledger)
    done = ledger.finished_rounds()
    problems: list[str] = []
    try:
        per_round = _summary_by_round(files, ledger, game) if done else {}
    except (CorruptFile, OutsideRoot) as exc:
        per_round = {}
        problems.append(_problem(files.root, exc))
    chart = []
    for r, rec in done.items():  # r from 0; the page and the API number rounds from 1
        chart.append({
            "round": r + 1, "n": rec.n, "n_valid": rec.n_valid, "n_unparsed": rec.n_unparsed,
            "n_out_of_range": rec.n_out_of_range, "n_error": rec.n_error,
            "n_truncated": rec.n_truncated, "n_no_final_answer": rec.n_no_final_answer,
            "mean": _num(rec.mean), **per_round.get(r + 1, {}), "elapsed_s": rec.elapsed_s,
            "agents_per_s": rec.agents_per_s,
            # the report's validity rule: a round not valid enough is marked on the page
            "valid_enough": validity.valid_enough(rec.n, rec.n_valid),
            "flag": validity.problem(rec.n, rec.n_valid),
        })
    histogram = None
    if done:
        last = max(done)
        try:
            histogram = _histogram(files, ledger, last, game)
        except (CorruptFile, OutsideRoot) as exc:
            problems.append(_problem(files.root, exc))
        if histogram is not None:
            mark = game.round_mark(per_round.get(last + 1, {}))
            histogram["mark"] = None if mark is None else {"label": mark[0], "value": mark[1]}
    return {
        **row,
        "problem": "; ".join(problems) or None,
        "game": ledger.section("game"),
        "kind": game.kind,
        "describe": game.describe(),
        "answer_plural": game.answer_plural,
        "equilibrium": game.equilibrium(),
        "equilibrium_name": game.equilibrium_name,
        "chart": _chart(game),
        "round_columns": [list(c) for c in game.page_columns],
        "n_partitions": ledger.n_partitions,
        "progress": _progress(ledger, row["state"]),
        "rounds": chart,
        "histogram": histogram,
        "endpoints": ledger.endpoints,
        "timings": ledger.timings,
        "error": ledger.error,
        "scheduler": ledger.scheduler,
        "created_at": ledger.created_at,
    }


def _chart(game: Game) -> dict[str, Any]:
    """The game's per-round chart (``Game.round_chart``) as the page draws it."""
    chart = game.round_chart()
    reference = None
    if chart.reference is not None:
        reference = {"label": chart.reference[0], "values": list(chart.reference[1])}
    return {"title": chart.title, "y_label": chart.y_label, "y_range": list(chart.y_range),
            "series": [list(s) for s in chart.series],
            "levels": [list(level) for level in chart.levels], "reference": reference}


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


def _summary_by_round(files: RunFiles, ledger: RunRecord,
                      game: Game) -> dict[int, dict[str, float | None]]:
    """The game's per-round statistics, by round number (from 1)."""
    path = files.inside(files.paths.summary)
    try:
        st = path.stat()
    except OSError:
        return {}

    def compute() -> dict[int, dict[str, float | None]]:
        # The game's statistics over all groups (the beauty contest: group averages, as
        # the report's rounds table has them).
        pooled = game.summary_by_round(read_summary(path, game.summary_columns,
                                                    first_round=ledger.first_round))
        return {int(r): {k: _num(v) for k, v in row.items()} for r, row in pooled.iterrows()}

    return _cached(("summary", str(path), st.st_mtime_ns, st.st_size, game.kind,
                    ledger.first_round), compute)


def _histogram(files: RunFiles, ledger: RunRecord, round_index: int,
               game: Game) -> dict[str, Any] | None:
    """The answers of a finished round (``round_index`` from 0; ``round`` in the result from
    1), every part file checked (CorruptFile names one)."""
    bounds = ledger.partition_bounds()
    paths = ledger.run_paths(files.root)  # its rounds' folders as the run numbers them
    parts = [files.inside(paths.round_part(round_index, k)) for k in range(len(bounds))]
    stamps = []
    for part in parts:
        try:
            st = part.stat()
            stamps.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append(None)  # missing: read_part names it

    def compute() -> dict[str, Any] | None:
        frame = pd.concat([read_part(part, agents, ["guess", "status"])
                           for part, agents in zip(parts, bounds, strict=True)],
                          ignore_index=True)
        valid = frame.loc[frame["status"] == "ok", "guess"].dropna().to_numpy(np.float64)
        counts, edges = np.histogram(valid, bins=game.answer().bin_edges(HIST_BINS))
        return {"round": round_index + 1, "edges": [float(e) for e in edges],
                "counts": [int(c) for c in counts], "n_valid": int(valid.size),
                "n": int(len(frame))}

    return _cached(("hist", str(paths.round_dir(round_index)), tuple(stamps),
                    game.answer()), compute)


# --- actions ----------------------------------------------------------------------------------

def _ledger_for_action(files: RunFiles) -> RunRecord:
    try:
        return load_ledger(files)
    except (CorruptFile, OutsideRoot) as exc:
        raise ActionRefused(f"{_problem(files.root, exc)}; nothing was changed") from None


def cancel_run(files: RunFiles) -> dict[str, Any]:
    """Ask the run to stop at its next clean point; it stays resumable."""
    ledger = _ledger_for_action(files)
    state, _ = effective_state(files.paths, ledger)
    if state not in LIVE_STATES:
        raise ActionRefused(f"run {files.root.name} is {state}, not running")
    files.paths.cancel_flag.touch()
    return {"name": files.root.name, "cancel_requested": True}


def delete_run(files: RunFiles, confirm: str | None) -> dict[str, Any]:
    """Remove a run directory that no process writes to any more."""
    if confirm != files.root.name:
        raise ActionRefused("type the run's name to confirm deleting it")
    ledger = _ledger_for_action(files)
    state, _ = effective_state(files.paths, ledger)
    if state not in ENDED_STATES:
        raise ActionRefused(f"run {files.root.name} is {state}; only finished, failed or "
                            "interrupted runs can be deleted")
    shutil.rmtree(files.root)
    return {"name": files.root.name, "deleted": True}
