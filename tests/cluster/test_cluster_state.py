"""A persistent cluster's files (``simpipe.cluster.state``): the ``[cluster]`` section it was
started with is read in one place, and a damaged one is an error naming the file wherever
it is needed, never a silent fall-back to default settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.state import (
    StateError,
    read_section,
    read_state,
    section_path,
    state_path,
    write_section,
    write_state,
)
from simpipe.core.home import simpipe_home
from simpipe.run.executor import ClusterExecutor

from support import small_config

READY = {"name": "c", "state": "ready", "scheduler": "tcp://127.0.0.1:1",
         "endpoint_backend": "tgi", "servers": []}


def test_the_section_a_cluster_was_started_with_reads_back(simpipe_home: Path) -> None:
    cluster = SlurmClusterConfig(cores=2, memory="3GiB",
                                 servers={"kind": "emulated", "memory": "1GB"})
    write_section("c", cluster)
    assert read_section("c") == cluster
    assert section_path("c") == simpipe_home / "clusters" / "c" / "cluster.json"
    assert (simpipe_home / "clusters" / "c" / "logs").is_dir()  # the jobs' log folder


@pytest.mark.parametrize(("content", "problem"), [
    (None, "missing"),
    ('{"kind": "slurm", "cores": ', "not the [cluster] section of a SLURM cluster"),
    ('{"kind": "slurm", "cores": "many"}', "cores: Input should be a valid integer"),
    ('{"kind": "local"}', "kind: Input should be 'slurm'"),
])
def test_a_damaged_section_is_an_error_naming_the_file(
        simpipe_home: Path, content: str | None, problem: str) -> None:
    path = section_path("c")
    path.parent.mkdir(parents=True)
    if content is not None:
        path.write_text(content)
    with pytest.raises(StateError) as err:
        read_section("c")
    assert str(err.value).startswith(f"{path}: ")
    assert problem in str(err.value)
    assert "simpipe cluster down c" in str(err.value)


@pytest.mark.parametrize(("content", "problem"), [
    ('{"state": "ready", "scheduler": ', "not valid JSON"),
    ('["ready"]', "a JSON array, expected an object"),
    ('{"state": "ready", "manager_pid": "12"}', "manager_pid: input should be a valid integer"),
    ('{"state": "ready", "servers": [{"url": "http://x"}]}', "servers.0.index: field required"),
    ('{"state": "up"}', "state: input should be 'starting', 'ready'"),  # not a ClusterState
])
def test_a_damaged_state_file_is_an_error_naming_the_file_and_the_field(
        simpipe_home: Path, content: str, problem: str) -> None:
    """The commands read a state file with the checks the web UI applies (they read it
    unchecked before: a wrong type surfaced later as a traceback)."""
    state_path("c").parent.mkdir(parents=True)
    state_path("c").write_text(content)
    with pytest.raises(StateError) as err:
        read_state("c")
    assert str(err.value).startswith(f"{state_path('c')}: {problem}")
    assert str(err.value).endswith("`simpipe cluster down c` cleans it up")


def test_a_state_file_reads_back_as_written(simpipe_home: Path) -> None:
    write_state("c", READY)
    assert read_state("c") == READY
    with pytest.raises(StateError, match=r"^no cluster named 'd' .*; known: c$"):
        read_state("d")


def test_a_run_on_a_cluster_whose_section_is_damaged_stops_naming_the_file(
        simpipe_home: Path, tmp_path: Path) -> None:
    """Once it fell back to default servers settings: an emulated cluster's run then went
    ahead without --emulate, its emulated answers mixed with real results."""
    write_section("c", SlurmClusterConfig(servers={"kind": "emulated"}))
    write_state("c", READY)
    config = small_config(tmp_path)
    with pytest.raises(StateError, match="serves emulated GPUs: add --emulate"):
        ClusterExecutor(config, "c")
    section_path("c").write_text("{")
    with pytest.raises(StateError, match=f"^{section_path('c')}: not the"):
        ClusterExecutor(config, "c")


def test_the_manager_marks_its_cluster_failed_when_the_section_is_damaged(
        simpipe_home: Path) -> None:
    section_path("c").parent.mkdir(parents=True)
    section_path("c").write_text('{"kind": "slurm", "memory": "lots"}')
    proc = subprocess.run([sys.executable, "-m", "simpipe.run.manager", "c"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    state = read_state("c")
    assert state["state"] == "failed"
    assert state["error"].startswith(f"{section_path('c')}: not the [cluster] section")
    assert "memory" in state["error"]
    assert json.loads(section_path("c").read_text())["memory"] == "lots"  # left as it was


@pytest.mark.parametrize(("value", "expected"), [
    (None, "{home}/.simpipe"), ("", "{home}/.simpipe"), ("~/sp", "{home}/sp"), ("/x/y", "/x/y"),
])
def test_simpipe_home_is_read_in_one_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           value: str | None, expected: str) -> None:
    """Clusters and the embedded model share it; an empty value is unset (once the model
    went to ./models of whatever folder a run started in)."""
    from simpipe.inference.llamacpp import model_files as llamacpp

    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("SIMPIPE_HOME", raising=False)
    else:
        monkeypatch.setenv("SIMPIPE_HOME", value)
    home = Path(expected.format(home=tmp_path))
    assert simpipe_home() == home
    assert state_path("c") == home / "clusters" / "c.json"
    assert llamacpp.simpipe_home is simpipe_home
