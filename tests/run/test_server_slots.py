"""A run that starts llama.cpp servers says, before anything starts, when its connections
would outnumber the servers' slots, and what to set; `simpipe validate` says the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpipe.config.model import Config, config_from_dict
from simpipe.run.executor import Executor
from simpipe.run.server_slots import connections_that_fit, oversubscribed_slots
from simpipe.servers.llamacpp_server import DEFAULT_PARALLEL, slots_of

from support import SCRIPTED, simpipe_cli, small_config


def config_on_slurm(tmp_path: Path, servers: dict, cluster: dict | None = None,
              openai: dict | None = None) -> Config:
    """A small run whose agents are answered by the servers it starts as SLURM jobs."""
    config = small_config(tmp_path, agents={"backend": "openai", "openai": openai or {}})
    raw = config.model_dump(mode="json")
    raw["cluster"] = {"kind": "slurm", "interface": "lo", "dashboard_address": "",
                      "servers": servers, **(cluster or {})}
    return config_from_dict(raw)


def served_by_llamacpp(tmp_path: Path, servers: dict | None = None, cluster: dict | None = None,
            openai: dict | None = None) -> Config:
    """Agents answered by the llama.cpp servers the run starts."""
    return config_on_slurm(tmp_path, {"kind": "llamacpp", **(servers or {})}, cluster, openai)


def test_slots_are_read_by_the_servers_own_parser() -> None:
    assert slots_of([]) == DEFAULT_PARALLEL == 4
    assert slots_of(["--parallel", "8"]) == 8
    assert slots_of(["--ctx", "2048", "-np", "3"]) == 3
    assert slots_of(["--parallel=6", "--unknown-flag", "x"]) == 6
    assert slots_of(["--parallel", "2", "--parallel", "5"]) == 5  # the last one starts it
    assert slots_of(["--parallel", "many"]) is None
    assert slots_of(["--parallel", "0"]) is None


def test_connections_that_fit_fill_the_slots_and_no_more() -> None:
    assert connections_that_fit(8, 2) == 4
    assert connections_that_fit(4, 3) == 1
    assert connections_that_fit(4, 8) == 1  # never 0: a process needs one connection
    assert connections_that_fit(32, 1) == 32


def test_the_default_concurrency_to_llamacpp_servers_is_named_with_its_fix(
        tmp_path: Path) -> None:
    # Two worker jobs of one process, 64 connections each, to servers of 4 slots.
    warning = oversubscribed_slots(served_by_llamacpp(tmp_path, cluster={"jobs": 2}))
    assert warning is not None
    assert "agents.openai.max_concurrency = 64 with up to 2 worker processes" in warning
    assert "128 connections" in warning and "decodes 4 requests at a time" in warning
    assert warning.endswith("set agents.openai.max_concurrency = 2")
    # The fix it names is silent.
    assert oversubscribed_slots(served_by_llamacpp(tmp_path, cluster={"jobs": 2},
                                        openai={"max_concurrency": 2})) is None
    # So is a server started with enough slots for the connections.
    assert oversubscribed_slots(served_by_llamacpp(tmp_path, cluster={"jobs": 2},
                                        servers={"extra_args": "--parallel 128"})) is None


def test_worker_processes_are_counted_at_their_most(tmp_path: Path) -> None:
    # adapt: the most jobs it may start; processes: per job.
    warning = oversubscribed_slots(served_by_llamacpp(
        tmp_path, cluster={"adapt": {"minimum": 0, "maximum": 3}, "processes": 2, "cores": 2},
        servers={"extra_args": "--parallel 12"}))
    assert warning is not None and "up to 6 worker processes" in warning
    assert warning.endswith("set agents.openai.max_concurrency = 2")
    # More processes than slots: one connection each still waits; a slot each is the fix.
    warning = oversubscribed_slots(served_by_llamacpp(tmp_path, cluster={"jobs": 6},
                                           openai={"max_concurrency": 1}))
    assert warning is not None and "6 connections" in warning
    assert "set agents.openai.max_concurrency = 1 and `--parallel 6`" in warning


@pytest.mark.parametrize("servers", [
    {"kind": "llamacpp", "command": "my-server --port {port}"},  # its slots are its own
    {"kind": "llamacpp", "extra_args": "--parallel 'unclosed"},  # the job would not start
    {"kind": "vllm", "model": "m"},  # batches whatever arrives
])
def test_servers_whose_slots_are_not_known_get_no_warning(tmp_path: Path,
                                                          servers: dict) -> None:
    assert oversubscribed_slots(config_on_slurm(tmp_path, servers, {"jobs": 4})) is None


def test_a_run_says_it_before_anything_starts(tmp_path: Path) -> None:
    said: list[str] = []
    # constraint "lark": the grammar's own warning (test_server_grammar.py) stays out.
    config = served_by_llamacpp(tmp_path, cluster={"jobs": 2}, openai={"constraint": "lark"})
    Executor(config, say=said.append)  # starts nothing
    assert [line for line in said if line.startswith("warning: ")] == [
        f"warning: {oversubscribed_slots(config)}"]


#: The scripted example, its agents answered by two single-process worker jobs through
#: llama.cpp servers of 8 slots.
SERVED = ("--set", "agents.backend=openai", "--set", 'cluster={kind="slurm", jobs=2, '
          'interface="lo", servers={kind="llamacpp", extra_args="--parallel 8"}}')


def validate_warnings(*overrides: str) -> list[str]:
    """The warnings `simpipe validate` prints for the scripted example with ``overrides``."""
    proc = simpipe_cli("validate", str(SCRIPTED), *overrides)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("warning: ")]


def test_validate_says_it() -> None:
    # 2 x 64 connections to each server; constraint "lark" keeps the grammar's warning out.
    served = (*SERVED, "--set", 'agents.openai.constraint="lark"')
    warnings = validate_warnings(*served)
    assert len(warnings) == 1 and "128 connections" in warnings[0]
    assert warnings[0].endswith("set agents.openai.max_concurrency = 4")
    assert validate_warnings(*served, "--set", "agents.openai.max_concurrency=4") == []
