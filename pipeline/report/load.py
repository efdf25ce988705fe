"""Reading one or many run directories into frames, through the public Parquet layout only."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from simpipe.config import population_mix as mix
from simpipe.config.backends import BACKENDS, DEFAULT_BACKEND
from simpipe.core.errors import SimpipeError
from simpipe.core.records import CorruptFile
from simpipe.games.base import Game
from simpipe.games.validity import SYNTHETIC
from simpipe.personas.config import PopulationConfig
from simpipe.store.integrity import RESUME_REPAIRS, check_part, read_summary, round_problems
from simpipe.store.layout import RunPaths
from simpipe.store.record import RunRecord
from simpipe.store.results import read_ledger, read_rounds

# The columns the report needs: never `raw` or `error`, which dominate the bytes on disk.
ROUND_COLUMNS = ["agent_id", "round", "guess", "status", "tokens_in", "tokens_out"]
NOT_ATTRIBUTES = {"agent_id", "persona"}
EXPECTED = "expected run.json, rounds/ and summary.parquet as written by `simpipe run`"


class ReportInputError(SimpipeError, ValueError):
    """A path or option the report cannot use; the message names it and what is expected."""


@dataclass
class RunData:
    run_dir: Path
    label: str
    ledger: RunRecord
    game: Game
    summary: pd.DataFrame  # summary.parquet, completed rounds only
    rounds: pd.DataFrame  # ROUND_COLUMNS, completed rounds only
    population: pd.DataFrame  # agent_id + attribute columns (no persona text)

    @property
    def answers_source(self) -> str:
        """Where its answers come from (run.json's ``answers_source``: "model", "synthetic",
        "rule-based"; a run.json written before the field: "model")."""
        return self.ledger.answers_source

    @property
    def synthetic(self) -> bool:
        """Answers made up by emulated or stub servers: never beside published numbers."""
        return self.answers_source == SYNTHETIC

    @property
    def columns(self) -> list[str]:
        """Population columns a guess can be broken down by (--by)."""
        return [c for c in self.population.columns if c not in NOT_ATTRIBUTES]

    @property
    def attributes(self) -> list[str]:
        """The persona attributes the config declares, in its order (the default breakdown).

        Other population columns (e.g. how a persona was made) are bookkeeping, not
        demographics; they are still available to --by.
        """
        declared = self.ledger.section("population").get("attributes")
        if isinstance(declared, dict):
            return [a for a in declared if a in self.columns]
        return [c for c in self.columns if not c.startswith("persona")]

    def reaches_agents(self, attribute: str) -> str | None:
        """How ``attribute`` can influence the agents' guesses: "prompt" (their persona text
        names it), "rules" (scripted agents' depth_shift uses it), "back-end" (a mixed
        population's attribute: it chose who answers), "rules and prompt" (a mix of both
        kinds of agents), or None: it never reached them, so a difference between its levels
        is chance or correlation, not an effect."""
        config = self.ledger.config_dict()
        try:
            population = PopulationConfig.model_validate(config.get("population") or {})
        except ValueError:
            return None
        agents = config.get("agents") or {}
        mixed = agents.get(mix.BY) or {}
        if attribute in mixed:
            return "back-end"  # a mixed population: its value chose who answers
        tables = ([mix.stored_table(agents, value) for value in next(iter(mixed.values()))]
                  if mixed else [agents])
        hows = [self._reaches(table, attribute, population) for table in tables]
        return " and ".join(dict.fromkeys(h for h in hows if h)) or None

    def _reaches(self, agents: dict, attribute: str,
                 population: PopulationConfig) -> str | None:
        backend = agents.get("backend", DEFAULT_BACKEND)
        plugin = BACKENDS.get(backend) if isinstance(backend, str) else None
        if plugin is not None and plugin.rule_attributes is not None:
            rules = plugin.rule_attributes(agents.get(backend) or {}, self.game)
            return "rules" if attribute in rules else None
        return "prompt" if attribute in population.attributes_in_prompt else None

    def attribute_order(self, attribute: str) -> list[str]:
        """The labels of a categorical attribute in the order the config lists them."""
        attributes = self.ledger.section("population").get("attributes")
        spec = (attributes.get(attribute) if isinstance(attributes, dict) else None) or {}
        values = spec.get("values") if isinstance(spec, dict) else None
        return [str(v) for v in values] if isinstance(values, dict) else []

    @property
    def round_indices(self) -> list[int]:
        """The finished rounds, by their numbers (from 1, as the summary and the rounds
        number them)."""
        return sorted(int(r) for r in self.summary["round"].unique())


def load_run(run_dir: str | Path, label: str | None = None) -> RunData:
    path = Path(run_dir)
    paths = RunPaths(path)
    if not path.is_dir() or not paths.ledger.is_file():
        raise ReportInputError(f"{run_dir}: not a simpipe run directory ({EXPECTED})")
    try:
        ledger = read_ledger(path)
    except CorruptFile as exc:
        raise ReportInputError(f"{exc}; restore it from a copy") from None
    if not paths.summary.is_file() or not paths.rounds.is_dir():
        raise ReportInputError(f"{run_dir}: no completed round yet ({EXPECTED})")
    try:
        game = ledger.game()
    except CorruptFile as exc:
        raise ReportInputError(f"{exc}; restore it from a copy") from None

    paths = ledger.run_paths(path)  # a run written before numbers its rounds from 0
    try:
        summary = read_summary(paths.summary, game.summary_columns,
                               first_round=ledger.first_round)
        done = sorted(int(r) for r in summary["round"].unique())  # numbered from 1
        _check_parts(paths, ledger, [r - 1 for r in done])
    except CorruptFile as exc:
        raise ReportInputError(f"{exc}; {RESUME_REPAIRS}") from None
    rounds = read_rounds(path, columns=ROUND_COLUMNS)
    # A round still being written (or interrupted) has part files but no summary rows yet.
    rounds = rounds[rounds["round"].isin(done)].reset_index(drop=True)
    return RunData(
        run_dir=path, label=label or str(ledger.name or path.name), ledger=ledger,
        game=game, summary=summary, rounds=rounds,
        population=_read_population(paths.population),
    )


def _check_parts(paths: RunPaths, ledger: RunRecord, rounds: list[int]) -> None:
    """CorruptFile for the first population or round part the report would read that is
    missing or corrupt (a Parquet error deep inside pandas names no file). Sized by the
    partitions run.json records (bounded when read), checked against each file's rows.
    ``rounds``: their indices, from 0."""
    bounds = ledger.partition_bounds()
    if any(paths.population.glob("part-*.parquet")):  # without any: no breakdown, no error
        for k, agents in enumerate(bounds):
            check_part(paths.population_part(k), agents)
    for r in rounds:
        problems = round_problems(paths, r, bounds, [c for c in ROUND_COLUMNS if c != "round"])
        if problems:
            raise problems[0]


def load_runs(run_dirs: Sequence[str | Path]) -> list[RunData]:
    if not run_dirs:
        raise ReportInputError("no run directory given")
    runs = [load_run(d) for d in run_dirs]
    kinds = {run.game.kind for run in runs}
    if len(kinds) > 1:
        games = ", ".join(f"{d} is {run.game.kind}" for d, run in zip(run_dirs, runs,
                                                                        strict=True))
        raise ReportInputError(f"runs of different games cannot share a report ({games}); "
                               "report each game's runs separately")
    _dedupe_labels(runs)
    return runs


def slug(label: str) -> str:
    """A label as a file-name fragment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _read_population(directory: Path) -> pd.DataFrame:
    parts = sorted(directory.glob("part-*.parquet"))
    if not parts:
        return pd.DataFrame({"agent_id": pd.Series(dtype="int64")})
    # Persona text can be most of the population's bytes and no table uses it.
    names = [n for n in pq.read_schema(parts[0]).names if n != "persona"]
    return pd.read_parquet(directory, columns=names)


def _dedupe_labels(runs: list[RunData]) -> None:
    """Runs with the same name (the same config in two output roots) need distinct labels."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.run_dir.parent.name}/{run.run_dir.name}"
    labels = [r.label for r in runs]
    for i, run in enumerate(runs):
        if labels.count(run.label) > 1:
            run.label = f"{run.label}#{i + 1}"
