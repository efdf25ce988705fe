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

Their teardown stays off the terminal too: they write to it (a LocalCluster's processes
share the client's stderr), and a worker whose scheduler closed first logs two tracebacks
("Failed to communicate with scheduler during heartbeat"; tornado's "Exception in callback"),
under load after a SIGTERM or a Ctrl-C, once the user was promised one line
(``quiet_local_workers``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PRELOAD = "simpipe.cluster.ctrl_c"  # distributed imports it by name in each worker
#: The loggers (and their children) that speak while a cluster is torn down.
TEARDOWN_LOGGERS = ("distributed", "tornado", "asyncio")
#: How long the workers may take to hear it before the teardown goes on regardless.
QUIET_TIMEOUT_S = 2.0


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


def silence_teardown_loggers() -> dict[str, int]:
    """Turn off, in this process, the loggers a cluster's teardown speaks through (and their
    children); their levels before, to put back."""
    names = [name for name in list(logging.root.manager.loggerDict)
             if any(name == p or name.startswith(p + ".") for p in TEARDOWN_LOGGERS)]
    saved: dict[str, int] = {}
    for name in {*TEARDOWN_LOGGERS, *names}:
        logger = logging.getLogger(name)
        saved[name] = logger.level
        logger.setLevel(logging.CRITICAL + 1)
    return saved


def quiet_local_workers(client: Any) -> None:
    """Before a LocalCluster closes: its worker processes stop logging (the run is over,
    whatever they would say about lost connections). Its nannies live in this process,
    whose loggers stay as they are (an interrupt silences them: ``QuietTeardown``). A
    worker that cannot hear it within ``QUIET_TIMEOUT_S`` may still speak; the teardown
    goes on either way."""
    # Last resort, and on purpose broad: a closed comm, a timeout, a worker already gone;
    # the teardown must go on whatever this meets.
    with contextlib.suppress(Exception):
        client.run(silence_teardown_loggers, callback_timeout=QUIET_TIMEOUT_S)
