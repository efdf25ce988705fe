"""One process per run folder: run.json names the process that plays the run (pid, host,
start time); while it lives, a second `simpipe run` is refused with `--resume` and with
`--force` alike, and nothing on disk is touched. A dead owner, or a pid now held by a later
process, is taken over."""

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from simpipe.cluster.process_identity import read_identity
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.ledger import RunDirError

from support import small_config

QUIET = Console(quiet=True)


@pytest.fixture
def played(tmp_path, dask_client):
    """The config of a small run, played (run.json is then rewritten as another owner's)."""
    config = small_config(tmp_path, run={"name": "own"},
                          population={"size": 40, "partitions": 2}, game={"rounds": 2})
    run_simulation(config, client=dask_client, console=QUIET)
    return config


def mark_running(run_dir: Path, **owner) -> str:
    """run.json rewritten as a run in progress owned by ``owner``; the new text."""
    ledger = json.loads((run_dir / "run.json").read_text())
    ledger.update(state="running", **owner)
    text = json.dumps(ledger)
    (run_dir / "run.json").write_text(text)
    return text


def test_the_run_records_its_pid_host_and_start_time(tmp_path, dask_client):
    config = small_config(tmp_path, population={"size": 40, "partitions": 2}, game={"rounds": 1})
    run_simulation(config, client=dask_client, console=QUIET)
    ledger = json.loads((config.run_dir / "run.json").read_text())
    me = read_identity(os.getpid())
    assert ledger["pid"] == os.getpid() and ledger["host"] == socket.gethostname()
    assert ledger["pid_start_time"] == me["start_time"]


@pytest.mark.parametrize("flags", [{"resume": True}, {"force": True}, {}],
                         ids=["resume", "force", "plain"])
def test_a_run_whose_owner_lives_is_refused_and_left_alone(played, dask_client,
                                                            bystander, flags):
    run_dir = played.run_dir
    # bystander: a live process of ours, with its real start time: the owner as recorded
    text = mark_running(run_dir, pid=bystander.pid, host=socket.gethostname(),
                        pid_start_time=read_identity(bystander.pid)["start_time"])
    files = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    with pytest.raises(RunDirError) as caught:
        run_simulation(played, client=dask_client, console=QUIET, **flags)
    message = str(caught.value)
    assert "\n" not in message
    assert f"process {bystander.pid}" in message and socket.gethostname() in message
    assert "--resume" in message  # what to do once it has ended
    assert (run_dir / "run.json").read_text() == text
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == files
    assert bystander.poll() is None


@pytest.mark.parametrize("owner", ["dead", "reused"])
def test_a_run_whose_owner_is_gone_is_taken_over(played, dask_client, bystander, owner):
    if owner == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        recorded = {"pid": gone.pid, "pid_start_time": 1}
    else:  # the pid now belongs to a later process: its start time differs
        start = read_identity(bystander.pid)["start_time"]
        recorded = {"pid": bystander.pid, "pid_start_time": start - 1}
    mark_running(played.run_dir, host=socket.gethostname(), **recorded)
    result = run_simulation(played, client=dask_client, console=QUIET, resume=True)
    assert result.state == "finished" and len(result.summary["round"].unique()) == 2
    assert bystander.poll() is None


def test_a_run_owned_on_another_host_needs_force(played, dask_client, bystander):
    run_dir = played.run_dir
    text = mark_running(run_dir, pid=bystander.pid, host="elsewhere.example",
                        pid_start_time=1)
    with pytest.raises(RunDirError) as caught:
        run_simulation(played, client=dask_client, console=QUIET, resume=True)
    message = str(caught.value)
    assert "elsewhere.example" in message and "--force" in message
    assert (run_dir / "run.json").read_text() == text
    result = run_simulation(played, client=dask_client, console=QUIET, force=True)
    assert result.state == "finished"
