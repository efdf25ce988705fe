"""The round loop on the client: build the graph per round, reduce, announce, record.

Each round is one Dask task per population partition (``round_task.play_partition``), all
submitted at once; the game's reduce of their partials runs here (``simpipe.games``), and the
number announced to each group (the beauty contest's target, told as the winning number; the
public goods game's total contribution) is fed to the next round. Partitions and rounds
already on disk are skipped, which is what ``--resume`` relies on; each is checked first
(``simpipe.store.integrity``): a corrupt part file is moved aside and its partition played
again, a finished round with one is played (its good parts reused) and reduced again, and a
corrupt ``summary.parquet`` is rebuilt from the round files.

Why tasks over partition files rather than ``dask.dataframe.map_partitions``: the
dataframe optimizer may fuse small Parquet files into one partition, and the output layout
(one file per population partition, replaced idempotently) needs a fixed 1:1 mapping.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from distributed import Client, Future, as_completed

from simpipe.agents.mix import round_split, round_text
from simpipe.agents.progress import AgentCounts, ProgressWatch
from simpipe.agents.registry import close_engines_on_shutdown, process_counters
from simpipe.answers.capabilities import (
    backend_supports_distributions,
    backend_walks_lazily,
    prompt_style,
)
from simpipe.answers.planner import record_spent
from simpipe.answers.round_plan import plans_rounds
from simpipe.answers.shared import sharing_refusal
from simpipe.config.model import AgentsConfig, Config
from simpipe.config.population_mix import llm_groups, mix_attribute, uses_llm
from simpipe.core.errors import EXIT_CANCELLED, SimpipeError
from simpipe.core.files import move_aside, remove_stale_temps, write_parquet_atomic
from simpipe.core.records import CorruptFile
from simpipe.games.base import Game
from simpipe.games.groups import assign_groups
from simpipe.games.registry import game_for
from simpipe.personas.sampling import partition_bounds
from simpipe.run.console import Console
from simpipe.run.estimate import report_estimate
from simpipe.run.executor import Executor, OwnClientExecutor, executor_for
from simpipe.run.model_prep import prepare_default_model
from simpipe.run.planned_round import plan_round
from simpipe.run.population import ensure_population
from simpipe.run.quiet_teardown import QuietTeardown
from simpipe.run.round_progress import (
    LINE_EVERY_S,
    RoundMeter,
    RoundSnapshot,
    TaskWork,
    format_eta,
)
from simpipe.run.round_task import (
    ROW_COLUMNS,
    PartitionOutcome,
    partition_jobs,
    play_partition,
)
from simpipe.run.sigterm import sigterm_as_interrupt
from simpipe.run.worker_errors import quiet_user_errors_on_workers
from simpipe.store.integrity import read_summary, round_problems
from simpipe.store.layout import RunPaths, as_stored
from simpipe.store.ledger import Ledger, RunDirError, answers_source, open_run_dir
from simpipe.store.owner import this_process
from simpipe.store.record import read_ledger
from simpipe.store.round_record import MixSplit, RoundRecord
from simpipe.store.states import RunState


class RunCancelled(SimpipeError, RuntimeError):
    """The run was asked to stop (a CANCEL file); it stopped between rounds, resumable."""

    exit_code = EXIT_CANCELLED

    def cli_lines(self) -> list[str]:
        return []  # the run has said it on the console and in run.log, with how to resume


class RoundObserver:
    """Told when each round played in this invocation starts and ends (benchmarks measure
    per-round CPU and memory with it); does nothing unless a subclass says otherwise."""

    def round_started(self, round_index: int) -> None:
        """Right before the round's tasks are submitted."""

    def round_finished(self, round_index: int, record: RoundRecord) -> None:
        """Right after the round is reduced and recorded; ``record`` is its run.json entry."""

    def round_progress(self, snapshot: RoundSnapshot) -> None:
        """Every few tenths of a second while a round plays: agents answered so far (those
        of partitions still playing included), distinct prompts, model calls."""


@dataclass
class RunResult:
    run_dir: Path
    summary: pd.DataFrame
    state: RunState
    wall_s: float
    round_times: list[float] = field(default_factory=list)

    def rounds(self) -> pd.DataFrame:
        from simpipe.store.results import read_rounds  # avoid a cycle at import

        return read_rounds(self.run_dir)


