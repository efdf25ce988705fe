"""Serve a GGUF model over llama.cpp's OpenAI-compatible HTTP API (xllamacpp).

    python -m simpipe.servers.llamacpp_server [--model PATH] [--host 127.0.0.1]
        [--port N] [--parallel 4] [--ctx N] [--threads N]

Routes: /v1/completions, /v1/chat/completions, /health, /v1/models (and the rest of
llama.cpp's server). Prints ``simpipe-llamacpp-server listening on http://HOST:PORT``
once /health answers 200 (``--port 0``: a free port, the one printed), then serves until
SIGTERM or SIGINT. Lets the ``openai`` back-end and its tests run against a real server
without a llama.cpp build; ``LlamaCppProcess`` starts it from Python.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from simpipe.core.errors import SimpipeError
from simpipe.inference.llamacpp.engine_setup import build_has_llguidance, build_params, open_engine
from simpipe.inference.llamacpp.model_files import engine_model_path
from simpipe.servers.process import ServerProcess

READY_LINE = "simpipe-llamacpp-server listening on"
#: Slots (sequences decoded together) when ``--parallel`` is not given.
DEFAULT_PARALLEL = 4


class LlamaCppProcess(ServerProcess):
    """This server in a child process, on a free port:
    ``with LlamaCppProcess(parallel=4) as server: server.url``."""

    def __init__(self, *, parallel: int = DEFAULT_PARALLEL, model: str | Path | None = None,
                 port: int = 0, threads: int = 0, start_timeout_s: float = 300.0) -> None:
        command = [sys.executable, "-m", "simpipe.servers.llamacpp_server",
                   "--port", str(port), "--parallel", str(parallel), "--threads", str(threads)]
        if model is not None:
            command += ["--model", str(model)]
        # llama.cpp logs every request on stderr: kept off the caller's terminal.
        super().__init__(command, READY_LINE, name="llama.cpp server",
                         start_timeout_s=start_timeout_s, stderr=subprocess.DEVNULL)


def _parser(exit_on_error: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m simpipe.servers.llamacpp_server",
                                 description=__doc__.split("\n\n")[0],
                                 exit_on_error=exit_on_error)
    ap.add_argument("--model", help="GGUF file (default: the Gemma 3 270M model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--parallel", "-np", type=int, default=DEFAULT_PARALLEL,
                    help="slots decoded together")
    ap.add_argument("--ctx", type=int, default=0, help="KV tokens in all (0: 512 per slot)")
    ap.add_argument("--threads", type=int, default=0, help="0: every core available")
    return ap


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return _parser().parse_args(argv)


def slots_of(args: list[str]) -> int | None:
    """The slots a server started with these extra arguments has, read by the server's own
    parser (``cluster.servers.extra_args``: the last ``--parallel`` wins, as when it starts);
    None when the arguments are not ones it would start with."""
    try:
        known, _ = _parser(exit_on_error=False).parse_known_args(args)
    except argparse.ArgumentError:  # "--parallel x", or "--parallel" with no value
        return None
    return known.parallel if known.parallel >= 1 else None


def takes_llguidance() -> bool:
    """Whether this server, started from this install, takes answer grammars in llguidance's
    form: its engine's build does (PyPI's wheel; not one from ``simpipe engine build``,
    which compiles without llguidance). False where this machine cannot load the engine."""
    try:
        return build_has_llguidance()
    except SimpipeError:  # an engine built for another CPU: the run itself says so
        return False


def _wait_healthy(url: str, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass  # still loading (503) or not listening yet
        time.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM / SIGINT; the exit status."""
    args = _parse_args(argv)
    stop = threading.Event()
    # Installed before the model loads so a SIGTERM during loading still exits cleanly;
    # xllamacpp itself installs no process-wide signal handlers.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    model = args.model or str(engine_model_path())
    params = build_params(model, n_parallel=args.parallel, n_ctx=args.ctx,
                          threads=args.threads, host=args.host, port=args.port)
    try:
        server = open_engine(params)  # loads the model, then listens
    except RuntimeError as exc:
        print(f"simpipe-llamacpp-server: could not start ({exc}); see the llama.cpp log "
              "above (model path, port in use?)", file=sys.stderr)
        return 1

    bound = urlsplit(server.listening_address)
    # A wildcard bind is reached through loopback for the health check.
    probe_host = "127.0.0.1" if bound.hostname in ("0.0.0.0", "::", None) else bound.hostname
    if ":" in probe_host:
        probe_host = f"[{probe_host}]"
    if not _wait_healthy(f"http://{probe_host}:{bound.port}/health"):
        print("simpipe-llamacpp-server: /health never answered 200", file=sys.stderr)
        return 1
    print(f"{READY_LINE} http://{args.host}:{bound.port}", flush=True)

    while not stop.wait(0.5):
        pass
    del server  # ~Server stops the HTTP listener and the decode loop, frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())
