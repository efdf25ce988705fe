"""Peak memory of a small run (``simpipe run``: the CLI process and its Dask worker
processes) against a hostile TGI server stays within 200 MB of the same run against a
normal one. Without bounds an endless answer grows a worker by gigabytes in seconds.

The peak is the largest sum of RSS over the run's process tree, sampled with psutil. A run
that passes the bound is stopped at once, so a regression fails this test quickly instead
of exhausting a shared machine's memory.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from simpipe.store.results import read_rounds

from hostile_server import (
    HostileServer,
    endless_chunked_body,
    endless_header_value,
    endless_headers,
    tgi_answer,
)

pytestmark = pytest.mark.slow

BOUND = 200 * 2**20
AGENTS = 16
SCENARIOS = {
    "endless chunked body": (endless_chunked_body, "answer larger than 1 MiB"),
    "endless headers": (endless_headers, "answer headers larger than 64 KiB"),
    "one endless header value": (endless_header_value, "answer headers larger than 64 KiB"),
    "10 MB generated_text": (lambda: TEN_MB, "answer larger than 1 MiB"),
}
TEN_MB = tgi_answer("4" + " " * 10_000_000)


def run_config(tmp_path: Path, url: str) -> Path:
    """A small TGI run: the settings the memory blow-up was first reproduced with."""
    path = tmp_path / "run.toml"
    path.write_text(f"""
[run]
name = "memory"
output_dir = "{tmp_path / 'results'}"
[population]
size = {AGENTS}
partitions = 2
[game]
rounds = 1
[agents]
backend = "tgi"
[agents.tgi]
endpoints = ["{url}"]
timeout_s = 3
max_concurrency = 4
backoff_s = 0.01
backoff_max_s = 0.05
[cluster]
kind = "local"
workers = 1
threads_per_worker = 2
dashboard_address = ""
""")
    return path


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def kill_tree(proc: psutil.Process) -> None:
    for p in [*proc.children(recursive=True), proc]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def peak_rss_of_run(tmp_path: Path, answer, limit: int | None = None) -> tuple[int, int]:
    """(peak RSS of the run's process tree, exit code); the run is killed past ``limit``."""
    with HostileServer(answer) as url:
        cmd = [sys.executable, "-m", "simpipe.cli", "run", str(run_config(tmp_path, url))]
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        proc = psutil.Process(child.pid)
        peak = 0
        deadline = time.monotonic() + 300  # a guard against a hung child, not a measurement
        while child.poll() is None:
            try:
                peak = max(peak, tree_rss(proc))
            except psutil.NoSuchProcess:
                break
            if (limit is not None and peak > limit) or time.monotonic() > deadline:
                kill_tree(proc)
                break
            time.sleep(0.01)
        _, stderr = child.communicate(timeout=60)
    print(f"peak RSS {peak / 2**20:.0f} MiB, exit {child.returncode}: {stderr[-300:]!r}")
    return peak, child.returncode


@pytest.fixture(scope="module")
def normal_peak(tmp_path_factory) -> int:
    tmp = tmp_path_factory.mktemp("normal")
    peak, code = peak_rss_of_run(tmp, lambda req: tgi_answer("42"))
    assert code == 0
    rows = read_rounds(tmp / "results" / "memory")
    assert len(rows) == AGENTS and (rows["status"] == "ok").all()
    return peak


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_peak_memory_stays_within_200_mb_of_a_normal_run(tmp_path, normal_peak, scenario):
    stream, reason = SCENARIOS[scenario]
    peak, code = peak_rss_of_run(tmp_path, lambda req: stream(), limit=normal_peak + BOUND)
    print(f"{scenario}: peak {peak / 2**20:.0f} MiB vs normal {normal_peak / 2**20:.0f} MiB")
    assert peak <= normal_peak + BOUND, f"{scenario}: {(peak - normal_peak) / 2**20:.0f} MiB more"
    # Every answer failed: the run ends (no traceback) with the documented exit status 4.
    assert code == 4
    rows = read_rounds(tmp_path / "results" / "memory")
    assert len(rows) == AGENTS and (rows["status"] == "error").all()
    assert rows["error"].str.contains(reason, regex=False).all()
