"""``run.json`` as a typed record: what a run wrote, read back with types and methods.

``read_ledger`` is the one reader of ``run.json`` (the run's resume, ``simpipe show``,
``simpipe report``, the web UI, the benchmarks); callers use ``RunRecord``'s attributes and
methods, never the file's keys. Only ``simpipe.store.ledger`` writes the file, from the same
models, so what is written is what is read.

The file is untrusted input like every file of a run: it is read as a regular file of at
most ``MAX_LEDGER_BYTES`` (``simpipe.store.integrity.read_bounded``), every field has the
type simpipe writes, and the counts have plausible bounds (those of ``[population]``), so
nothing sized from a count in the file is allocated before the run's actual files are
checked. Files written by earlier versions read too: fields they lack take their defaults,
fields this version does not know at the top of the file are kept as they are, and the
game numbers that layout 2 and earlier wrote beside a round's fields are moved into its
``game_numbers`` (``simpipe.store.round_record``). A round record itself is closed: a key in
it that simpipe never writes is a CorruptFile naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from simpipe.core.records import (
    CorruptFile,
    NonNegative,
    ProcessId,
    StrictRecord,
    first_error,
    read_json_model,
)
from simpipe.games.base import Game
from simpipe.games.registry import game_from_dict
from simpipe.personas.config import MAX_PARTITIONS, MAX_POPULATION
from simpipe.personas.sampling import partition_bounds
from simpipe.store.integrity import AgentRange
from simpipe.store.layout import GAME_NUMBERS_NESTED, RunPaths, first_round
from simpipe.store.round_record import RoundRecord, lift_flat_game_numbers
from simpipe.store.states import RunState, StoredRunState

# run.json holds a few hundred bytes per round and endpoint; anything this big is not ours.
MAX_LEDGER_BYTES = 16 * 2**20
# The largest counts a run can have (``simpipe validate`` refuses more): a run.json with more
# is not one simpipe wrote, and nothing is ever sized from a count beyond these.
MAX_AGENTS = MAX_POPULATION
MAX_LEDGER_PARTITIONS = MAX_PARTITIONS
MAX_ROUNDS = 10**9 - 1  # round keys are at most nine digits

Count = int | float  # endpoint counters and timings: JSON numbers, kept as written


class _Record(StrictRecord):
    """Frozen: a record read back is a fact about the files; only the writer replaces it."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class PlanProgress(_Record):
    """A round's plan while it runs, before any agent plays (``simpipe.run.planned_round``):
    the stage (``prompts``: the partitions' distinct prompts; ``distributions``: the planned
    trees and walks) and its tasks. A million agents' round 3 spends hours here."""

    stage: str
    tasks_done: NonNegative = 0
    tasks_total: NonNegative = 0
    eta_s: float | None = None  # at the stage's rate so far
    # The share of the stage's expected work done, each task weighed by its size (a chunk
    # of 256 walked prompts is not the wait of a small tree): what the bar shows. None in
    # a run.json written before it existed (the bar then counts tasks).
    work_done: float | None = None


class Progress(_Record):
    """The round being played, as the client last saved it (at most twice a second)."""

    round: NonNegative  # its number on disk (from 1; from 0 in a run of layout 1)
    partitions_done: NonNegative = 0
    partitions_total: NonNegative = 0
    agents_done: NonNegative = 0
    agents_total: NonNegative = 0
    # Counted inside partitions as they play (simpipe.agents.progress); a prompt seen in two
    # partitions counts twice until the round's record gives the exact number.
    distinct_prompts: NonNegative = 0
    model_calls: NonNegative = 0
    elapsed_s: float | None = None
    agents_per_s: float | None = None
    eta_s: float | None = None  # seconds left at the round's rate so far
    planning: PlanProgress | None = None  # set while the round is planned; None once it plays


class ConfigSections(_Record):
    """The resolved config as written; only its shape: the sections' own rules belong to
    ``simpipe.config.model`` (an old run's config need not validate under this version)."""

    run: dict[str, Any] | None = None
    population: dict[str, Any] | None = None
    game: dict[str, Any] | None = None
    agents: dict[str, Any] | None = None
    cluster: dict[str, Any] | None = None

    def section(self, name: str) -> dict[str, Any]:
        """One section as a dict (empty when absent)."""
        value = getattr(self, name, None)
        return value if isinstance(value, dict) else {}


