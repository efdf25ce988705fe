"""Progress counted in agents: partitions report agents answered while they play (Dask
events from inside the task), and the client's round loop, run.json and the round line show
them. Real LocalClusters; no timing assertions (waits end on what is seen, with a deadline)."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from distributed import Client, Event, LocalCluster

from simpipe.agents.progress import PLAN, AgentCounts, ProgressWatch, report_agents, reporting
from simpipe.answers.round_plan import plans_rounds
from simpipe.answers.shared import prompt_hash
from simpipe.games.registry import game_for
from simpipe.run.console import Console
from simpipe.run.planned_round import ChunkProgress, plan_chunk, plan_walk_chunk
from simpipe.run.round_progress import (
    RoundMeter,
    RoundSnapshot,
    TaskWork,
    format_eta,
    snapshot_line,
)
from simpipe.run.simulation import RoundObserver, await_plan_tasks, run_simulation
from simpipe.servers.stub import StubProcess
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import open_run_dir
from simpipe.store.results import read_ledger

from support import small_config

QUIET = Console(quiet=True)


def _until(check, what: str, deadline_s: float = 120.0):
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after a
    generous deadline (a hang, not a speed, is what it catches)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"never saw {what}")


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as c:
            yield c


def test_a_task_reports_agents_before_it_finishes(client):
    topic = "simpipe-progress-test"
    watch = ProgressWatch(client, topic)

    def partition_task(topic: str) -> int:
        # As a partition's code does: report some agents, then more only when told to go on.
        with reporting(topic, 1, 3):
            report_agents(5, distinct=2, calls=2)
            Event("go-on").wait(timeout=120)
            report_agents(7, distinct=1, calls=4)
        return 12

    try:
        future = client.submit(partition_task, topic, pure=False)
        seen = _until(lambda: watch.reported(1).get(3), "the first report")
        assert seen == AgentCounts(agents=5, distinct=2, calls=2)
        assert not future.done()  # reported while the task still plays
        Event("go-on", client=client).set()
        assert future.result() == 12
        # The last counts are sent when the task ends, throttled or not.
        final = _until(lambda: watch.reported(1).get(3) == AgentCounts(12, 3, 6) or None,
                       "the final counts")
        assert final
        assert watch.reported(0) == {}  # per round
        watch.forget(1)
        assert watch.reported(1) == {}
    finally:
        watch.close()


def test_report_agents_outside_a_task_does_nothing():
    report_agents(10, distinct=1, calls=1)  # no worker, no reporter: no error either
    with reporting("some-topic", 0, 0) as reporter:
        assert reporter is None  # not in a Dask worker
        report_agents(3)


class _Snapshots(RoundObserver):
    def __init__(self) -> None:
        self.seen: list[RoundSnapshot] = []

    def round_progress(self, snapshot: RoundSnapshot) -> None:
        self.seen.append(snapshot)


def test_a_run_counts_agents_per_round_in_its_progress(client, tmp_path):
    config = small_config(tmp_path, game={"rounds": 2})
    observer = _Snapshots()
    run_simulation(config, client=client, console=QUIET, observer=observer)
    for r in (0, 1):
        snaps = [s for s in observer.seen if s.round == r]
        assert snaps, f"no progress in round {r + 1}"
        last = snaps[-1]
        assert last.agents_done == last.agents_total == 600
        assert last.partitions_done == last.partitions_total == 4
        assert last.eta_s == 0.0
        # Counts only grow within a round.
        assert [s.agents_done for s in snaps] == sorted(s.agents_done for s in snaps)
        assert last.distinct_prompts == last.model_calls == 0  # scripted agents call nothing
    ledger = read_ledger(config.run_dir)
    assert ledger.progress is None  # cleared when the round is recorded


def test_run_json_progress_carries_agents_prompts_calls_and_eta(tmp_path):
    from simpipe.store.ledger import open_run_dir

    config = small_config(tmp_path)
    ledger = open_run_dir(RunPaths(config.run_dir), config, resume=False, force=False)
    ledger.record_progress(1, 0, 4, 150, 3.0, force=True, agents_total=600,
                           distinct_prompts=40, model_calls=55)
    progress = read_ledger(config.run_dir).progress
    assert (progress.agents_done, progress.agents_total) == (150, 600)
    assert (progress.distinct_prompts, progress.model_calls) == (40, 55)
    assert progress.agents_per_s == 50.0 and progress.eta_s == 9.0


def test_the_progress_line_states_agents_prompts_calls_and_eta():
    snap = RoundSnapshot(round=1, partitions_done=0, partitions_total=16, agents_done=250_000,
                         agents_total=1_000_000, distinct_prompts=1_010, model_calls=3_030,
                         elapsed_s=100.0)
    assert snapshot_line(snap, 3) == (
        "round 2/3: 250,000/1,000,000 agents (0/16 partitions), 1,010 distinct prompts, "
        "3,030 model calls, 2,500.0 agents/s, ETA 5m00s")
    assert format_eta(None) == "ETA -" and format_eta(7300) == "ETA 2h01m"


def test_the_rate_and_eta_count_from_when_the_partitions_started_playing(tmp_path):
    # A million agents' round plan took an hour in which no agent was answered; then the
    # partitions answered 100,000 agents in 100 s. The ETA is the 900 s that rate gives,
    # not the 9 hours the round's whole elapsed time would.
    snap = RoundSnapshot(round=2, partitions_done=0, partitions_total=16, agents_done=100_000,
                         agents_total=1_000_000, distinct_prompts=35_000, model_calls=0,
                         elapsed_s=3_700.0, playing_s=100.0)
    assert snap.agents_per_s == 1_000.0 and snap.eta_s == 900.0
    assert snapshot_line(snap, 3).endswith("1,000.0 agents/s, ETA 15m00s")
    from simpipe.store.ledger import open_run_dir

    config = small_config(tmp_path)
    ledger = open_run_dir(RunPaths(config.run_dir), config, resume=False, force=False)
    ledger.record_progress(2, 0, 16, 100_000, 3_700.0, force=True, agents_total=1_000_000,
                           playing_s=100.0)
    progress = read_ledger(config.run_dir).progress
    assert (progress.elapsed_s, progress.agents_per_s, progress.eta_s) == (3_700.0, 1_000.0,
                                                                           900.0)


def test_one_call_per_agent_moves_the_round_before_the_partition_returns(client, tmp_path):
    # A chain of thought takes seconds per agent: the progress counted agents only when the
    # partition's whole batch returned ("0 prompts, 0 calls, ETA -" for minutes). One
    # partition, one request at a time to a stub server that takes 0.25 s per answer.
    with StubProcess(delay_s=0.25) as stub:
        config = small_config(
            tmp_path, population={"size": 12, "partitions": 1}, game={"rounds": 1,
                                                                      "prompt": "cot"},
            agents={"backend": "tgi", "tgi": {"endpoints": [stub.url], "max_concurrency": 1}})
        observer = _Snapshots()
        run_simulation(config, client=client, console=QUIET, observer=observer)
    partial = [s for s in observer.seen
               if s.partitions_done == 0 and 0 < s.agents_done < s.agents_total]
    assert partial, "no agent counted before the partition returned"
    assert all(s.model_calls == s.agents_done and s.eta_s is not None for s in partial)
    assert partial[-1].distinct_prompts > 0  # known before the first answer
    last = observer.seen[-1]
    assert last.agents_done == last.model_calls == 12  # each agent counted once


@pytest.mark.llm
@pytest.mark.slow
def test_embedded_chains_of_thought_are_counted_as_each_answer_ends(client, tmp_path):
    # The quickstart's case: the embedded model writes a chain of thought for each agent in
    # turn (answers are reproducible: one request at a time); the round moves per answer.
    config = small_config(
        tmp_path, population={"size": 8, "partitions": 1}, game={"rounds": 1, "prompt": "cot"},
        agents={"backend": "llamacpp", "cot_max_tokens": 48, "reproducible": True})
    observer = _Snapshots()
    run_simulation(config, client=client, console=QUIET, observer=observer)
    partial = [s for s in observer.seen
               if s.partitions_done == 0 and 0 < s.agents_done < s.agents_total]
    assert partial, "no agent counted before the partition returned"
    assert observer.seen[-1].agents_done == 8


@pytest.mark.llm
@pytest.mark.slow
def test_an_llm_partition_reports_agents_before_it_finishes(client, tmp_path):
    # One partition; education and age: ~60 prompts of one agent or two each, too few for
    # a full tree. A population mixed by ``model`` is not planned (each group is answered
    # by its own policy), so the partition walks each prompt lazily itself, in batches of
    # eight prompts evaluated together, and reports as its agents' walks end: the first
    # batches' agents before the last batch ends. (A planned round walks them in its plan's
    # tasks, shown as the plan's progress.) Eight batches, not two: with two, the first
    # ended a decode or two before the partition, under the reports' half-second spacing.
    config = small_config(
        tmp_path, population={"size": 64, "partitions": 1,
                              "attributes": {
                                  "education": {"values": {"High School": 1,
                                                           "Bachelor's Degree": 1,
                                                           "Ph.D.": 1}},
                                  "age": {"min": 18, "max": 80},
                                  "model": {"values": {"gemma": 1}}},
                              "persona": {"mode": "template",
                                          "template": "Your education: {education}, "
                                                      "age {age}."}},
        game={"rounds": 1},
        agents={"backend": "llamacpp", "max_tokens": 4, "llamacpp": {"n_parallel": 4},
                "by": {"model": {"gemma": {}}}})
    assert not plans_rounds(config)
    observer = _Snapshots()
    run_simulation(config, client=client, console=QUIET, observer=observer)
    partial = [s for s in observer.seen
               if s.partitions_done == 0 and 0 < s.agents_done < s.agents_total]
    assert partial, "no agent counts from the partition before it ended"
    assert all(s.distinct_prompts > 0 and s.model_calls > 0 for s in partial)
    log = RunPaths(config.run_dir).log.read_text("utf-8")
    record = read_ledger(config.run_dir).round(0)
    assert (f"{record.distinct_prompts:,} distinct prompts" in log
            and f"{record.model_calls:,} model calls" in log)


def test_run_json_shows_a_round_plans_tasks_until_the_partitions_play(tmp_path):
    from simpipe.store.ledger import open_run_dir

    config = small_config(tmp_path)
    ledger = open_run_dir(RunPaths(config.run_dir), config, resume=False, force=False)
    ledger.record_plan_progress(2, "distributions", 1_200, 4_081, 600.0, 1_440.0,
                                partitions_total=16, agents_total=1_000_000, force=True,
                                work_done=0.29407)
    progress = read_ledger(config.run_dir).progress
    assert progress.round == 3 and progress.agents_total == 1_000_000
    assert progress.agents_done == 0 and progress.partitions_total == 16
    plan = progress.planning
    assert (plan.stage, plan.tasks_done, plan.tasks_total, plan.eta_s, plan.work_done) == (
        "distributions", 1_200, 4_081, 1_440.0, 0.2941)
    # The partitions play: the agents' progress replaces the plan's.
    ledger.record_progress(2, 0, 16, 100, 1.0, force=True, agents_total=1_000_000)
    assert read_ledger(config.run_dir).progress.planning is None


@pytest.mark.llm
@pytest.mark.slow
def test_a_planned_round_shows_its_plan_in_run_json_while_it_runs(client, tmp_path):
    # The embedded model, its answers planned: run.json says which stage of the plan runs
    # and how many of its tasks are done, before any agent has played.
    config = small_config(tmp_path, population={"size": 40, "partitions": 2},
                          game={"rounds": 1}, agents={"backend": "llamacpp", "max_tokens": 4})
    assert plans_rounds(config)
    seen: list[tuple[str, int, int, int]] = []
    work: list[float | None] = []
    stop = threading.Event()

    def watch() -> None:
        paths = RunPaths(config.run_dir)
        while not stop.is_set():
            try:
                progress = read_ledger(config.run_dir).progress if paths.ledger.exists() else None
            except Exception:  # noqa: BLE001 -- a file between writes: look again
                progress = None
            if progress is not None and progress.planning is not None:
                p = progress.planning
                seen.append((p.stage, p.tasks_done, p.tasks_total, progress.agents_done))
                work.append(p.work_done)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run_simulation(config, client=client, console=QUIET)
    finally:
        stop.set()
        watcher.join()
    stages = {stage for stage, *_ in seen}
    assert "distributions" in stages, seen
    assert all(done <= total and agents == 0 for _, done, total, agents in seen), seen
    assert work and all(w is not None and 0.0 <= w <= 1.0 for w in work), work
    assert read_ledger(config.run_dir).progress is None  # cleared when the round is recorded


def test_the_plans_eta_weighs_each_task_by_its_work():
    # Two chunks of 5 full trees end first, then two of 241 walks remain (the 1,000-agent
    # quickstart's round 2): counted in tasks the ETA would say "as long again" after the
    # first half of the tasks; weighed, it says the walks are most of the round.
    from simpipe.answers.round_plan import TREE_PROMPT_S, WALK_PROMPT_S

    work = TaskWork([5 * TREE_PROMPT_S, 5 * TREE_PROMPT_S, 241 * WALK_PROMPT_S,
                     241 * WALK_PROMPT_S])
    assert work.eta(3.0) is None  # nothing done yet: no estimate
    assert work.fraction == 0.0
    work.finish(0)
    work.finish(1)
    assert work.eta(5.0) == pytest.approx(5.0 * (2 * 241 * WALK_PROMPT_S)
                                          / (2 * 5 * TREE_PROMPT_S))
    assert work.eta(5.0) > 5.0  # the walks are most of the work (by tasks: 5.0 s more)
    # What the UI's bar shows: far less than the half of the tasks.
    assert work.fraction == pytest.approx(TREE_PROMPT_S / (TREE_PROMPT_S + 241 * WALK_PROMPT_S / 5))
    assert work.fraction < 0.5
    work.finish(2)
    work.finish(3)
    assert work.eta(30.0) == 0.0 and work.fraction == 1.0
    assert TaskWork([1.0, 1.0]).eta(1.0) is None
    assert TaskWork([]).fraction == 1.0


class _Clock:
    """``time`` for the meter, moved by the test: which line is printed when is the
    behaviour under test, not how long anything takes."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def perf_counter(self) -> float:
        return self.now


