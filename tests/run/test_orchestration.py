"""The Python API orchestrates a run as ``simpipe run`` does: ``run_simulation``'s executor
starts the servers of ``[cluster.servers]`` for the run and stops them at its end, and
``emulate=True`` is ``--emulate``. Here the servers are emulated GPUs as local processes
and the workers are the test session's cluster, reached by address (SLURM server jobs:
tests/cluster/test_run_api.py)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

import simpipe
from simpipe.cluster.config import AddressClusterConfig
from simpipe.core.errors import SimpipeError
from simpipe.run.console import Console
from simpipe.store.results import read_ledger, read_rounds

from support import small_config

pytestmark = pytest.mark.slow


def _emulators() -> list[psutil.Process]:
    """Emulator processes this test process started (any depth)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "simpipe.servers.emulator" in " ".join(p.cmdline())]


def _config(tmp_path: Path, dask_client, **servers):
    config = small_config(tmp_path, population={"size": 60, "partitions": 2},
                          game={"rounds": 1}, agents={"backend": "tgi"})
    return config.with_sections(cluster=AddressClusterConfig(
        address=dask_client.scheduler.address, servers=servers or {}))


def test_run_simulation_starts_the_configured_servers_and_stops_them_at_the_end(
        tmp_path, dask_client, capsys):
    config = _config(tmp_path, dask_client, kind="emulated", per_node=2,
                     emulated={"profile": "fast", "time_scale": 10, "gpus_per_process": 2})
    result = simpipe.run_simulation(config)
    assert "emulated servers ready: 2 on this machine" in capsys.readouterr().out
    assert _emulators() == []
    rounds = read_rounds(result.run_dir)
    assert len(rounds) == 60 and (rounds["status"] == "ok").all()
    ledger = read_ledger(result.run_dir)
    endpoints = ledger.endpoints
    assert len(endpoints) == 2 and all(c["requests"] > 0 for c in endpoints.values())
    # The endpoints the run used are the started servers', not the config's default.
    assert sorted(ledger.section("agents")["tgi"]["endpoints"]) == sorted(endpoints)
    assert ledger.estimate["servers"] == 2


def test_emulate_true_is_the_dry_run_of_simpipe_run_emulate(tmp_path, dask_client, capsys):
    config = _config(tmp_path, dask_client)  # one TGI endpoint, no servers configured
    result = simpipe.run_simulation(config, emulate=True)
    out = capsys.readouterr().out
    assert "--emulate: 1 emulated a100-llama3-8b GPU server(s) with TGI routes" in out
    assert result.run_dir == config.run_dir.with_name(f"{config.run.name}-emulated")
    assert not config.run_dir.exists()
    assert _emulators() == []
    assert (read_rounds(result.run_dir)["status"] == "ok").all()
    assert read_ledger(result.run_dir).estimate["servers"] == 1


def test_own_client_and_started_servers_are_refused_together(tmp_path, dask_client):
    config = small_config(tmp_path)
    with pytest.raises(SimpipeError, match="client= says where the run executes, which "
                                           "emulate= would replace"):
        simpipe.run_simulation(config, client=dask_client, emulate=True,
                               console=Console(quiet=True))
    assert not config.run_dir.exists()
