"""A user's error raised in a task reaches the terminal once: as the client's one line.

Dask's worker logs every failed task at ERROR with its traceback ("Compute Failed"): on the
terminal of a local run, in each SLURM worker's log. The client then gets the same
exception and ``simpipe`` prints it as ``error: ...``. For a ``SimpipeError`` (a problem
its message explains, with the fix) the worker's traceback is noise, and it comes once per
task that met the problem: one model file llama.cpp cannot use fails every chunk of round 1,
each with its own traceback above the one line that matters. Any other failure keeps its
log: that is a bug's only record on a remote worker.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed import Client, WorkerPlugin

from simpipe.core.errors import SimpipeError

#: The logger and message of dask's failed-task record (``distributed.worker``).
WORKER_LOGGER = "distributed.worker"
FAILED_TASK = "Compute Failed"
_EXCEPTION_ARG = 3  # the record's args: key, state, task, exception text, traceback text


def _user_error_names() -> set[str]:
    """The class names of every ``SimpipeError`` this process has imported."""
    names, todo = set(), [SimpipeError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


class UserErrorFilter(logging.Filter):
    """Drops dask's failed-task record when the task raised a ``SimpipeError``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (not isinstance(record.msg, str) or not record.msg.startswith(FAILED_TASK)
                or not isinstance(args, tuple) or len(args) <= _EXCEPTION_ARG):
            return True
        # The exception as text (its repr: "ModelFileError('...')"): only its class name.
        raised = str(args[_EXCEPTION_ARG]).split("(", 1)[0].strip()
        return raised not in _user_error_names()


def quiet_user_errors() -> None:
    """Install the filter on this process's dask worker logger, once."""
    logger = logging.getLogger(WORKER_LOGGER)
    if not any(isinstance(f, UserErrorFilter) for f in logger.filters):
        logger.addFilter(UserErrorFilter())


class QuietUserErrors(WorkerPlugin):
    """Installs ``UserErrorFilter`` on every worker it is registered with."""

    name = "simpipe-quiet-user-errors"

    def setup(self, worker: Any) -> None:
        quiet_user_errors()


def quiet_user_errors_on_workers(client: Client) -> None:
    """Every current and future worker of ``client`` keeps a user's error to the client."""
    client.register_plugin(QuietUserErrors(), name=QuietUserErrors.name)
