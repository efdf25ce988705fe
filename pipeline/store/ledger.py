"""Writing ``run.json`` (the record of ``simpipe.store.record``: the resolved config, versions,
timings and the resume ledger) and opening a run folder.

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

from simpipe.config.model import Config
from simpipe.config.population_mix import llm_groups
from simpipe.core.errors import SimpipeError
from simpipe.core.files import write_json_atomic
from simpipe.core.records import CorruptFile, StrictRecord, read_json_record
from simpipe.games.validity import MODEL, RULE_BASED, SYNTHETIC
from simpipe.inference.llamacpp.native_build import installed_engine
from simpipe.store.layout import LAYOUT, RunPaths, is_run_entry, layout_on_resume
from simpipe.store.owner import owner_problem, this_process
from simpipe.store.record import (
    MAX_LEDGER_BYTES,
    PlanProgress,
    Progress,
    RunRecord,
    read_ledger,
)
from simpipe.store.round_record import RoundRecord
from simpipe.store.states import RunState


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
    if "xllamacpp" in out:
        # Guesses are reproducible within one build: PyPI's wheel and one compiled for this
        # CPU (`simpipe engine build`) round differently.
        out["xllamacpp build"] = installed_engine().describe()
    return out


def answers_source(config: Config) -> str:
    """Where a run's answers come from (``simpipe.games.validity``): "synthetic" when any
    LLM agents are answered by servers that make answers up (``--emulate``'s emulated GPU
    servers, a ``[cluster.servers]`` command running simpipe's emulator or stub server),
    "rule-based" when no agent asks an LLM (scripted agents), "model" otherwise. Endpoints
    given by hand are taken for a model's: the run cannot tell what answers there."""
    servers = config.cluster.servers
    fake = servers.plugin.emulator or any(
        f"simpipe.servers.{name}" in servers.command for name in ("stub", "emulator"))
    fed = servers.endpoint_backend
    llm = llm_groups(config.agents)
    if not llm:
        return RULE_BASED
    if fake and servers.plugin.starts_servers and any(
            fed is None or g.agents.backend == fed for g in llm):
        return SYNTHETIC
    return MODEL


class Ledger:
    """The client's ``run.json``: a ``RunRecord`` (``simpipe.store.record``, the same model
    every reader gets), replaced by each change and saved atomically."""

    def __init__(self, paths: RunPaths, record: RunRecord) -> None:
        self.paths = paths
        self.record = record
        self._last_progress_save = 0.0

    @classmethod
    def new(cls, paths: RunPaths, config: Config) -> Ledger:
        now = _now()
        record = RunRecord.model_validate({
            "name": config.run.name,
            "layout": LAYOUT,
            "answers_source": answers_source(config),
            "config_hash": config.results_hash(),
            "population_hash": config.population_hash(),
            "config": config.model_dump(mode="json"),
            "versions": package_versions(),
            "state": RunState.CREATED,
            "created_at": now,
            "updated_at": now,
            "rounds_total": config.game.rounds,
            "n_agents": config.population.size,
            "n_partitions": config.population.n_partitions,
            **this_process(),  # a second process is refused from the start (store.owner)
        })
        ledger = cls(record.run_paths(paths.root), record.at(paths.ledger))
        ledger.save()
        return ledger

    def _update(self, **changes: Any) -> None:
        self.record = self.record.model_copy(update=changes)

    def save(self) -> None:
        self._update(updated_at=_now())
        write_json_atomic(self.record.to_json(), self.paths.ledger)

    # --- state -----------------------------------------------------------------------------

    def set_state(self, state: RunState, **extra: Any) -> None:
        """``extra``: other fields of the record (``error``, ``pid``, ``host``, ...)."""
        self._update(state=state, **extra)
        self.save()

    def completed_rounds(self) -> list[int]:
        return self.record.completed_rounds()

    def record_progress(self, round_index: int, done: int, total: int, agents_done: int,
                        elapsed_s: float, force: bool = False, *, agents_total: int = 0,
                        distinct_prompts: int = 0, model_calls: int = 0,
                        playing_s: float | None = None) -> None:
        """Live progress for watchers (the UI), counted in agents (those of partitions
        still playing included); saved at most twice a second. ``round_index`` from 0;
        ``playing_s``: seconds since the partitions started (after a round plan), which the
        rate and the ETA count from (``RoundSnapshot``)."""
        span = elapsed_s if playing_s is None else playing_s
        rate = agents_done / span if span > 0 else None
        eta = ((agents_total - agents_done) / rate
               if rate and agents_total >= agents_done else None)
        self._update(progress=Progress(
            round=round_index + self.record.first_round, partitions_done=done,
            partitions_total=total,
            agents_done=agents_done, agents_total=agents_total,
            distinct_prompts=distinct_prompts, model_calls=model_calls,
            elapsed_s=round(elapsed_s, 3), agents_per_s=round(rate, 1) if rate else None,
            eta_s=round(eta, 1) if eta is not None else None))
        self._save_progress(force)

    def _save_progress(self, force: bool) -> None:
        now = time.monotonic()
        if force or now - self._last_progress_save >= 0.5:
            self._last_progress_save = now
            self.save()

    def record_plan_progress(self, round_index: int, stage: str, tasks_done: int,
                             tasks_total: int, elapsed_s: float, eta_s: float | None,
                             partitions_total: int, agents_total: int,
                             force: bool = False, work_done: float | None = None) -> None:
        """Live progress while a round is planned (no agent has played yet): the plan's
        ``stage``, its tasks and the share of its work done (``work_done``, 0 to 1); saved
        at most twice a second, as ``record_progress``."""
        self._update(progress=Progress(
            round=round_index + self.record.first_round, partitions_total=partitions_total,
            agents_total=agents_total, elapsed_s=round(elapsed_s, 3),
            planning=PlanProgress(stage=stage, tasks_done=tasks_done, tasks_total=tasks_total,
                                  eta_s=round(eta_s, 1) if eta_s is not None else None,
                                  work_done=(round(work_done, 4) if work_done is not None
                                             else None))))
        self._save_progress(force)

    def record_round(self, round_index: int, record: RoundRecord) -> RoundRecord:
        """A finished round's record, saved as complete. ``round_index`` from 0; the key is
        the round's number as the run numbers it (``RunRecord.round_key``)."""
        finished = record.model_copy(update={"complete": True})
        self._update(rounds={**self.record.rounds, self.record.round_key(round_index): finished},
                     progress=None)
        self.save()
        return finished

    def add_timing(self, name: str, seconds: float) -> None:
        self._update(timings={**self.record.timings,
                              name: round(self.record.timing(name) + seconds, 3)})

    def set_endpoints(self, counters: dict[str, dict[str, int | float]]) -> None:
        """Per-endpoint counters of the whole run (earlier invocations included)."""
        self._update(endpoints={name: dict(values) for name, values in counters.items()})
        self.save()

    def set_estimate(self, estimate: dict[str, Any]) -> None:
        """The dry run's estimate of the real run (``simpipe.run.estimate``)."""
        self._update(estimate=estimate)
        self.save()

    def record_spent(self, gpu_s: dict[int, float]) -> None:
        """What the emulated fleet spent on each round (round index from 0 -> GPU seconds),
        as ``spent_gpu_s`` of the rounds whose ``answer_methods`` priced their choice."""
        rounds = dict(self.record.rounds)
        for index, spent in gpu_s.items():
            key = self.record.round_key(index)
            rec = rounds.get(key)
            if rec is None or not rec.answer_methods or "predicted_gpu_s" not in rec.answer_methods:
                continue
            rounds[key] = rec.model_copy(update={"answer_methods": {**rec.answer_methods,
                                                                     "spent_gpu_s": spent}})
        if rounds != self.record.rounds:
            self._update(rounds=rounds)
            self.save()


def open_run_dir(paths: RunPaths, config: Config, *, resume: bool, force: bool) -> Ledger:
    """Create, resume or (with ``force``) replace a run directory; refuse anything else."""
    root = paths.root
    output_dir = Path(config.run.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirError(f"run.output_dir = {str(output_dir)!r} is a file, not a folder; "
                          "set run.output_dir to a folder")
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run folder; choose another run.name")
    _refuse_live_owner(paths, resume=resume, force=force)
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
    if _ledger_data(paths.ledger) is None:
        raise RunDirError(
            f"{root} exists and is not a simpipe run (no valid run.json); choose another "
            "run.name or run.output_dir"
        )
    try:
        record = read_ledger(paths.ledger)
    except CorruptFile as exc:
        raise RunDirError(f"{exc}; restore it, or pass --force to start this run over "
                          "(--resume needs it)") from None
    if not config.holds_run_of(record.config_hash):
        raise RunDirError(
            f"{root} holds a run made from a different config "
            f"(hash {record.config_hash} there, {config.results_hash()} now)"
            f"{config.resume_hint(record.config_hash)}; "
            "pass --force to replace it, or set run.name to a new name "
            "(--resume only continues a run with the same config)"
        )
    if not resume:
        raise RunDirError(
            f"{root} already holds this run ({record.state}, {record.rounds_done}/"
            f"{config.game.rounds} rounds); pass --resume to continue it or --force to start over"
        )
    # A run begun before rounds were numbered from 1 goes on numbering them as it did; one
    # of a later layout is saved in the current one (its round records are rewritten so).
    record = record.model_copy(update={"layout": layout_on_resume(record.layout)})
    return Ledger(record.run_paths(root), record.at(paths.ledger))


def _refuse_live_owner(paths: RunPaths, *, resume: bool, force: bool) -> None:
    """RunDirError naming the owner when another live process plays this run: before
    anything in the folder is read as ours, changed or deleted."""
    try:
        record = read_ledger(paths.ledger)
    except CorruptFile:
        return  # nothing readable names an owner; the checks below say what to do
    problem = owner_problem(record, paths.root, resume=resume, force=force)
    if problem:
        raise RunDirError(problem)


def _not_started(root: Path) -> bool:
    """Empty, or holding only what is written before a run starts: the population of
    ``simpipe population build`` and the logs of SLURM jobs started for the run."""
    return all(p.name in ("population", "logs") and p.is_dir() and not p.is_symlink()
               for p in root.iterdir())


class _RunMarks(StrictRecord):
    """What makes a ``run.json`` simpipe's: a run with other fields damaged is still one
    (``--force`` replaces it; ``simpipe.store.record.read_ledger`` refuses to resume it)."""

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
