"""After Ctrl-C, the cluster's teardown stays off the terminal.

A Ctrl-C reaches the client's main thread while dask's event loop runs in another thread;
closing the cluster under that loop (its comms closed, its callbacks cancelled) can make
the loop log a traceback ("Exception in callback ..." from tornado, closed-comm errors from
distributed) after the user was promised one line and exit status 130. Those logs are
silenced from the interrupt until the teardown is over, then put back as they were.

From the signal itself, not from where its KeyboardInterrupt is caught: a SIGTERM or Ctrl-C
that lands while the main thread waits in distributed's ``sync`` makes it hand a cancel
callback to the loop thread, which can fail and log ("NameError: cannot access free variable
'future'") before the exception has left ``sync`` (1 of 16 SIGTERMs with four busy loops
beside; it failed a CI run).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

from simpipe.cluster.ctrl_c import silence_teardown_loggers

#: The signals whose Python handler raises an interrupt (Ctrl-C's; SIGTERM's inside
#: ``simpipe.run.sigterm.sigterm_as_interrupt``).
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


class QuietTeardown:
    """``with QuietTeardown() as quiet, make_cluster() as c, quiet.after_interrupt(): ...``:
    a KeyboardInterrupt inside silences the teardown loggers while ``make_cluster`` exits;
    leaving the outer ``with`` restores their levels. Inside (in the main thread), a signal
    whose handler raises the interrupt silences them first."""

    def __init__(self) -> None:
        self.saved: dict[str, int] = {}
        self.handlers: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def __enter__(self) -> QuietTeardown:
        if threading.current_thread() is threading.main_thread():
            for signum in INTERRUPTS:
                handler = signal.getsignal(signum)
                if callable(handler):  # not SIG_DFL or SIG_IGN: Python raises from it
                    self.handlers[signum] = handler
                    signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for signum, handler in self.handlers.items():
            if signal.getsignal(signum) == self._on_signal:  # else its handler changed it
                signal.signal(signum, handler)
        self.handlers.clear()
        for name, level in self.saved.items():
            logging.getLogger(name).setLevel(level)
        self.saved.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> Any:
        self.silence()
        return self.handlers[signum](signum, frame)

    @contextmanager
    def after_interrupt(self) -> Iterator[None]:
        try:
            yield
        except KeyboardInterrupt:
            self.silence()
            raise

    def silence(self) -> None:
        for name, level in silence_teardown_loggers().items():
            self.saved.setdefault(name, level)
