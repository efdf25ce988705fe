"""A user's error raised in a task is the client's one line; dask's worker keeps its
failed-task traceback for anything else (a bug's only record on a remote worker)."""

from __future__ import annotations

import logging

from simpipe.inference.llamacpp.model_files import ModelFileError
from simpipe.run.worker_errors import FAILED_TASK, UserErrorFilter, quiet_user_errors


def _failed_task(exception_text: str) -> logging.LogRecord:
    # As distributed.worker logs it: the message and its five arguments.
    return logging.LogRecord(
        "distributed.worker", logging.ERROR, __file__, 1,
        f"{FAILED_TASK}\nKey:       %s\nState:     %s\nTask:  %s\nException: %r\n"
        "Traceback: %r\n",
        ("plan-round-0-chunk-0", "executing", "<Task ...>", exception_text, "  File ..."), None)


def test_a_user_error_in_a_task_is_left_to_the_client():
    keep = UserErrorFilter().filter
    # dask's exception text is the exception's repr
    assert not keep(_failed_task(repr(ModelFileError("agents.llamacpp.model_path = 'x': ..."))))
    assert not keep(_failed_task("SimpipeError('...')"))


def test_other_failures_and_other_records_are_logged():
    keep = UserErrorFilter().filter
    assert keep(_failed_task("KeyError('agent_id')"))
    assert keep(_failed_task("RuntimeError('ModelFileError inside the text')"))
    other = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                              "Failed to communicate with scheduler", (), None)
    assert keep(other)


def test_the_filter_is_installed_once():
    logger = logging.getLogger("distributed.worker")
    before = list(logger.filters)
    try:
        quiet_user_errors()
        quiet_user_errors()
        assert sum(isinstance(f, UserErrorFilter) for f in logger.filters) == 1
    finally:
        logger.filters[:] = before