def test_the_first_agent_line_comes_a_period_after_the_partitions_start(tmp_path,
                                                                        monkeypatch):
    # A round whose plan took 45 s printed, the instant its partitions started drawing, a
    # line of their first instant ("1,000/1,000 agents ... 8,195 agents/s") next to the
    # round's own "26 agents/s". The plan prints its own lines; the agents' line now counts
    # its period from when the partitions start.
    from simpipe.run import round_progress
    from simpipe.store.ledger import open_run_dir

    clock = _Clock()
    monkeypatch.setattr(round_progress, "time", clock)
    config = small_config(tmp_path)
    ledger = open_run_dir(RunPaths(config.run_dir), config, resume=False, force=False)
    log = tmp_path / "console.log"
    console = Console(quiet=True)
    console.attach_log(log)
    try:
        meter = round_progress.RoundMeter(None, console, ledger, 0, 1, [300, 300])
        clock.now += 45.0  # the round plan's stages
        meter.playing()
        meter.update()
        clock.now += round_progress.LINE_EVERY_S - 1.0
        meter.update()
        assert "agents/s" not in log.read_text()
        clock.now += 1.0
        meter.update()
        lines = [line for line in log.read_text().splitlines() if "agents/s" in line]
        assert len(lines) == 1 and "round 1/1: 0/600 agents (0/2 partitions)" in lines[0]
    finally:
        console.detach_log()


