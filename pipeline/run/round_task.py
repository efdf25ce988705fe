"""The worker side of a round: one task plays one population partition.

The task is idempotent: if the partition's output file already exists (a resumed run, or
a task retried after its worker died after writing) and passes its check (this partition's
agents, every column) it only re-reads the file to rebuild the partial, so a round has
exactly one row per agent however often a task runs. A file that fails the check (truncated
by a full disk, say) is moved aside, never deleted, and the partition is played again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from simpipe.agents.base import DecisionStats, Turn
from simpipe.agents.mix import decide_mixed, partition_counts
from simpipe.agents.progress import report_agents, reporting
from simpipe.config.model import AgentsConfig, Config
from simpipe.core.aio import gc_paused
from simpipe.core.files import move_aside, write_parquet_atomic
from simpipe.core.records import CorruptFile
from simpipe.games.base import Game
from simpipe.games.partials import Partial
from simpipe.games.registry import game_for
from simpipe.personas.sampling import partition_bounds
from simpipe.store.integrity import read_part
from simpipe.store.layout import RunPaths

ROW_SCHEMA = pa.schema([
    ("agent_id", pa.int64()),
    ("group_id", pa.int64()),
    ("guess", pa.float64()),
    ("status", pa.dictionary(pa.int8(), pa.string())),
    ("raw", pa.string()),
    ("raw_truncated", pa.bool_()),
    ("tokens_in", pa.int32()),
    ("tokens_out", pa.int32()),
    ("latency_s", pa.float64()),
    ("error", pa.string()),
    ("shared", pa.bool_()),
])
ROW_COLUMNS = tuple(ROW_SCHEMA.names)
REUSED_COLUMNS = ("group_id", "guess", "status", "tokens_in", "tokens_out",
                  "shared")  # for the partial and the round record


@dataclass(frozen=True)
class PartitionJob:
    """What one partition's round task reads of the run, and nothing else: it is pickled
    into every task of every round, so the whole ``Config`` (the cluster's and the
    population's sections, which the task never reads) stays on the client."""

    agents: AgentsConfig  # the policies and their back-ends' settings
    game: Game
    seed: int  # run.seed
    run_dir: str
    round_index: int
    partition: int
    agent_ids: tuple[int, int]  # this partition's agents, [first, end): a reused file's check
    group_ids: np.ndarray  # the group of each agent in this partition, in agent_id order
    progress_topic: str = ""  # where the task reports agents answered (simpipe.agents.progress)
    first_round: int = 1  # the run's first round's number on disk (RunPaths.first_round)

    @property
    def paths(self) -> RunPaths:
        return RunPaths(Path(self.run_dir), self.first_round)


def partition_jobs(config: Config, paths: RunPaths, round_index: int, groups: np.ndarray,
                   progress_topic: str = "") -> list[PartitionJob]:
    """One job per partition of the round: the config's pieces each task reads, the
    partition's agents and their groups (``groups``: every agent's, in agent_id order)."""
    game = game_for(config.game)
    bounds = partition_bounds(config.population.size, config.population.n_partitions)
    return [PartitionJob(config.agents, game, config.run.seed, str(paths.root), round_index,
                         k, (a, b), groups[a:b], progress_topic, paths.first_round)
            for k, (a, b) in enumerate(bounds)]


@dataclass
class PartitionOutcome:
    partition: int
    partial: Partial  # the game's (Game.partial)
    n_agents: int
    tokens_in: int
    tokens_out: int
    reused: bool
    stats: DecisionStats = field(default_factory=DecisionStats)
    set_aside: str = ""  # a corrupt file found in place of this partition's: the warning
    #: A mixed population's counts per value of its attribute (simpipe.agents.mix)
    by_value: dict[str, list[float]] = field(default_factory=dict)


def play_partition(job: PartitionJob, feedback: np.ndarray,
                   planned: Mapping[str, Any] | None = None) -> PartitionOutcome:
    """``feedback``: (groups, rounds so far), the number announced to each group each round;
    ``planned``: the round's planned answer distributions (``Turn.planned``), if any."""
    with reporting(job.progress_topic, job.round_index, job.partition):
        return _play(job, feedback, planned)


def _play(job: PartitionJob, feedback: np.ndarray,
          planned: Mapping[str, Any] | None) -> PartitionOutcome:
    paths = job.paths
    out = paths.round_part(job.round_index, job.partition)
    set_aside = ""
    if out.exists():
        try:
            rows = read_part(out, job.agent_ids, REUSED_COLUMNS, required=ROW_COLUMNS)
            stats = DecisionStats(shared_agents=int(rows["shared"].sum()))
            report_agents(len(rows))  # answered in an earlier invocation
            return _outcome(job, rows, stats, reused=True)
        except CorruptFile as exc:
            set_aside = f"{exc}; moved aside to {move_aside(out).name}, playing it again"
    agents = pd.read_parquet(paths.population_part(job.partition))
    # Own answers are read by decide_mixed, and only for the policies that ask for them.
    turn = partition_turn(job, feedback, len(agents), False, planned)
    # A partition's agents are hundreds of thousands of containers (histories, answers,
    # coroutine frames) that reference counting frees; collections in between only walk
    # them (measured: 12-16 % of a partition's CPU for LLM agents).
    with gc_paused():
        # Each agent by its own policy: one for all, or one per value of a mixed
        # population's attribute (simpipe.agents.mix); own answers read only if asked for.
        decisions = decide_mixed(job.agents, agents, turn, lambda: read_own_answers(
            paths, job.partition, job.round_index))
    rows = pd.concat(
        [pd.DataFrame({"agent_id": agents["agent_id"].to_numpy(),
                       "group_id": job.group_ids.astype(np.int64)}),
         decisions.frame.reset_index(drop=True)],
        axis=1,
    )[list(ROW_COLUMNS)]
    write_parquet_atomic(pa.Table.from_pandas(rows, schema=ROW_SCHEMA, preserve_index=False), out)
    return _outcome(job, rows, decisions.stats, reused=False, set_aside=set_aside)


def partition_turn(job: PartitionJob, feedback: np.ndarray, n_agents: int,
                   needs_own_answers: bool,
                   planned: Mapping[str, Any] | None = None) -> Turn:
    """What the partition's agents know this round (their own answers only if asked)."""
    past_answers = None
    if needs_own_answers and job.round_index > 0:
        past_answers = read_own_answers(job.paths, job.partition,
                                        job.round_index)
    return Turn(
        game=job.game,
        seed=job.seed,
        round_index=job.round_index,
        partition=job.partition,
        past_feedback=(feedback[job.group_ids] if feedback.size
                       else np.empty((n_agents, 0))),
        past_answers=past_answers,
        planned=planned or {},
        plan_decides=planned is not None,
    )


def read_own_answers(paths: RunPaths, partition: int, round_index: int) -> np.ndarray:
    """(agents, rounds so far): this partition's earlier answers, NaN where invalid."""
    columns = []
    for r in range(round_index):
        rows = pd.read_parquet(paths.round_part(r, partition), columns=["guess", "status"])
        columns.append(np.where(rows["status"] == "ok", rows["guess"], np.nan))
    return np.column_stack(columns)


def _outcome(job: PartitionJob, rows: pd.DataFrame, stats: DecisionStats, reused: bool,
             set_aside: str = "") -> PartitionOutcome:
    return PartitionOutcome(
        partition=job.partition,
        partial=job.game.partial(rows),
        n_agents=len(rows),
        tokens_in=int(rows["tokens_in"].sum()),
        tokens_out=int(rows["tokens_out"].sum()),
        reused=reused,
        stats=stats,
        set_aside=set_aside,
        by_value=partition_counts(job.agents,
                                  job.paths.population_part(job.partition),
                                  rows),
    )
