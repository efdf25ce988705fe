"""SLURM fixtures: tests marked ``slurm`` skip with the reason when no controller answers
(`bash cluster/local-slurm.sh up` starts one), and fail if they leave a job behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from simpipe.cluster import slurm

from cluster_helpers import wait_no_jobs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_controller() -> None:
    problem = slurm.controller_problem(timeout=10)
    if problem:
        pytest.skip(f"no SLURM controller ({problem}); run `bash cluster/local-slurm.sh up`")


@pytest.fixture
def simpipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SIMPIPE_HOME", str(home))
    return home


@pytest.fixture
def no_jobs_left(slurm_controller: None) -> Iterator[None]:
    """Every simpipe job a test starts is gone after it (cancelled here if not)."""
    yield
    left = wait_no_jobs("simpipe-", 30)
    if left:
        slurm.cancel(left)
        pytest.fail(f"SLURM jobs left behind: {left}")
