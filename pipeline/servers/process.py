"""A local server as a child process: the one launcher of the servers simpipe runs on this
machine (the embedded llama.cpp server, the stub server, the GPU emulator).

Each of them prints one line on stdout once it answers: its ready marker, then the URL(s) it
listens on. Asked for port 0 it binds free ports itself and the line says which, so no
launcher races another process for a port. ``ServerProcess`` starts the command, waits for
that line (failing at once when the process exits, or after ``start_timeout_s``), and stops
it on exit: SIGTERM, then SIGKILL after ``stop_timeout_s``.

    with StubProcess() as stub:  # a subclass that knows its command
        use(stub.url)
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import IO, Self

from simpipe.core.errors import SimpipeError


class ServerStartError(SimpipeError, RuntimeError):
    """The server process exited or stayed silent past its start-up timeout."""


class ServerProcess:
    """``command`` as a child process, ready once it printed ``ready`` and its URLs."""

    def __init__(self, command: Sequence[str], ready: str, *, name: str,
                 start_timeout_s: float = 60.0, stop_timeout_s: float = 30.0,
                 stderr: int | IO | None = None) -> None:
        self.command = list(command)
        self.ready = ready
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.stderr = stderr  # None: this process's stderr (the server's own log)
        self.proc: subprocess.Popen | None = None
        self.urls: list[str] = []

    @property
    def url(self) -> str:
        """The first (for most servers the only) URL it listens on."""
        return self.urls[0]

    def start(self) -> Self:
        """Start it and wait until it is ready; ServerStartError (process gone) otherwise."""
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self.stderr,
                                     stdin=subprocess.DEVNULL, text=True)
        line, why = self._first_line(self.proc)
        marker, _, urls = line.partition(self.ready)
        if why is None and (marker or not urls.split()):
            why = "printed something else first"
        if why is not None:
            self.kill()
            raise ServerStartError(f"{self.name} {why} (first line: {line.strip()!r}; "
                                   f"command: {' '.join(self.command)})")
        self.urls = urls.split()
        return self

    def _first_line(self, proc: subprocess.Popen) -> tuple[str, str | None]:
        """The first line on stdout, and why the server is not ready if that is known."""
        # Read in a thread, so that a server silent on stdout cannot hang the caller past
        # the timeout; killing the server then ends the read.
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if reader.is_alive():
            self.kill()
            reader.join()
            return "", f"was not ready within {self.start_timeout_s:g} s"
        line = out[0] if out else ""
        if not line:  # stdout closed: the process is ending
            try:
                return "", f"exited with status {proc.wait(timeout=self.stop_timeout_s)}"
            except subprocess.TimeoutExpired:
                return "", "closed its stdout"
        return line, None

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-request, as a crashed node would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (the servers shut down cleanly on it), SIGKILL if that takes too long."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> Self:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
