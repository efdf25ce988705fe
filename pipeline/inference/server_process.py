"""Start the embedded engine's HTTP server (``python -m simpipe.inference.llamacpp_server``)
as a child process and wait until it answers: used by ``simpipe bench engine``, the
tests and anyone who wants an OpenAI-compatible llama.cpp endpoint on this machine."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

READY = "simpipe-llamacpp-server listening on"


class ServerStartError(RuntimeError):
    """The server process exited or stayed silent past the start-up timeout."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``with ServerProcess(parallel=4) as server: server.url`` — stopped on exit."""

    def __init__(self, *, parallel: int = 4, model: str | Path | None = None,
                 port: int | None = None, start_timeout_s: float = 300.0) -> None:
        self.port = port or free_port()
        args = [sys.executable, "-m", "simpipe.inference.llamacpp_server",
                "--port", str(self.port), "--parallel", str(parallel)]
        if model is not None:
            args += ["--model", str(model)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        line = self._first_line(start_timeout_s)
        if READY not in line:
            self.kill()
            raise ServerStartError(
                f"llama.cpp server on port {self.port} did not become healthy within "
                f"{start_timeout_s:.0f} s (first line: {line!r})")
        self.url = line.split()[-1].strip()

    def _first_line(self, timeout_s: float) -> str:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout_s)
        return out[0] if out else ""

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-request, as a crashed node would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
