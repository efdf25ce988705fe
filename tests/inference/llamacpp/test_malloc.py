"""Dask workers start with ``MALLOC_TRIM_THRESHOLD_`` set, which makes every allocation
over 128 KiB an mmap/munmap pair; llama.cpp allocates megabytes per decode step, and in a
worker that cost 15-20% of the engine's throughput. ``tune_malloc`` (run whenever the
engine starts) must undo it inside a real worker."""

from __future__ import annotations

import logging
import resource
import sys

import pytest
from distributed import Client, LocalCluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")


def _page_faults_per_buffer(n: int = 20, size: int = 3 * 2**20) -> float:
    """Minor page faults per ``size``-byte buffer allocated, touched and freed."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        buf = bytearray(size)  # zero-filled: every page is touched
        del buf
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n


def _in_worker() -> tuple[str | None, float, bool, float]:
    import os

    from simpipe.inference.llamacpp.engine_setup import tune_malloc

    _page_faults_per_buffer(2)
    untuned = _page_faults_per_buffer()
    took = tune_malloc()
    _page_faults_per_buffer(2)  # the first buffers grow the heap once
    return os.environ.get("MALLOC_TRIM_THRESHOLD_"), untuned, took, _page_faults_per_buffer()


def test_engine_start_stops_large_buffers_faulting_in_a_dask_worker():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            env, untuned, took, tuned = next(iter(client.run(_in_worker).values()))
    assert env is not None  # the nanny's setting this guards against is still there
    pages = 3 * 2**20 // resource.getpagesize()
    assert untuned >= pages * 0.9  # a fresh mmap per buffer: every page faults
    assert took and tuned < pages * 0.05  # reused heap: (almost) no faults
