"""A round's progress on the client, counted in agents: finished partitions' outcomes plus
what the partitions still playing have reported (``simpipe.agents.progress``).

Shown three ways: the terminal's bar (agents, distinct prompts, model calls, tqdm's ETA),
a console/run.log line every ``LINE_EVERY_S`` (a batch job's log has no bar), and
``run.json``'s ``progress`` (the UI reads it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simpipe.agents.progress import PLAN, AgentCounts, ProgressWatch
from simpipe.run.console import Console
from simpipe.run.round_task import PartitionOutcome
from simpipe.store.ledger import Ledger

#: A progress line in the console and run.log this often during a long round.
LINE_EVERY_S = 30.0


@dataclass(frozen=True)
class RoundSnapshot:
    """Where a round stands now."""

    round: int
    partitions_done: int
    partitions_total: int
    agents_done: int
    agents_total: int
    distinct_prompts: int  # summed over partitions: a prompt seen in two counts twice
    model_calls: int
    elapsed_s: float
    # Seconds since the partitions started playing (after the round plan's stages): agents
    # are answered only from then on, so the rate and the ETA count from there.
    playing_s: float | None = None

    @property
    def agents_per_s(self) -> float | None:
        s = self.elapsed_s if self.playing_s is None else self.playing_s
        return self.agents_done / s if s > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the round's rate so far; None before any agent answered."""
        rate = self.agents_per_s
        return (self.agents_total - self.agents_done) / rate if rate else None


#: Running tasks' reports give an ETA only from this share of the work on: a task's first
#: prompts carry its start (the model loaded, the rules decoded), and an estimate from them
#: alone said 958 s for a round that took 22 s (the 1,000-agent quickstart's round 3).
EARLY_SHARE = 0.02


class TaskWork:
    """How much of a set of tasks is done, each task weighted by its expected work (the
    round plan's chunks: 256 walked prompts are not the wait of 5 full trees), and the ETA
    that follows: the time so far scaled by the work left over the work done. Counting
    tasks instead made the ETA jump: the small chunks end first and promise a quick end.
    A running task that reports its prompts (``advance``) counts for the share it has done:
    a round of 4 walk tasks on 2 workers otherwise showed nothing until half was over."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = [max(float(w), 0.0) for w in weights]
        self.total = sum(self.weights)
        self._finished: set[int] = set()
        self._share: dict[int, float] = {}  # of each running task that reported progress

    def finish(self, index: int) -> None:
        self._finished.add(index)
        self._share.pop(index, None)

    def advance(self, index: int, share: float) -> None:
        """Task ``index``, still running, has done ``share`` (0 to 1) of its work; a task
        already finished stays whole, and a share never goes back (a report may come late)."""
        if index not in self._finished:
            self._share[index] = max(self._share.get(index, 0.0), min(max(share, 0.0), 1.0))

    @property
    def done(self) -> float:
        """The work done: the finished tasks' and the reported shares of the running ones."""
        return (sum(self.weights[i] for i in self._finished)
                + sum(self.weights[i] * share for i, share in self._share.items()))

    @property
    def fraction(self) -> float:
        """The share of the work done, 0 to 1 (1 when there is none)."""
        return min(self.done / self.total, 1.0) if self.total > 0 else 1.0

    def eta(self, elapsed_s: float) -> float | None:
        """Seconds left; None before a task has finished or ``EARLY_SHARE`` of the work is
        done."""
        done = self.done
        if done <= 0.0 or (not self._finished and done < EARLY_SHARE * self.total):
            return None
        return max(self.total - done, 0.0) * elapsed_s / done


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA -"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"ETA {hours}h{minutes:02d}m" if hours else
            f"ETA {minutes}m{secs:02d}s" if minutes else f"ETA {secs}s")


def snapshot_line(snap: RoundSnapshot, rounds_total: int) -> str:
    rate = snap.agents_per_s or 0.0
    return (f"round {snap.round + 1}/{rounds_total}: {snap.agents_done:,}/{snap.agents_total:,} "
            f"agents ({snap.partitions_done}/{snap.partitions_total} partitions), "
            f"{snap.distinct_prompts:,} distinct prompts, {snap.model_calls:,} model calls, "
            f"{rate:,.1f} agents/s, {format_eta(snap.eta_s)}")


