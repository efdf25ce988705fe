"""Shared fixtures: one real Dask LocalCluster for the module-level pipeline tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from simpipe.config import Config, config_from_dict

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            yield client


def small_config(tmp_path: Path, **sections: dict) -> Config:
    """A small scripted run under tmp_path; keyword sections override the defaults."""
    raw: dict = {
        "run": {"name": "t", "seed": 3, "output_dir": str(tmp_path / "results")},
        "population": {
            "size": 600, "partitions": 4,
            "attributes": {
                "education": {"values": {"High School": 1, "Bachelor's Degree": 1, "Ph.D.": 1}},
                "age": {"min": 18, "max": 80},
            },
        },
        "game": {"rounds": 3},
        "agents": {"backend": "scripted"},
        "cluster": {"kind": "local", "workers": 2, "dashboard_address": ""},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)
