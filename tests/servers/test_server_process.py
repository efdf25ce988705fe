"""The one launcher of local servers (``simpipe.servers.process``): the stub and the
emulator through it on free ports, and every way a child can fail to start or to stop."""

from __future__ import annotations

import sys
import urllib.request

import pytest

from simpipe.core.errors import SimpipeError
from simpipe.servers.emulator import EmulatorProcess
from simpipe.servers.process import ServerProcess, ServerStartError
from simpipe.servers.stub import StubProcess


def _python(code: str, **options: float) -> ServerProcess:
    return ServerProcess([sys.executable, "-c", code], "READY", name="test server", **options)


def _health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
        return resp.status


def test_servers_on_port_0_say_which_ports_they_took_and_are_gone_after() -> None:
    with StubProcess() as stub, EmulatorProcess(gpus=2) as emu:
        assert [_health(u) for u in [stub.url, *emu.urls]] == [200, 200, 200]
        assert len(set(emu.urls)) == 2 and stub.url not in emu.urls
        assert stub.url.startswith("http://127.0.0.1:") and not stub.url.endswith(":0")
    assert stub.proc.returncode is not None and emu.proc.returncode is not None
    assert stub.proc.stdout.closed


def test_a_server_that_exits_is_an_error_naming_it_with_its_status() -> None:
    with pytest.raises(ServerStartError) as err, EmulatorProcess(profile="h200"):
        pass
    message = str(err.value)
    assert message.startswith("emulator exited with status 2 (first line: '';")
    assert "--profile h200" in message
    assert isinstance(err.value, SimpipeError)  # one line on the command line, no traceback


def test_a_server_that_prints_something_else_first_is_stopped() -> None:
    server = _python("import time; print('loading...', flush=True); time.sleep(60)")
    with pytest.raises(ServerStartError) as err:
        server.start()
    assert str(err.value).startswith(
        "test server printed something else first (first line: 'loading...'; command: ")
    assert server.proc.returncode == -9


def test_a_silent_server_is_killed_at_its_start_timeout() -> None:
    server = _python("import time; time.sleep(60)", start_timeout_s=0.5)
    with pytest.raises(ServerStartError, match="test server was not ready within 0.5 s"):
        server.start()
    assert server.proc.returncode == -9


def test_a_server_that_ignores_sigterm_is_killed_at_its_stop_timeout() -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('READY http://127.0.0.1:1 http://127.0.0.1:2', flush=True); time.sleep(60)")
    with _python(code, stop_timeout_s=0.5) as server:
        assert server.urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        assert server.url == "http://127.0.0.1:1"
    assert server.proc.returncode == -9
