"""Shared fixtures: one real Dask LocalCluster for the pipeline tests."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``python -m pytest -n 2``), every test that uses the one-node
    SLURM cluster runs on the same xdist worker, one after another: the node has two CPUs,
    and a test counting its own worker jobs must not see another test's."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm"))


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
