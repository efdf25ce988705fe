"""The README's test command runs two xdist workers (`python -m pytest -n 2`): each must run
on cores of its own, and so must everything it starts, or the real-model tests of the two
workers stall each other (llama.cpp's threads spin-wait; tests/conftest.py pins them)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from simpipe.inference.llamacpp.engine_setup import default_threads


def test_each_xdist_worker_runs_on_cores_no_other_worker_has():
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("one process (no -n): there is no other worker to share cores with")
    count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    mine = sorted(os.sched_getaffinity(0))
    siblings = _other_workers()
    assert len(siblings) == count - 1, siblings  # the controller started them all
    for pid in siblings:
        theirs = os.sched_getaffinity(pid)
        if len(os.sched_getaffinity(os.getppid())) >= count:
            assert not theirs & set(mine), (pid, theirs, mine)
        else:  # fewer cores than workers: one core each, shared by as few as possible
            assert len(theirs) == len(mine) == 1
    # What a test starts inherits the cores, and the embedded model sizes its threads by them.
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(mine)
    assert default_threads() == len(mine)


def _other_workers() -> list[int]:
    """The other processes the xdist controller (this worker's parent) started."""
    parent, me, found = os.getppid(), os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent:
            found.append(int(entry))
    return found
