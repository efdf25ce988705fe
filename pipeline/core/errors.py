"""The one base class of every error a user can fix, and the exit status each ends with.

``simpipe`` (``simpipe.cli``) catches ``SimpipeError`` once, prints ``cli_lines()`` on
stderr (``error: ...``, one line per line of the message) and exits with ``exit_code``;
nothing else of such an error reaches the terminal, least of all a traceback. A notebook
catches the same class.

Why a module of its own that imports nothing: the dependency direction is pipeline ->
games, personas, cluster, never back, yet the cluster's errors (SLURM, servers, state files)
are user errors too. This module is the one piece of the pipeline package every package may
import (``IMPORTABLE_EVERYWHERE``; the import-direction test allows exactly it), so it must
stay free of imports from simpipe.
"""

from __future__ import annotations

#: The dotted name of this module: the one ``simpipe.*`` module that ``simpipe.games``,
#: ``simpipe.personas`` and ``simpipe.cluster`` may import (it imports nothing of simpipe).
IMPORTABLE_EVERYWHERE = __name__

EXIT_USAGE = 2  # a config, a file or an option the user can fix; click uses 2 for its own
EXIT_CANCELLED = 3  # a run stopped by its CANCEL file: resumable
EXIT_ANSWERS_FAILED = 4  # a run played to the end whose every answer is an error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM (scancel, timeout, kill): what a shell reports


class SimpipeError(Exception):
    """A problem the message explains and says how to fix; ``str(err)`` is ready to print,
    one line per problem."""

    exit_code: int = EXIT_USAGE

    def cli_lines(self) -> list[str]:
        """What the command line prints on stderr for it."""
        return [f"error: {line}" for line in (str(self) or type(self).__name__).splitlines()]


class RunInterrupted(SimpipeError):
    """Ctrl-C stopped a run; it is marked interrupted and resumable. The message is the
    command that resumes it, printed as it is: the user pressed the key, nothing went wrong."""

    exit_code = EXIT_INTERRUPTED

    def cli_lines(self) -> list[str]:
        return str(self).splitlines()


class RunTerminated(RunInterrupted):
    """SIGTERM stopped a run (scancel, a time limit, ``timeout``); marked interrupted and
    resumable, as after Ctrl-C."""

    exit_code = EXIT_TERMINATED


class AnswersFailed(SimpipeError):
    """A run played to its end, but every agent's answer is an error (no server answered,
    every request refused): its results hold nothing but the reasons."""

    exit_code = EXIT_ANSWERS_FAILED