def test_a_running_tasks_reported_share_counts_and_never_goes_back():
    work = TaskWork([10.0, 30.0])
    work.advance(1, 0.01)  # a task's first prompts carry its start: too early to say
    assert work.fraction == pytest.approx(0.3 / 40.0) and work.eta(1.0) is None
    work.advance(1, 0.5)  # the big task is half done, nothing has finished
    assert work.fraction == pytest.approx(15.0 / 40.0)
    assert work.eta(15.0) == pytest.approx(25.0)  # 15 s for 15 of 40: 25 s for the rest
    work.advance(1, 0.25)  # a late report of an earlier count
    assert work.fraction == pytest.approx(15.0 / 40.0)
    work.advance(0, 7.0)  # a count past the task's prompts is the whole task
    assert work.fraction == pytest.approx(25.0 / 40.0)
    work.finish(1)
    work.advance(1, 0.1)  # finished: whole, whatever a report says after
    assert work.fraction == pytest.approx(40.0 / 40.0)


def test_the_plans_progress_moves_while_its_only_task_runs(client, tmp_path):
    # A round plan of one task of 10 prompts: before, its progress and ETA said nothing
    # until the task ended. The task reports 4 prompts done, then waits; the plan's
    # progress (what run.json and the UI get) shows 0 of 1 tasks and 40 % of the work.
    topic = "simpipe-progress-plan-test"
    watch = ProgressWatch(client, topic)
    config = small_config(tmp_path)
    paths = RunPaths(config.run_dir)
    ledger = open_run_dir(paths, config, resume=False, force=False)
    meter = RoundMeter(watch, QUIET, ledger, 2, 3, [10])
    seen: list[tuple[int, float]] = []

    def chunk_task(topic: str) -> int:
        with reporting(topic, 2, 0, stage=PLAN):
            report_agents(0, distinct=4, calls=9)
            Event("plan-go-on").wait(timeout=120)
            report_agents(0, distinct=6, calls=11)
        return 10

    def sink(done, total, eta, work_done, force=False):
        seen.append((done, work_done))

    try:
        future = client.submit(chunk_task, topic, pure=False)
        waiting = threading.Thread(target=await_plan_tasks, args=(
            client, [future], "distributions", paths, QUIET, sink, [1.0], [10],
            meter.plan_reports), daemon=True)
        waiting.start()
        _until(lambda: (0, pytest.approx(0.4)) in seen, "40 % of the plan with no task done")
        assert not future.done()
        assert watch.reported(2) == {}  # the plan's counts are not a partition's agents
        Event("plan-go-on", client=client).set()
        waiting.join(timeout=120)
        assert seen[-1] == (1, 1.0)
        assert watch.reported(2, PLAN)[0] == AgentCounts(0, 10, 20)
    finally:
        watch.close()


