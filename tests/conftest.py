"""Shared fixtures: one real Dask LocalCluster for the pipeline tests."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster


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
