"""The states a run and an experiment's cell go through, one enum per state machine.

Written by the run (``simpipe.run``) into ``run.json`` and ``experiment.json``, read by the
report, the web UI and the command line; here, in the store, because the store is the lowest
layer all of them import. Each is a ``StrEnum``: it compares equal to its string and is
written as it, so the files keep the words they always had ("running", "finished", ...), and
a word simpipe never writes is refused when the file is read (``simpipe.store.record``).
A persistent cluster's states are ``simpipe.cluster.state.ClusterState`` (the cluster
layer is below the store), and a SLURM job's are SLURM's own words.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Strict


class RunState(StrEnum):
    """A run's ``state`` in ``run.json`` (and an experiment's in ``experiment.json``: an
    experiment is played as one run of runs and goes through the same states)."""

    CREATED = "created"  # the folder and run.json exist; no round started yet
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"  # an error stopped it; ``error`` says which
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM or a cancel request: --resume continues
    # A run.json without a state (never written by simpipe, but such a file still reads).
    UNKNOWN = "unknown"


#: The states of a run some process may still be playing.
LIVE_STATES = frozenset({RunState.CREATED, RunState.RUNNING})
#: The states of a run no process plays any more and that ended (what the web UI may delete).
ENDED_STATES = frozenset({RunState.FINISHED, RunState.FAILED, RunState.INTERRUPTED})


class CellState(StrEnum):
    """An experiment cell's ``state`` in ``experiment.json``: its run as the experiment last
    saw it."""

    PENDING = "pending"  # not started by this experiment yet
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


# A field of a file's record (strict models): JSON holds the state's word, which strict
# validation would refuse for not being the enum member; by value, any other word is still
# refused.
StoredRunState = Annotated[RunState, Strict(False)]
StoredCellState = Annotated[CellState, Strict(False)]