@pytest.mark.llm
@pytest.mark.slow
def test_the_plans_tasks_report_each_prompt_they_are_done_with(client, tmp_path):
    # Both stage-2 tasks on the embedded model, run on a worker as the round plan submits
    # them: each reports every prompt of its chunk, with the model calls it made.
    topic = "simpipe-progress-chunks-test"
    watch = ProgressWatch(client, topic)
    config = small_config(tmp_path, agents={"backend": "llamacpp", "max_tokens": 4})
    game = game_for(config.game)
    prompts = [f"Player {k} of the game. Your number between 0 and 100:" for k in range(6)]
    texts = {prompt_hash(p): p for p in prompts}
    hashes = np.array(list(texts), np.uint64)
    walkers = {h: np.array([3 * k, 3 * k + 1]) for k, h in enumerate(texts)}
    try:
        trees = client.submit(plan_chunk, config.agents, game, hashes, np.full(6, 40), texts,
                              progress=ChunkProgress(topic, 1, 0), pure=False).result()
        walks = client.submit(plan_walk_chunk, config.agents, game, 3, 1, hashes, [texts],
                              [walkers], progress=ChunkProgress(topic, 1, 1),
                              pure=False).result()
        got = _until(lambda: (lambda r: r if len(r) == 2 and r[1].distinct == 6 else None)(
            watch.reported(1, PLAN)), "both chunks' final counts")
        assert got[0] == AgentCounts(0, 6, sum(f.calls for f in trees.lookups))
        assert got[1] == AgentCounts(0, 6, sum(f.calls for f in walks.lookups))
        assert all(f.distribution is not None for f in trees.lookups + walks.lookups)
        assert got[0].calls > 6 and got[1].calls > 6  # probes were made and counted
    finally:
        watch.close()
