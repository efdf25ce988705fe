"""Helpers shared by the SLURM tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def our_jobs(prefix: str) -> list[str]:
    """Job ids whose name starts with ``prefix``, submitted from this checkout: other
    checkouts' test runs may share the SLURM, and their jobs are neither counted nor
    cancelled here (the tests submit from the repository root)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i\t%j\t%Z"], capture_output=True,
                         text=True, check=False).stdout
    ids = []
    for line in out.splitlines():
        job_id, name, workdir = (line.split("\t") + ["", ""])[:3]
        if name.startswith(prefix) and Path(workdir).resolve().is_relative_to(REPO):
            ids.append(job_id)
    return ids


def wait_no_jobs(prefix: str, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := our_jobs(prefix)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def simpipe(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "simpipe.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"simpipe {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc
