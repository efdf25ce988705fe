"""Local worker processes stay out of the terminal's Ctrl-C; the client alone handles it.

A terminal sends SIGINT to its whole foreground process group, and the worker processes a
``LocalCluster`` spawns are in it. Distributed leaves SIGINT to Python's default, so every
worker raised KeyboardInterrupt (while importing, or in its event loop), printed a
traceback and died mid-task while the client was still shutting the cluster down. The
client marks the run interrupted and closes the cluster, whose nannies stop the workers:
they need no signal of their own.

Two layers. Worker processes start with SIGINT ignored: a child inherits an ignored signal
through exec, and Python then leaves it ignored. And the ``dask_setup`` preload ignores
SIGINT in a worker that a nanny restarts later, once the client has its handler back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PRELOAD = "simpipe.cluster.ctrl_c"  # distributed imports it by name in each worker


@contextmanager
def workers_ignore_sigint() -> Iterator[None]:
    """Processes started inside ignore SIGINT for good.

    SIGINT is ignored in this process too while inside (the disposition is per process), so
    a Ctrl-C pressed during those seconds is lost: the price of workers that never see one.
    Blocking it instead would not do: Python unblocks signals when a child starts."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; nothing to change elsewhere
        return
    old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT,
                      signal.default_int_handler if old_handler is None else old_handler)


def import_slurm_cluster() -> type:
    """``dask_jobqueue.SLURMCluster``, imported without its side effect on Ctrl-C.

    Importing dask_jobqueue sets a SIGINT handler that calls ``sys.exit()`` (meant for
    its SLURMRunner's rank processes): in the client, Ctrl-C then ended a run with exit
    status 0 and its state "failed". The handler we had stays."""
    previous = signal.getsignal(signal.SIGINT)
    from dask_jobqueue import SLURMCluster  # only SLURM runs pay for it

    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, previous)
    return SLURMCluster


def dask_setup(worker: Any) -> None:
    """Worker preload: distributed calls it in the worker process's main thread at start."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
