"""``simpipe experiment CONFIG``: a grid of runs on one cluster.

A config with an ``[experiment]`` table (``simpipe.config.model.ExperimentSection``) is the base
of every cell; the cartesian product of its ``grid`` gives the cells, each one run folder
``<run.output_dir>/<experiment>/<cell>/`` named from its grid values, and
``experiment.json`` beside them lists the cells, their values and states
(``simpipe.store.experiment``)::

    experiment = load_experiment("examples/paper-table.toml")   # every cell validated
    result = run_experiment(experiment)                         # one cluster for all cells

Why every cell is validated and planned before anything starts: a typo in the seventh cell
must not surface after six cells' worth of GPU time. Why one entered executor: the cells
share its workers and servers (warm engines, no start-up per cell), as in
``with executor_for(config) as ex: run_simulation(a, executor=ex); ...``.

Rerunning the command resumes: a finished cell (same config hash) is skipped, an
interrupted or failed one goes on with the run's own ``--resume``, a new one starts.
Ctrl-C or a cell's CANCEL file stops the experiment (that cell resumable); a CANCEL file in
the experiment folder stops it between cells.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import Any

from tqdm import tqdm

from simpipe.config.keys import split_key
from simpipe.config.model import (
    DIR_NAME,
    Config,
    ConfigError,
    RunSection,
    config_from_dict,
    read_config_dict,
    set_key,
    shown,
)
from simpipe.core.errors import SimpipeError
from simpipe.core.records import CorruptFile
from simpipe.games import validity
from simpipe.run.console import LOGGER, Console
from simpipe.run.executor import Executor, executor_for
from simpipe.run.quiet_teardown import QuietTeardown
from simpipe.run.simulation import RunCancelled, run_simulation
from simpipe.store.experiment import (
    CellRecord,
    ExperimentRecord,
    experiment_file,
    is_experiment_dir,
    read_experiment,
    write_experiment,
)
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import RunDirError
from simpipe.store.record import read_ledger
from simpipe.store.states import CellState, RunState

MAX_ERROR_LINES = 20  # a bad value in a 64-cell grid is one problem, not 64 lines
_TOKEN_CHARS = 40  # a value longer than this is named by a hash in the cell name


class ExperimentCancelled(RunCancelled):
    """The experiment folder's CANCEL file stopped it between cells."""


@dataclass(frozen=True)
class Cell:
    """One combination of the grid: its folder name, its values (grid key -> value) and
    its validated config (``run.name`` the cell, ``run.output_dir`` the experiment)."""

    name: str
    overrides: dict[str, Any]
    config: Config

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir


@dataclass(frozen=True)
class Experiment:
    """A validated experiment: every cell's config, and the config of the one cluster they
    share (the first cell's, named after the experiment)."""

    name: str
    source: str
    folder: Path
    grid: dict[str, list[Any]]
    cells: tuple[Cell, ...]
    executor_config: Config


@dataclass
class CellResult:
    name: str
    overrides: dict[str, Any]
    run_dir: Path
    state: CellState
    skipped: bool  # finished before this invocation
    wall_s: float | None = None


@dataclass
class ExperimentResult:
    folder: Path
    name: str
    state: RunState
    cells: list[CellResult] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def run_dirs(self) -> list[Path]:
        return [c.run_dir for c in self.cells]


# --- loading and validating ----------------------------------------------------------------


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """The experiment of a config file with an ``[experiment]`` table, ``--set`` overrides
    applied to the base; every cell validated. ConfigError (one line per problem, naming
    the cell and the key) when any cell's config is invalid."""
    return experiment_from_dict(read_config_dict(path, overrides), source=str(path))


