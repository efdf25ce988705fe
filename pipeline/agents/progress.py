"""Progress from inside a partition's task: agents answered so far, reported as they come.

A partition of 62,500 LLM agents can take many minutes; counting finished partitions alone
showed "0/16 partitions" for half an hour. Code that plays a partition calls
``report_agents`` whenever agents get their answers; the counts travel as Dask structured
events (``Worker.log_event`` on the worker, ``Client.subscribe_topic`` on the client) over
the connection every worker already has to the scheduler, so they work wherever a worker
runs (a LocalCluster, SLURM jobs). A task sends at most one event every ``MIN_INTERVAL_S``
(and one when it ends); each event carries the task's cumulative counts, so a lost or
repeated event never miscounts, and a retried task simply starts its counts again.

The round plan's tasks (``simpipe.run.planned_round``) report the same way under the stage
``plan``, keyed by their chunk: ``distinct`` counts the prompts whose answers they have
computed, so that the plan's progress and ETA move while a chunk of 256 prompts runs, not
only when it ends.

Outside a reporting task (a unit test, the bench's in-process calls) ``report_agents`` does
nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # distributed is loaded where a task reports: `simpipe validate` runs none
    from distributed import Client

#: At most one event per task this often: a million-agent round sends a few hundred events.
MIN_INTERVAL_S = 0.5

#: The stages a task reports from: a partition playing its agents, a round plan's chunk.
PLAY, PLAN = "play", "plan"

_local = threading.local()  # the reporter of the task running in this thread, if any


@dataclass
class AgentCounts:
    """What one partition's task has done so far in a round."""

    agents: int = 0  # agents with an answer (or a final error)
    distinct: int = 0  # distinct prompts answered (counted within the partition)
    calls: int = 0  # model calls made (requests, or distribution computations)


class TaskReporter:
    """One task's cumulative counts, sent as an event now and then; thread-safe, so code
    running on the process's event loop may add to it too (``current_reporter``)."""

    def __init__(self, topic: str, round_index: int, partition: int, send: object,
                 stage: str = PLAY) -> None:
        self.topic = topic
        self.round_index = round_index
        self.partition = partition  # or the chunk, for the plan's stage
        self.stage = stage
        self.counts = AgentCounts()
        self._send = send
        self._lock = threading.Lock()
        self._last_sent = -MIN_INTERVAL_S  # the first counts go out at once
        self._unsent = False

    def add(self, agents: int, distinct: int = 0, calls: int = 0) -> None:
        with self._lock:
            self.counts.agents += int(agents)
            self.counts.distinct += int(distinct)
            self.counts.calls += int(calls)
            now = time.monotonic()
            if now - self._last_sent < MIN_INTERVAL_S:
                self._unsent = True
                return
            self._last_sent, self._unsent = now, False
            message = self._message()
        self._send(message)

    def flush(self) -> None:
        """Send what has not been sent yet (the task's last counts)."""
        with self._lock:
            if not self._unsent:
                return
            self._unsent = False
            message = self._message()
        self._send(message)

    def _message(self) -> dict:
        c = self.counts
        return {"round": self.round_index, "partition": self.partition, "stage": self.stage,
                "agents": c.agents, "distinct": c.distinct, "calls": c.calls}


@contextmanager
def reporting(topic: str, round_index: int, partition: int,
              stage: str = PLAY) -> Iterator[TaskReporter | None]:
    """Within this block, ``report_agents`` in this thread reports to ``topic`` (on a Dask
    worker only; elsewhere, or with no topic, it yields None and nothing is sent); the
    plan's tasks pass ``stage=PLAN`` and their chunk as ``partition``."""
    from distributed import get_worker

    try:
        worker = get_worker() if topic else None
    except ValueError:  # not running in a Dask worker
        worker = None
    if worker is None:
        yield None
        return
    reporter = TaskReporter(topic, round_index, partition,
                            lambda message: worker.log_event(topic, message), stage)
    outer = getattr(_local, "reporter", None)
    _local.reporter = reporter
    try:
        yield reporter
    finally:
        _local.reporter = outer
        reporter.flush()


def current_reporter() -> TaskReporter | None:
    """The reporter of the task running in this thread: hand it to code that runs in
    another thread (the process's event loop) to report from there."""
    return getattr(_local, "reporter", None)


def report_agents(n: int, distinct: int = 0, calls: int = 0) -> None:
    """``n`` more agents of this task have their answers, from ``distinct`` more distinct
    prompts and ``calls`` more model calls. A no-op outside a reporting task."""
    reporter = getattr(_local, "reporter", None)
    if reporter is not None:
        reporter.add(n, distinct, calls)


class ProgressWatch:
    """The client's side: the latest counts of each partition's task (and of each of the
    round plan's chunks), per round, from the events of ``topic`` (handled on the client's
    event loop, read from the round loop)."""

    def __init__(self, client: Client, topic: str) -> None:
        self.client = client
        self.topic = topic
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, int, int], AgentCounts] = {}
        client.subscribe_topic(topic, self._on_event)

    def _on_event(self, event: tuple[float, dict]) -> None:
        _, message = event
        try:
            key = (str(message.get("stage", PLAY)), int(message["round"]),
                   int(message["partition"]))
            counts = AgentCounts(int(message["agents"]), int(message["distinct"]),
                                 int(message["calls"]))
        except (KeyError, TypeError, ValueError):
            return  # not one of ours: the topic name is unique per run, but be safe
        with self._lock:
            self._latest[key] = counts

    def reported(self, round_index: int, stage: str = PLAY) -> dict[int, AgentCounts]:
        """Partition (or, for ``PLAN``, chunk) -> its task's latest counts in round
        ``round_index``."""
        with self._lock:
            return {k: c for (s, r, k), c in self._latest.items()
                    if r == round_index and s == stage}

    def forget(self, round_index: int) -> None:
        with self._lock:
            self._latest = {key: c for key, c in self._latest.items() if key[1] != round_index}

    def close(self) -> None:
        """Stop the scheduler sending this topic's events (a shared client runs on)."""
        from distributed.client import ClosedClientError

        try:
            self.client.unsubscribe_topic(self.topic)
        except (ValueError, ClosedClientError):
            pass  # never subscribed, or the client is closed: nothing is sent any more
