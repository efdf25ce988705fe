"""Hostile files (docs/security.md, "Hostile files"): a run.json, a population spec or a
cluster state file that is not what simpipe writes (a forged count, a symlink to a device, a
FIFO) ends in one line at once, never in gigabytes or a hang.

Each command runs in a process of its own under a 2 GiB address-space limit and a timeout,
so a regression fails (a MemoryError traceback, a timeout) instead of taking the machine.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpipe.core.records import CorruptFile, read_bounded
from simpipe.run.population import read_population_spec
from simpipe.store.record import read_ledger

from support import REPO, one_error_line, small_config

LIMIT = 2 * 2**30  # `simpipe report` of a small run needs well under 1 GiB of address space
BILLION = 10**9


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """``simpipe ARGS`` with bounded memory; TimeoutExpired (the child killed) if it hangs."""
    return subprocess.run([sys.executable, "-m", "simpipe.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=timeout, preexec_fn=_limited)


@pytest.fixture(scope="module")
def results(tmp_path_factory, dask_client) -> Path:
    """A results root holding one small finished run, ``good``."""
    from simpipe.run.console import Console
    from simpipe.run.simulation import run_simulation

    root = tmp_path_factory.mktemp("hostile")
    config = small_config(root, run={"name": "good"}, population={"size": 300, "partitions": 3},
                          game={"rounds": 2})
    run_simulation(config, client=dask_client, console=Console(quiet=True))
    return root / "results"


def forged_copy(results: Path, name: str, **fields: object) -> Path:
    """A copy of the good run whose run.json has ``fields`` replaced."""
    run = results / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(results / "good", run)
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, **fields}))
    return run


def hostile_run_json(results: Path, name: str, kind: str) -> Path:
    """A copy of the good run whose run.json is a FIFO or a symlink to /dev/zero."""
    run = forged_copy(results, name)
    (run / "run.json").unlink()
    if kind == "fifo":
        os.mkfifo(run / "run.json")
    else:
        (run / "run.json").symlink_to("/dev/zero")
    return run


# --- a forged count ---------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_report_of_a_run_json_with_a_billion_partitions_is_one_line(results):
    # Before: partition bounds for 10**9 partitions (7.5 GiB for the first array, 20 GB in
    # all); here a MemoryError traceback under the limit.
    run = forged_copy(results, "billion", n_agents=BILLION, n_partitions=BILLION)
    line = one_error_line(cli("report", str(run), "--quiet"))
    assert line.startswith(f"error: {run / 'run.json'}: n_agents: input should be less than "
                           "or equal to 999999999 (found 1000000000)")
    assert line.endswith("restore it from a copy")
    assert not (run / "report").exists()


def test_counts_beyond_what_a_run_can_have_are_refused_naming_the_field(tmp_path):
    good = json.loads((REPO / "tests/data/run_json_previous.json").read_text())
    path = tmp_path / "run.json"
    for fields, problem in (
            ({"n_partitions": 20_000, "n_agents": 10**6},
             "n_partitions: input should be less than or equal to 10000 (found 20000)"),
            ({"n_partitions": 400, "n_agents": 300},
             "n_partitions = 400 is more than n_agents = 300"),
            ({"rounds_total": 10**12}, "rounds_total: input should be less than or equal to")):
        path.write_text(json.dumps({**good, **fields}))
        with pytest.raises(CorruptFile) as err:
            read_ledger(path)
        assert err.value.path == path and err.value.problem.startswith(problem), fields


# --- a symlink to a device, a FIFO -------------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind, what", [("devzero", "a character device"),
                                        ("fifo", "a named pipe (FIFO)")])
def test_show_of_a_run_json_that_is_not_a_regular_file_errors_at_once(results, kind, what):
    # Before: /dev/zero was read until memory ran out (10 GB); a FIFO hung `show` forever.
    run = hostile_run_json(results, f"show-{kind}", kind)
    try:
        line = one_error_line(cli("show", str(run), timeout=30))
    finally:
        shutil.rmtree(run)
    assert line == (f"error: {run / 'run.json'}: not a regular file ({what}); restore it from "
                    "a copy (it records the run's config and rounds)")


@pytest.mark.timeout(90)
def test_resume_of_a_run_whose_run_json_is_a_fifo_is_one_line(results, tmp_path):
    run = hostile_run_json(results, "resume-fifo", "fifo")
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nname = "resume-fifo"\noutput_dir = "{results}"\n'
                      '[population]\nsize = 300\npartitions = 3\n[game]\nrounds = 2\n'
                      '[cluster]\nkind = "local"\nworkers = 1\ndashboard_address = ""\n')
    try:
        line = one_error_line(cli("run", str(config), "--resume", timeout=60))
    finally:
        shutil.rmtree(run)
    assert "run.json: not a regular file (a named pipe (FIFO)); restore it" in line


def test_the_bounded_reader_refuses_what_is_not_a_small_regular_file(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 101)
    ok = tmp_path / "ok.json"
    ok.write_text("{}")
    ok_link = tmp_path / "ok-link.json"
    ok_link.symlink_to(ok)
    for path, problem in ((fifo, "not a regular file (a named pipe (FIFO))"),
                          (link, "not a regular file (a character device)"),
                          (tmp_path, "not a regular file (a directory)"),
                          (big, "101 bytes, more than such a file holds (100)"),
                          (tmp_path / "none.json", "missing")):
        with pytest.raises(CorruptFile) as err:
            read_bounded(path, 100)
        assert err.value.problem == problem, path
    assert read_bounded(ok_link, 100) == b"{}"  # a link to a regular file is fine


# --- the population spec ------------------------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind, problem", [
    ("fifo", "not a regular file (a named pipe (FIFO))"),
    ("forged", "n_partitions: input should be less than or equal to 10000"),
])
def test_population_show_of_a_hostile_spec_is_one_line(results, kind, problem):
    pop = results / f"pop-{kind}"
    pop.mkdir()
    spec = pop / "_population.json"
    try:
        if kind == "fifo":
            os.mkfifo(spec)
        else:
            real = json.loads((results / "good/population/_population.json").read_text())
            spec.write_text(json.dumps({**real, "n_partitions": BILLION}))
        line = one_error_line(cli("population", "show", str(pop), timeout=30))
    finally:
        shutil.rmtree(pop)
    assert line.startswith(f"error: {spec}: not a population spec this version reads "
                           f"({problem}")


def test_the_population_spec_a_build_writes_reads_back(results):
    spec = read_population_spec(results / "good/population/_population.json")
    assert (spec.n_agents, spec.n_partitions) == (300, 3)


# --- cluster state files ----------------------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("fifo", ["state", "section"])
def test_cluster_status_with_a_fifo_state_file_does_not_hang(tmp_path, fifo):
    # Before: `simpipe cluster status NAME` blocked forever opening the FIFO.
    clusters = tmp_path / "home" / "clusters"
    (clusters / "c1").mkdir(parents=True)
    state, section = clusters / "c1.json", clusters / "c1" / "cluster.json"
    if fifo == "state":
        os.mkfifo(state)
    else:
        state.write_text(json.dumps({"state": "failed", "error": "boom"}))
        os.mkfifo(section)
    env = {**os.environ, "SIMPIPE_HOME": str(tmp_path / "home")}
    line = one_error_line(cli("cluster", "status", "c1", env=env, timeout=30))
    hostile = state if fifo == "state" else section
    assert line.startswith(f"error: {hostile}: not a regular file (a named pipe (FIFO)); ")
    assert "simpipe cluster down c1" in line


@pytest.fixture
def ui(results, tmp_path):
    """`simpipe ui` in a process of its own (bounded memory) over the results root, with a
    FIFO among the cluster state files; yields (port, process)."""
    forged_copy(results, "billion-ui", n_agents=BILLION, n_partitions=BILLION)
    clusters = tmp_path / "home" / "clusters"
    clusters.mkdir(parents=True)
    os.mkfifo(clusters / "piped.json")
    (clusters / "fine.json").write_text(json.dumps({"state": "failed", "error": "boom"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SIMPIPE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "simpipe.cli", "ui", "--port", str(port),
                             "--results", str(results)], env=env, preexec_fn=_limited,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        shutil.rmtree(results / "billion-ui")


def _json(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)  # a hang fails
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_ui_run_page_of_a_billion_partitions_run_is_broken_not_500(ui):
    # Before: the run page computed bounds for 10**9 partitions: 500 (and 20 GB).
    port, _ = ui
    status, run = _json(port, "/api/runs/billion-ui")
    assert status == 200 and run["state"] == "broken"
    assert run["problem"].startswith("run.json: n_agents: input should be less than or equal")
    status, data = _json(port, "/api/runs")
    rows = {r["name"]: r for r in data["runs"]}
    assert status == 200 and rows["billion-ui"]["state"] == "broken"
    assert rows["good"]["state"] == "finished"  # the others still list


@pytest.mark.timeout(120)
def test_ui_cluster_list_with_a_fifo_state_file_answers_and_stops_on_sigterm(ui):
    # Before: /api/clusters hung on the FIFO, and the UI then ignored SIGTERM.
    port, proc = ui
    status, data = _json(port, "/api/clusters")
    rows = {c["name"]: c for c in data["clusters"]}
    assert status == 200 and rows["fine"]["state"] == "failed"
    assert rows["piped"]["state"] == "broken"
    assert rows["piped"]["problem"] == ("state file piped.json: not a regular file "
                                        "(a named pipe (FIFO))")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) is not None