def experiment_from_dict(raw: dict[str, Any], source: str = "config") -> Experiment:
    """``load_experiment`` of a config already read into a dict."""
    if not isinstance(raw.get("experiment"), dict):
        raise ConfigError(f"{source}: no [experiment] table; add one with a grid "
                          "(`[experiment] grid = { \"game.prompt\" = [\"basic\", \"cot\"] }`), "
                          "or run the config alone with `simpipe run`")
    section = config_from_dict({"experiment": raw["experiment"]}, source).experiment
    if section is None:  # the table was given: validation keeps it
        raise ConfigError(f"{source}: the [experiment] table was not read")
    base = {key: value for key, value in raw.items() if key != "experiment"}
    run = base.get("run") if isinstance(base.get("run"), dict) else {}
    fields = RunSection.model_fields
    output_dir = run.get("output_dir", fields["output_dir"].default)
    name = section.name or run.get("name", fields["name"].default)
    if not isinstance(output_dir, str) or not isinstance(name, str):
        config_from_dict(base, source)  # says what is wrong with [run]
        raise ConfigError(f"{source}: run.name and run.output_dir must be text")
    folder = Path(output_dir) / name

    named = _recorded_names(folder, cell_names(section.grid))
    _check_distinct(named, source)
    cells: list[Cell] = []
    problems: dict[str, list[str]] = {}
    for cell_name, values in named:
        try:
            cell_raw = _cell_dict(base, values, {"name": cell_name, "output_dir": str(folder)})
        except ConfigError as exc:
            problems.setdefault(str(exc), []).append(cell_name)
            continue
        if (section.independent_draws and "run.seed" not in values
                and isinstance(cell_raw.get("run"), dict)):
            cell_raw["run"]["seed"] = cell_seed(run.get("seed", fields["seed"].default), values)
        try:
            cells.append(Cell(cell_name, values, config_from_dict(cell_raw, "@")))
        except ConfigError as exc:
            for line in str(exc).splitlines():
                problems.setdefault(line.removeprefix("@: "), []).append(cell_name)
    if problems:
        raise ConfigError("\n".join(_problem_lines(problems, source)))
    executor_raw = _cell_dict(base, cells[0].overrides, {"name": name, "output_dir": output_dir})
    executor_config = config_from_dict(executor_raw, f"{source}: the experiment's cluster")
    return Experiment(name, source, folder, dict(section.grid), tuple(cells), executor_config)


def cell_seed(base_seed: Any, values: dict[str, Any]) -> Any:
    """``experiment.independent_draws``: a cell's own ``run.seed``, from the base seed and
    the cell's grid values (stable: the same grid gives the same seeds). Cells that share
    the seed share every random draw of agents with the same id (population, scripted
    answers, LLM sampling): their answers are paired samples, not independent ones."""
    if not isinstance(base_seed, int) or isinstance(base_seed, bool):
        return base_seed  # validation of the cell says what is wrong with it
    text = json.dumps([base_seed, values], sort_keys=True, default=str)
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


def _recorded_names(folder: Path, named: list[tuple[str, dict[str, Any]]]
                    ) -> list[tuple[str, dict[str, Any]]]:
    """The names ``cell_names`` gives, except where the folder's ``experiment.json`` names
    a cell of the same values otherwise and that folder exists (an experiment begun when
    names were made another way): it keeps its folder, so that it resumes, unless the name
    is recorded for two cells or is another cell's now (``plan_cells`` then refuses to
    replace it)."""
    if not is_experiment_dir(folder):
        return named
    try:
        record = read_experiment(folder)
    except CorruptFile:
        return named
    owners: dict[str, list[str]] = {}
    for recorded in record.cells:
        owners.setdefault(recorded.name.lower(), []).append(_canonical(recorded.overrides))
    by_values = {_canonical(c.overrides): c.name for c in record.cells
                 if len(owners[c.name.lower()]) == 1}
    names = [name for name, _ in named]
    for index, (name, values) in enumerate(named):
        old = by_values.get(_canonical(values))
        if old is None or old == name or (folder / name).exists() \
                or not (folder / old).is_dir():
            continue
        if old.lower() not in {n.lower() for i, n in enumerate(names) if i != index}:
            names[index] = old
    return [(name, values) for name, (_, values) in zip(names, named, strict=True)]


def _problem_lines(problems: dict[str, list[str]], source: str) -> list[str]:
    """One line per distinct problem, naming the first cell that has it."""
    lines = []
    for message, names in problems.items():
        more = f" (and {len(names) - 1} more cell{'s' if len(names) > 2 else ''})" \
            if len(names) > 1 else ""
        lines.append(f"{source}: experiment cell {names[0]}{more}: {message}")
    if len(lines) > MAX_ERROR_LINES:
        rest = len(lines) - MAX_ERROR_LINES
        lines = [*lines[:MAX_ERROR_LINES], f"{source}: ... and {rest} more problems"]
    return lines