def run_simulation(config: Config, *, executor: Executor | None = None, resume: bool = False,
                   force: bool = False, client: Client | None = None,
                   console: Console | None = None, observer: RoundObserver | None = None,
                   emulate: bool = False, cluster_name: str | None = None) -> RunResult:
    """Run (or resume) the configured simulation and return its summary, as ``simpipe run``
    does. Where it runs is an ``executor`` (``simpipe.run.executor``): by default the
    one ``simpipe run`` builds from the config (``executor_for``), entered for this run:
    the cluster and ``[cluster.servers]`` start for it and stop at its end. ``emulate`` is
    ``--emulate`` (a dry run with emulated GPU servers, results in ``<run.name>-emulated``),
    ``cluster_name`` is ``--cluster NAME`` (a cluster from ``simpipe cluster up``, its
    servers too). ``observer`` is told when each round starts and ends.

    An ``executor`` the caller has entered stays up after the run: several runs share its
    workers and servers (``with executor_for(config) as ex: run_simulation(a, executor=ex);
    run_simulation(b, executor=ex)``). With ``client``, the caller owns the cluster,
    workers and servers alike: nothing is started and the config's endpoints are used as
    they are.
    """
    console = console or Console()
    observer = observer or RoundObserver()
    chosen = [what for what, given in (("executor=", executor is not None),
                                       ("client=", client is not None),
                                       ("emulate=", emulate),
                                       ("cluster_name=", bool(cluster_name))) if given]
    if len(chosen) > 1 and chosen[0] in ("executor=", "client="):
        raise SimpipeError(f"run_simulation: {chosen[0]} says where the run executes, which "
                           f"{' and '.join(chosen[1:])} would replace; pass one or the other")
    if executor is None:
        executor = (OwnClientExecutor(config, client, say=console.line) if client is not None
                    else executor_for(config, emulate=emulate, cluster_name=cluster_name,
                                      say=console.line))
    # SIGTERM (scancel, timeout) takes Ctrl-C's path: a KeyboardInterrupt (run.sigterm).
    with sigterm_as_interrupt():
        if executor.entered:
            return _run(executor, config, resume, force, console, observer)
        # After a Ctrl-C the executor's teardown stays off the terminal (QuietTeardown).
        with QuietTeardown() as quiet, executor, quiet.after_interrupt():
            return _run(executor, config, resume, force, console, observer)


