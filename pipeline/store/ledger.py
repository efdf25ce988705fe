"""``run.json``: the resolved config, versions, timings and the resume ledger.

Only the client writes it. A round counts as complete when its summary rows are in
``summary.parquet`` and the ledger says so; a partition counts as complete when its Parquet
file exists (files are written atomically, so existence is the completion marker).
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from simpipe.config import Config
from simpipe.errors import SimpipeError
from simpipe.files import write_json_atomic
from simpipe.store.integrity import MAX_LEDGER_BYTES, CorruptFile, StrictRecord, read_json_record
from simpipe.store.layout import RunPaths, is_run_entry


class RunDirError(SimpipeError, ValueError):
    """The results directory cannot be used as asked; the message names the fix."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def package_versions() -> dict[str, str]:
    names = ["simpipe", "dask", "distributed", "pandas", "pyarrow", "numpy", "xllamacpp"]
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


class Ledger:
    """A thin, always-saved view of ``run.json``."""

    def __init__(self, paths: RunPaths, data: dict[str, Any]) -> None:
        self.paths = paths
        self.data = data
        self._last_progress_save = 0.0

    @classmethod
    def new(cls, paths: RunPaths, config: Config) -> Ledger:
        data = {
            "name": config.run.name,
            "config_hash": config.results_hash(),
            "population_hash": config.population_hash(),
            "config": config.model_dump(mode="json"),
            "versions": package_versions(),
            "state": "created",
            "created_at": _now(),
            "updated_at": _now(),
            "rounds_total": config.game.rounds,
            "n_agents": config.population.size,
            "n_partitions": config.population.n_partitions,
            "rounds": {},
            "progress": None,
            "timings": {},
            "endpoints": {},
        }
        ledger = cls(paths, data)
        ledger.save()
        return ledger

    def save(self) -> None:
        self.data["updated_at"] = _now()
        write_json_atomic(self.data, self.paths.ledger)

    # --- state -----------------------------------------------------------------------------

    def set_state(self, state: str, **extra: Any) -> None:
        self.data["state"] = state
        self.data.update(extra)
        self.save()

    def completed_rounds(self) -> list[int]:
        return sorted(int(r) for r, rec in self.data["rounds"].items() if rec.get("complete"))

    def record_progress(self, round_index: int, done: int, total: int, agents_done: int,
                        elapsed_s: float, force: bool = False) -> None:
        """Live progress for watchers (the UI); saved at most twice a second."""
        self.data["progress"] = {
            "round": round_index, "partitions_done": done, "partitions_total": total,
            "agents_done": agents_done, "elapsed_s": round(elapsed_s, 3),
            "agents_per_s": round(agents_done / elapsed_s, 1) if elapsed_s > 0 else None,
        }
        now = time.monotonic()
        if force or now - self._last_progress_save >= 0.5:
            self._last_progress_save = now
            self.save()

    def record_round(self, round_index: int, record: dict[str, Any]) -> None:
        self.data["rounds"][str(round_index)] = {"complete": True, **record}
        self.data["progress"] = None
        self.save()

    def add_timing(self, name: str, seconds: float) -> None:
        self.data["timings"][name] = round(self.data["timings"].get(name, 0.0) + seconds, 3)


def open_run_dir(paths: RunPaths, config: Config, *, resume: bool, force: bool) -> Ledger:
    """Create, resume or (with ``force``) replace a run directory; refuse anything else."""
    root = paths.root
    output_dir = Path(config.run.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirError(f"run.output_dir = {str(output_dir)!r} is a file, not a folder; "
                          "set run.output_dir to a folder")
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run folder; choose another run.name")
    fresh = not root.exists() or _not_started(root)
    if force and (root.is_symlink() or not fresh):
        _remove_run(root)
        fresh = True
    if fresh:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create the run folder {root} ({exc.strerror}); "
                              "check run.output_dir") from None
        return Ledger.new(paths, config)
    data = _ledger_data(paths.ledger)
    if data is None:
        raise RunDirError(
            f"{root} exists and is not a simpipe run (no valid run.json); choose another "
            "run.name or run.output_dir"
        )
    ledger = Ledger(paths, data)
    if ledger.data.get("config_hash") != config.results_hash():
        raise RunDirError(
            f"{root} holds a run made from a different config "
            f"(hash {ledger.data.get('config_hash')} there, {config.results_hash()} now); "
            "pass --force to replace it, or set run.name to a new name "
            "(--resume only continues a run with the same config)"
        )
    if not resume:
        done = len(ledger.completed_rounds())
        raise RunDirError(
            f"{root} already holds this run ({ledger.data.get('state')}, {done}/"
            f"{config.game.rounds} rounds); pass --resume to continue it or --force to start over"
        )
    return ledger


def _not_started(root: Path) -> bool:
    """Empty, or holding only what is written before a run starts: the population of
    ``simpipe population build`` and the logs of SLURM jobs started for the run."""
    return all(p.name in ("population", "logs") and p.is_dir() and not p.is_symlink()
               for p in root.iterdir())


class _RunMarks(StrictRecord):
    """What makes a ``run.json`` simpipe's: a run with other fields damaged is still one
    (``--force`` replaces it; ``simpipe.store.integrity.read_ledger`` refuses to resume it)."""

    config_hash: str
    rounds: dict[str, Any]


def _ledger_data(path: Path) -> dict[str, Any] | None:
    """``run.json`` as simpipe writes it, or None for a missing, unreadable or foreign file."""
    try:
        return read_json_record(path, _RunMarks, MAX_LEDGER_BYTES)
    except CorruptFile:
        return None


def _remove_run(root: Path) -> None:
    """``--force``: delete a run folder, only if everything in it is what simpipe writes."""
    if root.is_symlink():
        raise RunDirError(f"{root} is a symbolic link; --force never deletes through a link: "
                          "remove the link yourself or choose another run.name")
    if _ledger_data(root / "run.json") is None:
        raise RunDirError(f"{root} is not a simpipe run (no valid run.json), so --force leaves "
                          "it alone; choose another run.name or run.output_dir")
    foreign = sorted(p.name for p in root.iterdir() if not is_run_entry(p))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise RunDirError(f"{root} holds files simpipe did not write ({shown}), so --force "
                          "leaves it alone; move them out or choose another run.name")
    shutil.rmtree(root)