def _cell_dict(base: dict[str, Any], values: dict[str, Any],
               run: dict[str, str]) -> dict[str, Any]:
    """The base config with a cell's grid values and its run name and folder. Each grid
    value is set as ``--set`` sets it (``simpipe.config.model.set_key``); ConfigError naming the
    grid key where one cannot be."""
    raw = copy.deepcopy(base)
    for key, value in values.items():
        set_key(raw, key, value, where=f"experiment.grid key {shown(key)}")
    section = raw.setdefault("run", {})
    if isinstance(section, dict):
        section.update(run)
    return raw


def cell_names(grid: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every combination of the grid (the first key varies slowest) with its folder name:
    ``<key>-<value>`` per grid key, joined by ``__`` (``prompt-cot__ratio-2_3``); the key is
    its last part unless two keys share it. Stable (the same grid gives the same names),
    a valid ``run.name``, and distinct by construction, also ignoring case (a folder name on
    macOS or Windows):

    - a grid key's value is named by its text (``/`` and other characters a folder cannot
      hold as ``_``) when no other value of that key gives the same text; where several do,
      a value whose text is the value itself (``You_are_x``) keeps it and the others are
      hashed;
    - a hashed cell (such a value, a long name) is ``<readable part>__h<hash of its values>``.
      Every ``__``-separated part of an unhashed name holds a ``-`` (``key-value``), so no
      unhashed name ends the way a hashed one does, and hashed names differ by their values'
      hash. ``_check_distinct`` refuses the grid should two names still meet (a hash
      collision)."""
    keys = list(grid)
    labels = _key_labels(keys)
    plain = {key: _plain_parts(labels[key], values) for key, values in grid.items()}
    named = []
    for picks in product(*(range(len(values)) for values in grid.values())):
        combo = {key: grid[key][i] for key, i in zip(keys, picks, strict=True)}
        parts = [plain[key][i] for key, i in zip(keys, picks, strict=True)]
        readable = "__".join(_part(labels[key], combo[key]) for key in keys)
        if all(part is not None for part in parts) and DIR_NAME.fullmatch(readable):
            named.append((readable, combo))
        else:
            named.append((_hashed_name(readable, combo), combo))
    return named


_HASH_MARK = "__h"  # a hashed cell name ends with it and a hash of the cell's values


def _plain_parts(label: str, values: list[Any]) -> list[str | None]:
    """Each value's ``label-text`` part of a cell name, or None where it must be hashed: its
    text (ignoring case) is also another value's and it is not the value itself."""
    parts = [_part(label, value) for value in values]
    groups: dict[str, list[int]] = {}
    for index, part in enumerate(parts):
        groups.setdefault(part.lower(), []).append(index)
    plain: list[str | None] = [None] * len(values)
    for members in groups.values():
        exact = [i for i in members if _is_exact(values[i])]
        if len(members) == 1:
            plain[members[0]] = parts[members[0]]
        elif len(exact) == 1:  # 'x_y' keeps its name beside 'x y' and 'x/y'
            plain[exact[0]] = parts[exact[0]]
    return plain


def _is_exact(value: Any) -> bool:
    """Whether a value is text that names itself in a cell name (its own slug)."""
    return isinstance(value, str) and 0 < len(value) <= _TOKEN_CHARS and _clean(value) == value


def _hashed_name(readable: str, combo: dict[str, Any]) -> str:
    suffix = f"{_HASH_MARK}{_hash(combo, 10)}"
    prefix = readable[:128 - len(suffix)].rstrip("_")
    name = f"{prefix}{suffix}"
    return name if DIR_NAME.fullmatch(name) else f"cell{suffix}"


def _check_distinct(named: list[tuple[str, dict[str, Any]]], source: str) -> None:
    """ConfigError naming the values of two cells that would share a folder (the names of
    ``cell_names`` never do; a guard for a hash collision or a name kept from an earlier
    run)."""
    seen: dict[str, dict[str, Any]] = {}
    for name, values in named:
        other = seen.setdefault(name.lower(), values)
        if other is not values:
            raise ConfigError(f"{source}: experiment cells {_shown(other)} and "
                              f"{_shown(values)} would share the folder {name}; change one "
                              "of the values")