class RoundMeter:
    """One round's progress: told of each finished partition, asked to ``update`` often."""

    def __init__(self, watch: ProgressWatch | None, console: Console, ledger: Ledger,
                 round_index: int, rounds_total: int, sizes: list[int],
                 on_update: Callable[[RoundSnapshot], None] | None = None) -> None:
        self.watch = watch
        self.console = console
        self.ledger = ledger
        self.round = round_index
        self.rounds_total = rounds_total
        self.sizes = sizes
        self.on_update = on_update
        self.done: dict[int, PartitionOutcome] = {}
        self.started = time.perf_counter()
        self._playing_since: float | None = None
        self._last_line = self.started
        self.bar = console.progress(sum(sizes), f"round {round_index + 1}", unit="agent")

    def planning(self, stage: str, tasks_done: int, tasks_total: int, eta_s: float | None,
                 work_done: float | None = None, force: bool = False) -> None:
        """The round's plan has ``tasks_done`` of ``tasks_total`` tasks of ``stage`` done,
        ``work_done`` of its work (``eta_s``: the stage's): saved for watchers (the UI), who
        otherwise see nothing until the partitions play. Elapsed is the round's, as when it
        plays."""
        self.ledger.record_plan_progress(self.round, stage, tasks_done, tasks_total,
                                         time.perf_counter() - self.started, eta_s,
                                         len(self.sizes), sum(self.sizes), force=force,
                                         work_done=work_done)

    def plan_reports(self) -> dict[int, AgentCounts]:
        """The round plan's running chunks' latest counts (``distinct``: prompts done)."""
        return self.watch.reported(self.round, PLAN) if self.watch is not None else {}

    def playing(self) -> None:
        """The round plan is done and the partitions are submitted: the rate counts from
        now (a million agents' plan takes minutes in which no agent is answered), and so
        does the next line: the plan printed its own, and a line at the moment the
        partitions start would show only their first instant's rate next to the round's."""
        self._playing_since = self._last_line = time.perf_counter()

    def finished(self, outcome: PartitionOutcome) -> None:
        self.done[outcome.partition] = outcome

    def snapshot(self) -> RoundSnapshot:
        agents = distinct = calls = 0
        for outcome in self.done.values():
            agents += outcome.n_agents
            if not outcome.reused:
                distinct += int(outcome.stats.prompt_ids.size)
                calls += outcome.stats.model_calls
        reported = self.watch.reported(self.round) if self.watch is not None else {}
        for partition, counts in reported.items():
            if partition not in self.done:
                agents += counts.agents
                distinct += counts.distinct
                calls += counts.calls
        now = time.perf_counter()
        return RoundSnapshot(self.round, len(self.done), len(self.sizes), agents,
                             sum(self.sizes), distinct, calls, now - self.started,
                             None if self._playing_since is None
                             else now - self._playing_since)

    def update(self, force: bool = False) -> RoundSnapshot:
        snap = self.snapshot()
        self.bar.update(max(0, snap.agents_done - self.bar.n))
        self.bar.set_postfix_str(f"{snap.partitions_done}/{snap.partitions_total} parts, "
                                 f"{snap.distinct_prompts:,} prompts, "
                                 f"{snap.model_calls:,} calls", refresh=False)
        self.ledger.record_progress(
            snap.round, snap.partitions_done, snap.partitions_total, snap.agents_done,
            snap.elapsed_s, force=force, agents_total=snap.agents_total,
            distinct_prompts=snap.distinct_prompts, model_calls=snap.model_calls,
            playing_s=snap.playing_s)
        now = time.perf_counter()
        if now - self._last_line >= LINE_EVERY_S and snap.partitions_done < len(self.sizes):
            self._last_line = now
            self.console.line(snapshot_line(snap, self.rounds_total))
        if self.on_update is not None:
            self.on_update(snap)
        return snap

    def close(self) -> None:
        self.bar.close()
        if self.watch is not None:
            self.watch.forget(self.round)
