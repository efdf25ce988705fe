"""Helpers shared by the SLURM tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import subprocess
import sys
import time


def our_jobs(prefix: str) -> list[str]:
    """Job ids whose name starts with ``prefix``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1].startswith(prefix)]


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