def _shown(values: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"


def _key_labels(keys: list[str]) -> dict[str, str]:
    last = [split_key(k)[-1] for k in keys]
    return {k: _clean(k if last.count(short) > 1 else short)
            for k, short in zip(keys, last, strict=True)}


def _part(label: str, value: Any) -> str:
    if isinstance(value, dict):  # keys that vary together name themselves
        return _token(value) if value else f"{label}-base"
    return f"{label}-{_token(value)}"


def _token(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    elif isinstance(value, dict):
        text = "-".join(f"{_clean(str(k))}-{_token(v)}" for k, v in value.items())
    else:
        text = "-".join(_token(v) for v in value) if isinstance(value, list) else str(value)
    text = _clean(text)
    if not text or len(text) > _TOKEN_CHARS:
        text = f"{text[:16]}-h{_hash(value)}" if text else f"h{_hash(value)}"
    return text


def _clean(text: str) -> str:
    # "/" in "2/3" and anything else a folder name cannot hold becomes "_".
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def _hash(value: Any, length: int = 8) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:length]


def _canonical(value: Any) -> str:
    """The exact value as text: ``2``, ``2.0``, ``"2"`` and ``true`` all differ."""
    return json.dumps(value, sort_keys=True, default=str)


# --- planning -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    cell: Cell
    action: str  # skip, resume, start, replace
    # What the folder holds now: its run's state, or a cell not started (pending).
    state: RunState | CellState


def plan_cells(experiment: Experiment, force: bool = False) -> list[_Plan]:
    """What each cell needs, decided from its folder before anything starts: skip (finished,
    same config), resume (same config, not finished), start (no run yet), replace
    (``force``). RunDirError naming every cell whose folder holds another config's run, and,
    ``force`` or not, when two cells would share a folder or a cell's folder holds the run
    of another cell of this experiment: ``force`` replaces a cell's own run only."""
    _check_one_folder_per_cell(experiment)
    owners = _recorded_owners(experiment.folder)
    current = {_canonical(c.overrides): c for c in experiment.cells}
    plans, problems = [], []
    for cell in experiment.cells:
        ledger_path = RunPaths(cell.run_dir).ledger
        if not ledger_path.exists():
            plans.append(_Plan(cell, "start", CellState.PENDING))
            continue
        try:
            record = read_ledger(ledger_path)
        except CorruptFile as exc:
            if force:
                plans.append(_Plan(cell, "replace", RunState.FAILED))
            else:
                problems.append(f"cell {cell.name}: {exc}; pass --force to start it over")
            continue
        same = cell.config.holds_run_of(record.config_hash)
        other = None if same else _other_cells_run(cell, record.config_hash, owners, current)
        if other is not None:
            problems.append(f"cell {cell.name}: {cell.run_dir} holds the run of the cell "
                            f"{other.name} {_shown(other.overrides)} of this experiment "
                            "(made when it had that folder's name); --force replaces a cell's "
                            "own run only: move the folder to "
                            f"{other.run_dir} to keep it, or set experiment.name to a new name")
        elif force:
            plans.append(_Plan(cell, "replace", record.state))
        elif not same:
            problems.append(f"cell {cell.name}: {cell.run_dir} holds a run made from a different "
                            f"config (hash {record.config_hash} there, "
                            f"{cell.config.results_hash()} now)"
                            f"{cell.config.resume_hint(record.config_hash)}; pass --force to "
                            "replace the cells, or set experiment.name to a new name")
        elif record.is_finished:
            plans.append(_Plan(cell, "skip", RunState.FINISHED))
        else:
            plans.append(_Plan(cell, "resume", record.state))
    if problems:
        raise RunDirError("\n".join(problems[:MAX_ERROR_LINES]))
    return plans


def _check_one_folder_per_cell(experiment: Experiment) -> None:
    """RunDirError when two cells have one folder (ignoring case: one folder on macOS and
    Windows); ``load_experiment`` never makes such cells."""
    seen: dict[str, Cell] = {}
    for cell in experiment.cells:
        other = seen.setdefault(str(cell.run_dir).lower(), cell)
        if other is not cell:
            raise RunDirError(f"cells {other.name} {_shown(other.overrides)} and {cell.name} "
                              f"{_shown(cell.overrides)} would share the folder "
                              f"{cell.run_dir}; nothing was started")


def _other_cells_run(cell: Cell, config_hash: str, owners: dict[str, list[str]],
                     current: dict[str, Cell]) -> Cell | None:
    """The other cell of the experiment whose run ``cell``'s folder holds (``config_hash``):
    one that ``experiment.json`` records under that folder's name and whose config, named
    so, has that hash."""
    for values in owners.get(cell.name.lower(), []):
        other = current.get(values)
        if other is None or other is cell:
            continue
        config = other.config
        named = config.with_sections(run=config.run.model_copy(update={"name": cell.name}))
        if named.holds_run_of(config_hash):
            return other
    return None


def _recorded_owners(folder: Path) -> dict[str, list[str]]:
    """Cell folder name (lower case) -> the values (``_canonical``) that ``experiment.json``
    records for it, one or (written before names were distinct) more; empty without a
    readable one."""
    if not is_experiment_dir(folder):
        return {}
    try:
        record = read_experiment(folder)
    except CorruptFile:
        return {}
    owners: dict[str, list[str]] = {}
    for cell in record.cells:
        owners.setdefault(cell.name.lower(), []).append(_canonical(cell.overrides))
    return owners


def _check_folder(experiment: Experiment) -> None:
    folder = experiment.folder
    if folder.exists() and not folder.is_dir():
        raise RunDirError(f"{folder} is a file, not an experiment folder; set experiment.name")
    if RunPaths(folder).ledger.exists():
        raise RunDirError(f"{folder} is a run's folder (it holds run.json), not an "
                          "experiment's; set experiment.name to another name")


# --- running --------------------------------------------------------------------------------


class _CellConsole(Console):
    """A cell's run: its lines go to its run.log only (the experiment prints one line per
    cell); warnings and the round's progress bar still show unless the experiment is quiet."""

    def __init__(self, shown: bool, cell: str) -> None:
        super().__init__(quiet=True)
        self.shown = shown
        self.cell = cell

    def warn(self, text: str) -> None:
        LOGGER.warning(text)
        if self.shown:
            tqdm.write(f"warning: {self.cell}: {text}", file=sys.stderr)

    def progress(self, total: int, desc: str, unit: str = "part") -> tqdm:
        return tqdm(total=total, desc=f"{self.cell} {desc}", unit=unit, leave=False,
                    unit_scale=unit == "agent", disable=None if self.shown else True,
                    file=sys.stderr)


def run_experiment(experiment: Experiment, *, force: bool = False,
                   executor: Executor | None = None, cluster_name: str | None = None,
                   console: Console | None = None) -> ExperimentResult:
    """Run every cell of ``experiment`` that is not finished, on one cluster: ``executor``
    (entered here unless the caller entered it), or by default the one ``simpipe run``
    would build from the experiment's config (``cluster_name``: ``--cluster NAME``).
    ``force`` replaces every cell's run. Prints one line per cell with the experiment's
    ETA; writes ``experiment.json``. Ctrl-C (KeyboardInterrupt) and a cancel (RunCancelled)
    leave the experiment ``interrupted`` and resumable by running it again."""
    console = console or Console()
    if executor is not None and cluster_name:
        raise SimpipeError("run_experiment: executor= says where the cells run, which "
                           "cluster_name= would replace; pass one or the other")
    _check_folder(experiment)
    plans = plan_cells(experiment, force)
    state = _State(experiment, plans)
    todo = sum(p.action != "skip" for p in plans)
    console.line(f"experiment {experiment.name}: {len(plans)} cells "
                 f"({len(plans) - todo} finished, {todo} to run) in {experiment.folder}")
    if todo == 0:
        state.finish()
        return state.result
    experiment.folder.mkdir(parents=True, exist_ok=True)
    experiment_cancel = RunPaths(experiment.folder).cancel_flag
    experiment_cancel.unlink(missing_ok=True)
    if executor is None:
        executor = executor_for(experiment.executor_config, cluster_name=cluster_name,
                                say=console.line)
    try:
        if executor.entered:
            _run_cells(executor, state, console, experiment_cancel)
        else:
            with QuietTeardown() as quiet, executor, quiet.after_interrupt():
                _run_cells(executor, state, console, experiment_cancel)
    except BaseException as exc:
        if state.result.state == RunState.RUNNING:  # between cells, or while the cluster started
            state.stop(RunState.INTERRUPTED if isinstance(exc, KeyboardInterrupt)
                       else RunState.FAILED)
        raise
    return state.result


@dataclass(frozen=True)
class CellCost:
    """What one finished cell cost in this invocation: the wall time of its rounds, the
    agent-rounds they played, and the rest of its wall time (population, start-up)."""

    kind: tuple[str, bool]  # ``cost_kind`` of its config
    rounds_s: float
    agent_rounds: int
    other_s: float

    @classmethod
    def of(cls, config: Config, round_times: list[float], wall_s: float) -> CellCost:
        rounds_s = float(sum(round_times))
        return cls(cost_kind(config), rounds_s, config.population.size * len(round_times),
                   max(0.0, wall_s - rounds_s))


def cost_kind(config: Config) -> tuple[str, bool]:
    """Cells priced alike: the same back-end, and a chain of thought (free text, hundreds of
    tokens per answer) or not."""
    return config.agents.backend, bool(config.game.free_text_answer)


def _kind_label(kind: tuple[str, bool]) -> str:
    return f"{'chain-of-thought' if kind[1] else 'one-number'} {kind[0]}"


def experiment_eta(measured: list[CellCost],
                   remaining: list[tuple[Config, int]]) -> tuple[float, str]:
    """(seconds left, a note) for the ``remaining`` cells (config, rounds still to play) from
    the cells ``measured`` so far: each priced at the measured seconds per agent-round of
    cells of its kind (``cost_kind``) times its agents x rounds, plus the mean other time of
    a cell. A kind not measured yet is priced as the slowest measured kind of its back-end
    (else of any), and the note says so."""
    if not measured or not remaining:
        return 0.0, ""
    rates: dict[tuple[str, bool], tuple[float, int]] = {}
    for cost in measured:
        seconds, agent_rounds = rates.get(cost.kind, (0.0, 0))
        rates[cost.kind] = (seconds + cost.rounds_s, agent_rounds + cost.agent_rounds)
    per = {kind: s / n if n else 0.0 for kind, (s, n) in rates.items()}
    other = sum(c.other_s for c in measured) / len(measured)
    eta, guessed = 0.0, {}
    for config, rounds in remaining:
        kind = cost_kind(config)
        rate = per.get(kind)
        if rate is None:
            alike = [k for k in per if k[0] == kind[0]] or list(per)
            stand_in = max(alike, key=lambda k: per[k])
            rate = per[stand_in]
            guessed[kind] = stand_in
        eta += other + rate * config.population.size * max(rounds, 0)
    note = "; ".join(f"no {_kind_label(k)} cell measured yet, priced as {_kind_label(v)}"
                     for k, v in guessed.items())
    return eta, note


def _rounds_left(plan: _Plan) -> int:
    """The rounds a cell still has to play (a resumed one: those its run.json lacks)."""
    rounds = plan.cell.config.game.rounds
    if plan.action != "resume":
        return rounds
    try:
        return rounds - read_ledger(RunPaths(plan.cell.run_dir).ledger).rounds_done
    except CorruptFile:
        return rounds


def _run_cells(executor: Executor, state: _State, console: Console, cancel: Path) -> None:
    started = time.perf_counter()
    measured: list[CellCost] = []
    total = len(state.plans)
    left = sum(p.action != "skip" for p in state.plans)
    for index, plan in enumerate(state.plans, start=1):
        cell = plan.cell
        where = f"[{index}/{total}] {cell.name}"
        if plan.action == "skip":
            console.line(f"{where}: finished before, skipped")
            continue
        if cancel.exists():
            state.stop(RunState.INTERRUPTED)
            console.line(f"cancelled between cells ({cancel}); run the experiment again to go "
                         "on")
            raise ExperimentCancelled(str(state.experiment.folder))
        state.set_cell(cell, CellState.RUNNING)
        t0 = time.perf_counter()
        try:
            result = run_simulation(cell.config, executor=executor, console=_CellConsole(
                not console.quiet, cell.name), resume=plan.action == "resume",
                force=plan.action == "replace")
        except (KeyboardInterrupt, RunCancelled):
            state.set_cell(cell, CellState.INTERRUPTED, wall_s=time.perf_counter() - t0)
            state.stop(RunState.INTERRUPTED)
            console.line(f"{where}: interrupted; run the experiment again to resume it")
            raise
        except BaseException as exc:
            state.set_cell(cell, CellState.FAILED, wall_s=time.perf_counter() - t0,
                           error=f"{type(exc).__name__}: {exc}"[:2000])
            state.stop(RunState.FAILED)
            console.line(f"{where}: failed ({type(exc).__name__}); its run.log has the details; "
                         "run the experiment again to resume it")
            raise
        wall = time.perf_counter() - t0
        measured.append(CellCost.of(cell.config, result.round_times, wall))
        left -= 1
        state.set_cell(cell, CellState.FINISHED, wall_s=result.wall_s)
        # Priced per agent-round of what is left, not per cell: cells differ in agents,
        # rounds and (a chain of thought) seconds per answer.
        eta, note = experiment_eta(measured, [(p.cell.config, _rounds_left(p))
                                              for p in state.plans[index:]
                                              if p.action != "skip"])
        console.line(f"{where}: finished in {_duration(wall)}{_first_round(result.run_dir)}; "
                     f"{index}/{total} cells done, "
                     + (f"ETA {_duration(eta)}" + (f" ({note})" if note else "") if left else
                        f"experiment done in {_duration(time.perf_counter() - started)}"))
    state.finish()


def _first_round(run_dir: Path) -> str:
    """The cell's first-round mean with its n and, where the validity rule
    (``simpipe.games.validity``) says so, why it is not to be read as data."""
    try:
        ledger = read_ledger(RunPaths(run_dir).ledger)
    except CorruptFile:
        return ""
    first = ledger.round(0)
    if first is None:
        return ""
    why = validity.problem(first.n, first.n_valid)
    marks = [m for m in (f"NOT VALID ENOUGH: {why}" if why else "",
                         validity.source_label(ledger.answers_source)) if m]
    # A round without one valid answer has no mean, and says so rather than nothing.
    mean = "no mean" if first.mean is None else f"mean {first.mean:.2f}"
    return (f" (first-round {mean}, n {first.n_valid:,} valid of {first.n:,}"
            + "".join(f"; {m}" for m in marks) + ")")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class _State:
    """``experiment.json`` as the experiment goes, saved at each change, and the result
    returned."""

    def __init__(self, experiment: Experiment, plans: list[_Plan]) -> None:
        self.experiment = experiment
        self.plans = plans
        created = _now()
        if experiment_file(experiment.folder).is_file():
            try:
                created = read_experiment(experiment.folder).created_at or created
            except CorruptFile:
                pass  # rewritten from the grid below
        self.record = ExperimentRecord(
            name=experiment.name, source=experiment.source, grid=experiment.grid,
            state=RunState.RUNNING, created_at=created, updated_at=created,
            cells=[CellRecord(name=p.cell.name, overrides=p.cell.overrides,
                              state=CellState.FINISHED if p.action == "skip"
                              else CellState.PENDING,
                              config_hash=p.cell.config.results_hash()) for p in plans])
        self.result = ExperimentResult(
            experiment.folder, experiment.name, RunState.RUNNING,
            [CellResult(p.cell.name, p.cell.overrides, p.cell.run_dir,
                        CellState.FINISHED if p.action == "skip" else CellState.PENDING,
                        p.action == "skip")
             for p in plans])
        self.started = time.perf_counter()
        self.save()

    def save(self) -> None:
        self.record = self.record.model_copy(update={"updated_at": _now()})
        write_experiment(self.experiment.folder, self.record)

    def set_cell(self, cell: Cell, state: CellState, wall_s: float | None = None,
                 error: str | None = None) -> None:
        cells = [c.model_copy(update={"state": state, "wall_s": wall_s, "error": error})
                 if c.name == cell.name else c for c in self.record.cells]
        self.record = self.record.model_copy(update={"cells": cells})
        for item in self.result.cells:
            if item.name == cell.name:
                item.state, item.wall_s = state, wall_s
        self.save()

    def stop(self, state: RunState) -> None:
        self.record = self.record.model_copy(update={"state": state})
        self.result.state = state
        self.result.wall_s = time.perf_counter() - self.started
        self.save()

    def finish(self) -> None:
        self.stop(RunState.FINISHED)