def _run(executor: Executor, config: Config, resume: bool, force: bool, console: Console,
         observer: RoundObserver) -> RunResult:
    config = executor.run_config(config)
    dask_client = executor.client
    paths = RunPaths(config.run_dir)
    if not force:
        _check_ledger(paths)
    ledger = open_run_dir(paths, config, resume=resume, force=force)
    paths = ledger.paths  # a run begun before rounds were numbered from 1 keeps its numbers
    console.attach_log(paths.log)
    started = time.perf_counter()
    # Partitions report agents answered as they play (simpipe.agents.progress).
    watch = ProgressWatch(dask_client, f"simpipe-progress-{uuid.uuid4().hex[:8]}")
    try:
        remove_stale_temps(paths.root)
        paths.cancel_flag.unlink(missing_ok=True)
        quiet_user_errors_on_workers(dask_client)
        if uses_llm(config.agents):
            close_engines_on_shutdown(dask_client)
        if dask_client.dashboard_link:
            console.line(f"Dask dashboard: {dask_client.dashboard_link}")
        console.line(f"Watch it in the browser: simpipe ui --results {config.run.output_dir}")
        # The owner lets a watcher (simpipe ui) tell a live run from a dead one, and keeps a
        # second process out of this folder (simpipe.store.owner).
        ledger.set_state(RunState.RUNNING, scheduler=dask_client.scheduler.address,
                         **this_process())
        result = _run_rounds(dask_client, config, paths, ledger, console, observer, watch)
        # emulated servers only: the real run, and what each planned round cost the fleet
        ledger.record_spent(record_spent(report_estimate(config, ledger, console)))
    except RunCancelled:
        ledger.set_state(RunState.INTERRUPTED)
        console.line(f"cancelled; resume with: simpipe run CONFIG --resume  ({paths.root})")
        raise
    except KeyboardInterrupt:
        ledger.set_state(RunState.INTERRUPTED)
        raise
    except BaseException as exc:
        ledger.set_state(RunState.FAILED, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        wall = time.perf_counter() - started
        watch.close()
        ledger.add_timing("wall_s", wall)
        ledger.save()
        console.detach_log()
    ledger.set_state(RunState.FINISHED)
    result.wall_s = wall
    return result


def _run_rounds(client: Client, config: Config, paths: RunPaths, ledger: Ledger,
                console: Console, observer: RoundObserver, watch: ProgressWatch) -> RunResult:
    prepare_default_model(config, console.line, console.warn)
    t0 = time.perf_counter()
    bar = console.progress(config.population.n_partitions, "population")
    ensure_population(client, config, paths, on_progress=lambda done, n: bar.update(1),
                      warn=console.warn)
    bar.close()
    ledger.add_timing("population_s", time.perf_counter() - t0)
    if uses_llm(config.agents):
        console.line(answers_plan(config))

    size, n_parts = config.population.size, config.population.n_partitions
    groups = assign_groups(size, config.game.group_size, config.run.seed)
    bounds = partition_bounds(size, n_parts)
    game = game_for(config.game)
    summary = _read_summary(paths, ledger, console, game)
    # Indices from 0; a summary numbers rounds from 1.
    done_rounds = {n - 1 for n in summary["round"].tolist()} if len(summary) else set()
    done_rounds -= _rounds_with_corrupt_parts(paths, done_rounds, bounds, console)
    counters = _CounterWatch(client, ledger)
    token = uuid.uuid4().hex[:8]  # task keys unique per invocation, even on a shared cluster
    round_times: list[float] = []
    for r in range(config.game.rounds):
        if r in done_rounds:
            continue
        if paths.cancel_flag.exists():
            raise RunCancelled(str(paths.root))
        feedback = game.feedback_table(summary, int(groups.max()) + 1 if size else 1, r)
        observer.round_started(r)
        t_round = time.perf_counter()
        started_at = time.time()  # on the clock emulated servers' stats are aligned to
        meter = RoundMeter(watch, console, ledger, r, config.game.rounds,
                           [b - a for a, b in bounds], observer.round_progress)
        outcomes, plan = _play_round(client, config, paths, meter, r, groups, feedback, token,
                                     watch.topic)
        rows = game.reduce([o.partial for o in outcomes], r)
        summary = _with_round(summary, rows, r)
        write_parquet_atomic(as_stored(summary, paths.first_round), paths.summary)
        elapsed = time.perf_counter() - t_round
        round_times.append(elapsed)
        record = _round_record(game, rows, outcomes, elapsed, started_at, plan,
                               round_split(config.agents, [o.by_value for o in outcomes]))
        record = ledger.record_round(r, record)
        observer.round_finished(r, record)
        counters.update()
        console.line(_round_line(config, game, r, rows, record))
        problem = next((o.stats.problem for o in outcomes if o.stats.problem), None)
        if problem:
            console.line(f"  not shared: {problem}")
    return RunResult(paths.root, summary, RunState.FINISHED, 0.0, round_times)


def _play_round(client: Client, config: Config, paths: RunPaths, meter: RoundMeter, r: int,
                groups: np.ndarray, feedback: np.ndarray, token: str,
                progress_topic: str) -> tuple[list[PartitionOutcome], _PlanNumbers]:
    feedback_future = _on_workers(client, feedback)
    jobs = partition_jobs(config, paths, r, groups, progress_topic)
    plan = None
    if plans_rounds(config):
        # Stages 1 and 2 (simpipe.run.planned_round, planned by simpipe.answers.round_plan):
        # the round's distinct prompts, and the distributions of those worth one, computed
        # once and spread over the workers.
        t_plan = time.perf_counter()
        plan = plan_round(client, config, jobs, feedback_future, f"round-{r}-{token}",
                          lambda futures, label, work, prompts: await_plan_tasks(
                              client, futures, f"round {r + 1}/{config.game.rounds} {label}",
                              paths, meter.console, functools.partial(meter.planning, label),
                              work, prompts, meter.plan_reports))
        plan_s = time.perf_counter() - t_plan
    meter.playing()
    futures = [
        plan.submit_partition(client, job, feedback_future,
                              key=f"play-round-{r}-part-{job.partition}-{token}")
        if plan is not None else
        client.submit(play_partition, job, feedback_future,
                      key=f"play-round-{r}-part-{job.partition}-{token}", pure=False)
        for job in jobs
    ]
    outcomes: list[PartitionOutcome] = []
    pending = as_completed(futures, timeout=None)
    try:
        while len(outcomes) < len(futures):
            # Wake up now and then to notice a cancel request even in a long round.
            batch = pending.next_batch(block=False) or _wait_one(pending)
            for future in batch:
                outcome = future.result()
                if outcome.set_aside:
                    meter.console.warn(outcome.set_aside)
                outcomes.append(outcome)
                meter.finished(outcome)
            meter.update(force=len(outcomes) == len(futures))
            if paths.cancel_flag.exists() and len(outcomes) < len(futures):
                # Finished partitions are on disk; --resume skips them and replays the rest.
                client.cancel(futures)
                raise RunCancelled(str(paths.root))
    finally:
        meter.close()
    numbers = (_PlanNumbers(int(plan.layout.planned), round(plan_s, 3), plan.layout.methods)
               if plan is not None else _PlanNumbers())
    return sorted(outcomes, key=lambda o: o.partition), numbers


#: ``on_progress(tasks_done, tasks_total, eta_s, work_done, force=...)`` of ``await_plan_tasks``.
PlanProgressSink = Callable[..., None]


def await_plan_tasks(client: Client, futures: list[Future], label: str, paths: RunPaths,
                     console: Console, on_progress: PlanProgressSink | None = None,
                     work: Sequence[float] | None = None, prompts: Sequence[int] | None = None,
                     reports: Callable[[], Mapping[int, AgentCounts]] | None = None) -> None:
    """Wait for a round's planning tasks, with a progress bar and, every ``LINE_EVERY_S``, a
    line with the tasks done and an ETA (a batch job's log has no bar; computing a million
    agents' distributions takes minutes before any partition plays), each step told to
    ``on_progress(done, total, eta_s, work_done, force=...)`` (run.json, for the UI); the
    ETA and ``work_done`` (the share of the work done) weigh each task by its expected
    ``work`` (equal without). Tasks that report the prompts they are done with
    (``reports()``: task index -> its counts; ``prompts``: each task's) count while they
    run, and the bar then counts prompts. A failed task raises its error here, and a
    cancel request stops the run (nothing of the round is on disk yet)."""
    counted = prompts is not None and reports is not None
    bar = (console.progress(sum(prompts), label, unit="prompt") if counted and prompts
           else console.progress(len(futures), label))
    pending = as_completed(futures, timeout=None)
    index = {future.key: i for i, future in enumerate(futures)}
    tally = TaskWork(work if work is not None else [1.0] * len(futures))
    finished: set[int] = set()
    started = last_line = time.perf_counter()
    if on_progress is not None:
        on_progress(0, len(futures), None, 0.0, force=True)
    try:
        while len(finished) < len(futures):
            for future in pending.next_batch(block=False) or _wait_one(pending):
                if future.status != "finished":
                    future.result()  # raises the task's error
                finished.add(index[future.key])
                tally.finish(index[future.key])
            done = len(finished)
            of_prompts = ""
            if counted and prompts:
                prompts_done = _plan_prompts_done(tally, prompts, finished, reports())
                bar.update(prompts_done - bar.n)
                of_prompts = f", {prompts_done:,}/{sum(prompts):,} prompts"
            else:
                bar.update(done - bar.n)
            now = time.perf_counter()
            eta = tally.eta(now - started)
            if on_progress is not None:
                on_progress(done, len(futures), eta, tally.fraction,
                            force=done == len(futures))
            if now - last_line >= LINE_EVERY_S and done < len(futures):
                last_line = now
                console.line(f"{label}: {done:,}/{len(futures):,} tasks{of_prompts}, "
                             f"{format_eta(eta)}")
            if paths.cancel_flag.exists() and done < len(futures):
                client.cancel(futures)
                raise RunCancelled(str(paths.root))
    finally:
        bar.close()


def _plan_prompts_done(tally: TaskWork, prompts: Sequence[int], finished: set[int],
                       reports: Mapping[int, AgentCounts]) -> int:
    """The prompts the plan's tasks are done with: all of each finished task's, and what
    each running one reported (its share told to ``tally``)."""
    running = {i: min(c.distinct, prompts[i]) for i, c in reports.items()
               if 0 <= i < len(prompts) and i not in finished}
    for i, n in running.items():
        tally.advance(i, n / prompts[i] if prompts[i] else 1.0)
    return sum(prompts[i] for i in finished) + sum(running.values())


def _nothing() -> None:
    """A task of nothing: an adaptive cluster starts a worker for it."""


def _on_workers(client: Client, value: object, attempts: int = 5) -> Future:
    """``value`` scattered to every worker, once for all the round's tasks. Dask's scatter
    needs a worker (else ``TimeoutError: No valid workers found``), and an adaptive cluster
    at ``minimum = 0`` starts one only for a task: with none, a task of nothing asks for
    one first. Adapt may also retire every worker between the two; then it asks again."""
    for _ in range(attempts - 1):
        try:
            return _scatter(client, value)
        except TimeoutError:
            continue
    return _scatter(client, value)


def _scatter(client: Client, value: object) -> Future:
    if not client.nthreads():
        client.submit(_nothing, pure=False).result()
    [future] = client.scatter([value], broadcast=True, hash=False)
    return future


def answers_failed(result: RunResult) -> str | None:
    """One line when every answer of a played run is an error (``status = "error"``: no
    server answered, every request was refused), naming where the reasons are and the
    first of them; None when any agent answered. ``simpipe run`` then exits with status
    ``EXIT_ANSWERS_FAILED``: such a run measured nothing."""
    summary = result.summary
    if not len(summary) or not {"n", "n_error"} <= set(summary.columns):
        return None
    n, errors = int(summary["n"].sum()), int(summary["n_error"].sum())
    if not n or errors < n:
        return None
    rounds = RunPaths(result.run_dir).rounds
    return (f"every answer failed: {errors:,} of {n:,} agent answers in "
            f"{summary['round'].nunique()} round(s) have status \"error\"; the reasons are "
            f"in the error column of {rounds} (simpipe.read_rounds), the first: "
            f"{_first_error(result.run_dir, int(summary['round'].min()) - 1)}")


def _first_error(run_dir: Path, round_index: int) -> str:
    """The error of the first agent of a round's first part file (cut to 200 characters)."""
    try:
        paths = read_ledger(RunPaths(run_dir).ledger).run_paths(run_dir)
        column = pq.read_table(paths.round_part(round_index, 0), columns=["error"]).column(0)
    except (OSError, ValueError, KeyError) as exc:  # the file is gone or damaged since
        return f"(not readable: {exc})"
    first = next((text for text in column.to_pylist() if text), "")
    return " ".join(first.split())[:200] or "(none recorded)"


def answers_plan(config: Config) -> str:
    """One line saying how LLM agents will be answered this run, and why (one per LLM
    group of a mixed population, named by its value)."""
    return "\n".join(_answers_plan(config, group.agents, group.value)
                     for group in llm_groups(config.agents))


def _answers_plan(config: Config, agents: AgentsConfig, value: str | None) -> str:
    who = "answers" if value is None else f"answers of {mix_attribute(config.agents)} = {value}"
    refusal = sharing_refusal(agents.share_answers, config.game, agents.backend,
                              backend_supports_distributions(agents), prompt_style(agents))
    if refusal is None:
        if plans_rounds(config):
            how = ("each prompt's agents are walked through its answer tree once, all "
                   "together, probing only the nodes their draws reach"
                   if backend_walks_lazily(agents) else
                   "a distribution many agents share is computed once, on one worker; the "
                   "other prompts get n samples or a call per agent, as priced")
            return (f"{who}: each round's distinct prompts are planned once for the whole "
                    f"population; {how}; agents draw with their own seeds")
        return (f"{who}: each distinct prompt's answer distribution is computed once per "
                "worker; agents draw from it with their own seeds")
    return f"{who}: one model call per agent ({refusal})"


def _wait_one(pending: as_completed, poll_s: float = 0.25) -> list:
    deadline = time.monotonic() + poll_s
    while time.monotonic() < deadline:
        if pending.has_ready():
            return pending.next_batch(block=False)
        time.sleep(0.01)
    return []


def _check_ledger(paths: RunPaths) -> None:
    """An existing run.json must be readable before it is resumed or refused."""
    if paths.ledger.exists():
        try:
            read_ledger(paths.ledger)
        except CorruptFile as exc:
            raise RunDirError(f"{exc}; restore it, or pass --force to start this run over "
                              "(--resume needs it)") from None


def _read_summary(paths: RunPaths, ledger: Ledger, console: Console,
                  game: Game) -> pd.DataFrame:
    """The summary rows of the rounds the ledger records as complete (numbered from 1). A
    completed round without rows (a corrupt summary.parquet is moved aside) is played and
    reduced again from its part files."""
    completed = ledger.completed_rounds()
    if not completed:
        return pd.DataFrame()
    try:
        summary = read_summary(paths.summary, game.summary_columns,
                               first_round=paths.first_round)
    except CorruptFile as exc:
        aside = (f"moved aside to {move_aside(paths.summary).name}, "
                 if paths.summary.exists() else "")
        console.warn(f"{exc}; {aside}rebuilding it from the round files")
        return pd.DataFrame()
    # Rounds reduced after the last ledger save are redone; the ledger is the authority.
    summary = summary[summary["round"].isin([r + 1 for r in completed])].reset_index(drop=True)
    lost = sorted(set(completed) - {n - 1 for n in summary["round"].tolist()})
    if lost:
        console.warn(f"{paths.summary}: no rows for round(s) "
                     f"{', '.join(str(r + 1) for r in lost)} that run.json records as complete; "
                     "rebuilding them from the round files")
    return summary


def _rounds_with_corrupt_parts(paths: RunPaths, rounds: set[int],
                               bounds: list[tuple[int, int]], console: Console) -> set[int]:
    """Finished rounds with a missing or corrupt part file, each moved aside: such a round
    is played again (its good parts are reused) and its summary rows rebuilt."""
    replay = set()
    for r in sorted(rounds):
        for problem in round_problems(paths, r, bounds, ROW_COLUMNS):
            note = (f"; moved aside to {move_aside(problem.path).name}"
                    if problem.path.exists() else "")
            console.warn(f"{problem}{note}; round {r + 1} is played again")
            replay.add(r)
    return replay


def _with_round(summary: pd.DataFrame, rows: pd.DataFrame, r: int) -> pd.DataFrame:
    """``summary`` with round ``r``'s rows (replacing any), in (round, group) order; ``r``
    from 0, the summary's rounds numbered from 1."""
    if not len(summary):
        return rows
    kept = summary[summary["round"] != r + 1]
    if not len(kept):
        return rows
    merged = pd.concat([kept, rows], ignore_index=True)
    return merged.sort_values(["round", "group_id"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class _PlanNumbers:
    """What the round plan did, for the round's record (nothing without a plan)."""

    planned_prompts: int = 0
    plan_s: float | None = None
    answer_methods: dict[str, Any] | None = None


def _round_record(game: Game, rows: pd.DataFrame, outcomes: list[PartitionOutcome],
                  elapsed: float, started_at: float, plan: _PlanNumbers,
                  split: MixSplit | None) -> RoundRecord:
    """The round's run.json record, built as the typed model: a misspelled field fails
    here, where it is written, not in a reader."""
    n = int(rows["n"].sum())
    played = [o for o in outcomes if not o.reused]
    prompt_ids = (np.unique(np.concatenate([o.stats.prompt_ids for o in played]))
                  if played else np.empty(0, np.uint64))
    distinct = int(prompt_ids.size)
    agents_played = sum(o.n_agents for o in played)
    numbers = dict(game.round_numbers(rows))
    mean = numbers.pop("mean", None)
    evaluated = sum(o.stats.prompt_tokens for o in played)
    return RoundRecord(
        started_at=round(started_at, 3),
        n=n,
        n_valid=int(rows["n_valid"].sum()),
        n_unparsed=int(rows["n_unparsed"].sum()),
        n_out_of_range=int(rows["n_out_of_range"].sum()),
        n_error=int(rows["n_error"].sum()),
        n_truncated=int(rows["n_truncated"].sum()),
        n_no_final_answer=int(rows["n_no_final_answer"].sum()),
        mean=mean,
        game_numbers=numbers,  # the game's own headline numbers besides the mean
        tokens_in=int(sum(o.tokens_in for o in outcomes)),
        tokens_out=int(sum(o.tokens_out for o in outcomes)),
        elapsed_s=round(elapsed, 3),
        agents_per_s=round(n / elapsed, 1) if elapsed > 0 else None,
        partitions_reused=sum(bool(o.reused) for o in outcomes),
        # Answer sharing (counted over the partitions played in this invocation):
        distinct_prompts=distinct,
        sharing_factor=round(agents_played / distinct, 1) if distinct else None,
        model_calls=int(sum(o.stats.model_calls for o in played)),
        shared_agents=int(sum(o.stats.shared_agents for o in outcomes)),
        fallback_prompts=int(sum(o.stats.fallback_prompts for o in played)),
        unseen_mass_max=float(max((o.stats.unseen_mass_max for o in played), default=0.0)),
        # A prompt evaluated on a cached common prefix costs only its own suffix.
        prompt_tokens_evaluated=int(evaluated),
        prompt_tokens_per_distinct_prompt=round(evaluated / distinct, 1) if distinct else None,
        planned_prompts=plan.planned_prompts,
        plan_s=plan.plan_s,
        answer_methods=plan.answer_methods,
        by=split,
    )


class _CounterWatch:
    """Per-endpoint counters of this invocation: worker-process totals now minus at start,
    plus what an earlier (resumed) invocation recorded. Read with ``client.run`` so tasks
    sharing a process never double-count each other's requests."""

    def __init__(self, client: Client, ledger: Ledger) -> None:
        self.client = client
        self.ledger = ledger
        self.prior = ledger.record.endpoints
        self.start = client.run(process_counters)

    def update(self) -> None:
        total = {name: dict(values) for name, values in self.prior.items()}
        for worker, now in self.client.run(process_counters).items():
            then = self.start.get(worker, {})
            for name, values in now.items():
                delta = {key: value - then.get(name, {}).get(key, 0)
                         for key, value in values.items()}
                if name not in total and not any(delta.values()):
                    # A back-end an earlier run left in a shared worker, idle in this one.
                    continue
                slot = total.setdefault(name, {})
                for key, value in delta.items():
                    slot[key] = slot.get(key, 0) + value
        self.ledger.set_endpoints(total)


def _rate(value: float | None) -> str:
    value = value or 0.0
    return f"{value:,.0f}" if value >= 100 else f"{value:.2g}"


def _cot_counts(record: RoundRecord) -> str:
    """The answers cut at the token limit or without their marked final answer, where any."""
    return "".join(f", {name} {count}" for name, count in (
        ("truncated", record.n_truncated), ("no final answer", record.n_no_final_answer))
        if count)


def _round_line(config: Config, game: Game, r: int, rows: pd.DataFrame,
                record: RoundRecord) -> str:
    stats = game.round_text(rows, record.numbers)
    line = (
        f"round {r + 1}/{config.game.rounds}: {stats}  invalid {record.n_invalid} "
        f"(unparsed {record.n_unparsed}, out_of_range {record.n_out_of_range}, "
        f"error {record.n_error}{_cot_counts(record)})  {record.elapsed_s or 0.0:.1f}s  "
        f"{_rate(record.agents_per_s)} agents/s  ({game.reference_text(r)})"
        + ("  [synthetic answers: emulated servers, not a model]"
           if answers_source(config) == "synthetic" else "")
    )
    if uses_llm(config.agents) and record.distinct_prompts:
        # A sharing factor only where answers were shared: identical prompts answered one
        # call each share nothing.
        line += (f"\n  {record.distinct_prompts:,} distinct prompts, "
                 + (f"sharing factor {record.sharing_factor or 0.0:,.1f}, "
                    if record.shared_agents else "answers not shared, ")
                 + f"{record.model_calls:,} model calls, "
                 f"{record.shared_agents:,} answers drawn from shared distributions")
        if record.fallback_prompts:
            line += f", {record.fallback_prompts} prompts fell back to one call per agent"
    return line + round_text(record.by)
