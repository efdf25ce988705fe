"""SIGTERM stops a run as Ctrl-C does: marked ``interrupted``, its cluster torn down.

SIGTERM is how a run is usually stopped when no terminal is attached: ``scancel`` and a
job's time limit (SLURM sends it to every process of the job, then SIGKILL after its
``KillWait``), ``timeout``, ``kill``. Python's default for it ends the process at once:
``run.json`` stayed ``running`` and the SLURM worker jobs stayed queued until their own
walltime. While a run is in progress the signal raises ``Terminated`` instead, a
``KeyboardInterrupt``, so the one path Ctrl-C takes (state, teardown, quiet logs) serves
both; the command line then exits with status 143 (128 + SIGTERM) instead of 130.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a run was in progress."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # A second SIGTERM must not cut the teardown short (SLURM's SIGKILL comes anyway).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises ``Terminated`` in the main thread. Only where SIGTERM has
    Python's default: a program that set its own handler keeps it (and off the main
    thread, where handlers cannot be set, nothing changes)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
