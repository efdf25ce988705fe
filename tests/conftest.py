"""Shared fixtures: one real Dask LocalCluster for the pipeline tests."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster

from simpipe.core.files import exclusive_lock


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker runs on cores of its own where there are enough
    (``gw0`` the first share, ``gw1`` the next, ...), else on one core that it shares with
    as few workers as possible, and everything it starts inherits that. llama.cpp sizes its
    thread pool from the cores it may run on, and its threads spin-wait on each other: two
    workers' models with two threads each on the same two cores stall each other, while
    one-thread models on one shared core just take turns (docs/benchmarks.md, "The test
    suite")."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker[2:])
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[index::count])
    else:
        os.sched_setaffinity(0, [cores[index % len(cores)]])


@pytest.fixture(autouse=True)
def one_slurm_test_at_a_time(request: pytest.FixtureRequest,
                             tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist, the tests that use the one-node SLURM cluster take turns: the
    node has two CPUs, and a test counting its own worker jobs must not see another test's.
    A lock file in the directory all workers' temporary folders share (xdist's own
    ``xdist_group`` marks do not group tests under pytest 9: they rename a node id attribute
    pytest no longer reads)."""
    if request.node.get_closest_marker("slurm") is None or \
            "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with exclusive_lock(tmp_path_factory.getbasetemp().parent / "slurm.lock"):
        yield


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            yield client


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process of ours that nothing in simpipe started: it must survive what a test does."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()