class Totals(_Record):
    """Counts over a run's finished rounds."""

    ok: int = 0
    unparsed: int = 0
    out_of_range: int = 0
    error: int = 0
    truncated: int = 0
    no_final_answer: int = 0
    tokens_in: int = 0
    tokens_out: int = 0

    def counts(self) -> dict[str, int]:
        return {"ok": self.ok, "unparsed": self.unparsed, "out_of_range": self.out_of_range,
                "error": self.error, "truncated": self.truncated,
                "no_final_answer": self.no_final_answer}


RoundKey = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]


class RunRecord(_Record):
    """``run.json``: the run's state, config and hash, versions, per-round records, live
    progress, timings, per-endpoint counters and (after ``--emulate``) the estimate."""

    name: str | None = None
    # How the run numbers its rounds on disk (simpipe.store.layout.LAYOUT); a file without
    # it was written before rounds were numbered from 1.
    layout: Annotated[int, Field(ge=1)] = 1
    state: StoredRunState = RunState.UNKNOWN
    # Where the answers come from (simpipe.games.validity.ANSWER_SOURCES): "model",
    # "synthetic" (emulated or stub servers) or "rule-based" (scripted agents); a file
    # without it reads as "model".
    answers_source: Literal["model", "synthetic", "rule-based"] = "model"
    config_hash: str | None = None
    population_hash: str | None = None
    config: ConfigSections | None = None
    versions: dict[str, str] = {}
    created_at: str | None = None
    updated_at: str | None = None
    rounds_total: Annotated[int, Field(ge=0, le=MAX_ROUNDS)] | None = None
    n_agents: Annotated[int, Field(ge=0, le=MAX_AGENTS)] | None = None
    n_partitions: Annotated[int, Field(ge=0, le=MAX_LEDGER_PARTITIONS)] | None = None
    rounds: dict[RoundKey, RoundRecord] = {}
    progress: Progress | None = None
    timings: dict[str, Count] = {}
    endpoints: dict[str, dict[str, Count]] = {}
    pid: ProcessId | None = None
    host: str | None = None
    # The owner's start time (/proc/<pid>/stat, clock ticks after boot): a pid reused by a
    # later process is not the run's (simpipe.store.owner).
    pid_start_time: NonNegative | None = None
    scheduler: str | None = None
    error: str | None = None
    estimate: dict[str, Any] | None = None

    # The file it was read from, named by every error about it (None: not read from disk).
    _path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _previous_layouts(cls, data: Any) -> Any:
        """A file of a layout before game numbers were nested: its rounds as this version
        writes them (``lift_flat_game_numbers``)."""
        if not isinstance(data, dict):
            return data
        layout = data.get("layout", 1)
        if isinstance(layout, int) and layout < GAME_NUMBERS_NESTED and "rounds" in data:
            return {**data, "rounds": lift_flat_game_numbers(data["rounds"])}
        return data

    @model_validator(mode="after")
    def _partitions_fit(self) -> RunRecord:
        if (self.n_agents is not None and self.n_partitions is not None
                and self.n_partitions > max(self.n_agents, 1)):
            raise ValueError(f"n_partitions = {self.n_partitions:,} is more than n_agents = "
                             f"{self.n_agents:,}")
        return self

    # --- where it came from ---------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path or Path("run.json")

    def at(self, path: Path) -> RunRecord:
        """This record, naming ``path`` in its errors."""
        self._path = path
        return self

    # --- rounds -----------------------------------------------------------------------------

    @property
    def first_round(self) -> int:
        """The number of the run's first round on disk (its folder, ``round`` column and
        run.json key): 1, or 0 for a run written before rounds were numbered from 1."""
        return first_round(self.layout)

    def run_paths(self, root: Path) -> RunPaths:
        """The run's files under ``root``, its rounds' folders numbered as it numbers them."""
        return RunPaths(root, self.first_round)

    def round_key(self, index: int) -> str:
        """The key of round ``index`` (from 0) in ``rounds``."""
        return str(index + self.first_round)

    @property
    def progress_round(self) -> int | None:
        """The index (from 0) of the round being played, where the run saved its progress."""
        return None if self.progress is None else self.progress.round - self.first_round

    def finished_rounds(self) -> dict[int, RoundRecord]:
        """The rounds the run completed, by index (from 0), in order."""
        done = {int(r) - self.first_round: rec for r, rec in self.rounds.items()
                if rec.complete and int(r) >= self.first_round}
        return dict(sorted(done.items()))

    def completed_rounds(self) -> list[int]:
        return list(self.finished_rounds())

    @property
    def rounds_done(self) -> int:
        return len(self.finished_rounds())

    def round(self, index: int) -> RoundRecord | None:
        """Round ``index``'s (from 0) record if it finished."""
        rec = self.rounds.get(self.round_key(index))
        return rec if rec is not None and rec.complete else None

    def first_incomplete_round(self) -> int | None:
        """Where ``--resume`` goes on: the first round not finished (None: all are, or the
        number of rounds is not recorded)."""
        if self.rounds_total is None:
            return None
        done = self.finished_rounds()
        return next((r for r in range(self.rounds_total) if r not in done), None)

    @property
    def is_finished(self) -> bool:
        return self.state == RunState.FINISHED

    def totals(self) -> Totals:
        """Answers by status and tokens over the finished rounds."""
        rounds = self.finished_rounds().values()
        return Totals(ok=sum(r.n_valid for r in rounds), unparsed=sum(r.n_unparsed for r in rounds),
                      out_of_range=sum(r.n_out_of_range for r in rounds),
                      error=sum(r.n_error for r in rounds),
                      truncated=sum(r.n_truncated for r in rounds),
                      no_final_answer=sum(r.n_no_final_answer for r in rounds),
                      tokens_in=sum(r.tokens_in for r in rounds),
                      tokens_out=sum(r.tokens_out for r in rounds))

    # --- partitions -------------------------------------------------------------------------

    def partition_bounds(self) -> list[AgentRange]:
        """The agent ids of each partition, as the run laid them out; CorruptFile naming
        run.json when its counts are missing. Sized by ``n_partitions`` (bounded when read),
        never by ``n_agents``."""
        size, parts = self.n_agents, self.n_partitions
        if size is None or parts is None or parts < 1 or size < parts:
            raise CorruptFile(self.path, "n_agents / n_partitions missing or impossible: "
                                         "the part files cannot be checked")
        return partition_bounds(size, parts)

    def missing_partitions(self, paths: RunPaths, round_index: int) -> list[int]:
        """The partitions of a round without a part file (existence is the completion
        marker: files are written atomically); their content is checked when read."""
        paths = self.run_paths(paths.root)  # its rounds' folders as this run numbers them
        return [k for k in range(len(self.partition_bounds()))
                if not paths.round_part(round_index, k).exists()]

    def resume_point(self, paths: RunPaths) -> tuple[int, list[int]] | None:
        """(the first unfinished round, its partitions still to play), or None when every
        round is finished."""
        r = self.first_incomplete_round()
        if r is None:
            return None
        return r, self.missing_partitions(paths, r)

    # --- config -----------------------------------------------------------------------------

    def section(self, name: str) -> dict[str, Any]:
        """One section of the run's resolved config (empty when absent)."""
        return self.config.section(name) if self.config is not None else {}

    def config_dict(self) -> dict[str, Any]:
        """The run's resolved config as written, section by section (empty when absent)."""
        return self.config.model_dump() if self.config is not None else {}

    @property
    def backend(self) -> str | None:
        backend = self.section("agents").get("backend")
        return backend if isinstance(backend, str) else None

    def game(self) -> Game:
        """The game the run's config plays; CorruptFile naming run.json when its
        ``config.game`` is not a game's table."""
        try:
            return game_from_dict(self.section("game"))
        except ValueError as exc:
            problem = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            raise CorruptFile(self.path, f"config.game: {problem}") from None

    @property
    def wall_s(self) -> float | None:
        value = self.timings.get("wall_s")
        return float(value) if value is not None else None

    def timing(self, name: str) -> float:
        return float(self.timings.get(name, 0.0))

    def to_json(self) -> dict[str, Any]:
        """What ``run.json`` holds (the writer's form; extra fields kept; a state is a
        ``StrEnum``, so JSON holds its word)."""
        return self.model_dump()


def read_ledger(path: Path) -> RunRecord:
    """``run.json`` as a ``RunRecord``; CorruptFile naming the file when it is missing, not a
    regular file, too big, not JSON, a field has the wrong type or a count is implausible."""
    return read_json_model(path, RunRecord, MAX_LEDGER_BYTES).at(path)
