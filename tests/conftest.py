"""Shared fixtures: one real Dask LocalCluster for the pipeline tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            yield client
