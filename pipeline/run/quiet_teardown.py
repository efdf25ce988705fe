"""After Ctrl-C, the cluster's teardown stays off the terminal.

A Ctrl-C reaches the client's main thread while dask's event loop runs in another thread;
closing the cluster under that loop (its comms closed, its callbacks cancelled) can make
the loop log a traceback ("Exception in callback ..." from tornado, closed-comm errors from
distributed) after the user was promised one line and exit status 130. Those logs are
silenced from the interrupt until the teardown is over, then put back as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

#: The loggers (and their children) that speak while a cluster is torn down.
TEARDOWN_LOGGERS = ("distributed", "tornado", "asyncio")


class QuietTeardown:
    """``with QuietTeardown() as quiet, make_cluster() as c, quiet.after_interrupt(): ...``:
    a KeyboardInterrupt inside silences the teardown loggers while ``make_cluster`` exits;
    leaving the outer ``with`` restores their levels."""

    def __init__(self) -> None:
        self.saved: dict[str, int] = {}

    def __enter__(self) -> QuietTeardown:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for name, level in self.saved.items():
            logging.getLogger(name).setLevel(level)
        self.saved.clear()

    @contextmanager
    def after_interrupt(self) -> Iterator[None]:
        try:
            yield
        except KeyboardInterrupt:
            self.silence()
            raise

    def silence(self) -> None:
        names = [name for name in list(logging.root.manager.loggerDict)
                 if any(name == p or name.startswith(p + ".") for p in TEARDOWN_LOGGERS)]
        for name in {*TEARDOWN_LOGGERS, *names}:
            logger = logging.getLogger(name)
            self.saved.setdefault(name, logger.level)
            logger.setLevel(logging.CRITICAL + 1)
