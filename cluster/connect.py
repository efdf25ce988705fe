"""One entry point from a ``[cluster]`` section to a connected Dask client."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client, LocalCluster

from simpipe.cluster.config import ClusterConfig


class ClusterError(RuntimeError):
    """The cluster could not be started or reached; the message says how to fix it."""


@contextmanager
def make_client(config: ClusterConfig) -> Iterator[Client]:
    """A client for the configured cluster, closed (and a local cluster shut down) on exit."""
    if config.kind == "address":
        try:
            client = Client(config.address, timeout="20s")
        except OSError as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at cluster.address = {config.address!r} "
                f"({exc}); start it (`dask scheduler`) or fix the address"
            ) from exc
        with client:
            yield client
        return
    cluster = LocalCluster(
        n_workers=config.workers,
        threads_per_worker=config.threads_per_worker,
        processes=True,
        memory_limit=config.memory_limit,
        dashboard_address=config.dashboard_address or None,
        silence_logs=logging.ERROR,
    )
    with cluster, Client(cluster) as client:
        yield client
