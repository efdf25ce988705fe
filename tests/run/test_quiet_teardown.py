"""After Ctrl-C the cluster's teardown logs nothing; otherwise nothing is silenced."""

from __future__ import annotations

import logging
import signal
from contextlib import contextmanager

import pytest

from simpipe.run.quiet_teardown import QuietTeardown


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def records():
    # On the loggers themselves: distributed's logging config stops them propagating.
    handler = Records()
    names = ("tornado.application", "distributed.comm")
    levels = {n: logging.getLogger(n).level for n in names}
    for name in names:
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("tornado.application").setLevel(logging.ERROR)  # as distributed sets it
    yield handler
    for name, level in levels.items():
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(level)


@contextmanager
def cluster_that_logs_while_closing():
    """Stands for a cluster whose loop thread logs errors while it is torn down."""
    try:
        yield
    finally:
        logging.getLogger("tornado.application").error("Exception in callback <closing>")
        logging.getLogger("distributed.comm").error("Stream is closed")


def test_a_ctrl_c_silences_the_teardown_and_restores_the_levels_after(records):
    with pytest.raises(KeyboardInterrupt):
        with QuietTeardown() as quiet, cluster_that_logs_while_closing(), \
                quiet.after_interrupt():
            raise KeyboardInterrupt
    assert records.messages == []
    assert logging.getLogger("tornado.application").level == logging.ERROR
    logging.getLogger("tornado.application").error("later")
    assert records.messages == ["tornado.application: later"]


def test_without_an_interrupt_the_teardown_logs_as_usual(records):
    with QuietTeardown() as quiet, cluster_that_logs_while_closing(), quiet.after_interrupt():
        pass
    assert records.messages == ["tornado.application: Exception in callback <closing>",
                                "distributed.comm: Stream is closed"]


def test_another_error_is_not_silenced(records):
    with pytest.raises(RuntimeError):
        with QuietTeardown() as quiet, cluster_that_logs_while_closing(), \
                quiet.after_interrupt():
            raise RuntimeError("a real failure")
    assert len(records.messages) == 2


def test_the_signal_itself_silences_before_its_interrupt_is_caught(records):
    # distributed's ``sync`` catches the interrupt and hands a cancel callback to its loop
    # thread, which logged a traceback before the interrupt reached ``after_interrupt``.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with QuietTeardown() as quiet, cluster_that_logs_while_closing(), \
                    quiet.after_interrupt():
                try:
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    logging.getLogger("tornado.application").error("Exception in callback")
                    raise
        assert records.messages == []
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert logging.getLogger("tornado.application").level == logging.ERROR
    finally:
        signal.signal(signal.SIGINT, before)
