"""Helpers shared by test modules (import as ``from support import ...``; tests/ is on
pytest's pythonpath). Fixtures live in conftest.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from simpipe.config.model import Config, config_from_dict
from simpipe.run.simulation import RoundObserver
from simpipe.store.round_record import RoundRecord

REPO = Path(__file__).resolve().parents[1]
SCRIPTED = REPO / "examples" / "scripted.toml"


def total_variation(a, b) -> float:
    """Total variation between two answer distributions (``texts``, ``probs``): an answer
    one of them lacks counts with probability 0 there."""
    pa = dict(zip(a.texts, a.probs.tolist(), strict=True))
    pb = dict(zip(b.texts, b.probs.tolist(), strict=True))
    return 0.5 * sum(abs(pa.get(t, 0.0) - pb.get(t, 0.0)) for t in set(pa) | set(pb))


def simpipe_cli(*args: str, cwd: Path = REPO,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``simpipe ARGS`` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "simpipe.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a command that must fail as a usage error (exit 2) printed, checked to
    be the only one and no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


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


def cancel_after_first_round(run_dir: Path) -> threading.Thread:
    """A thread that asks the run in ``run_dir`` to stop (its CANCEL file) as soon as its
    run.json records round 1 as done (its key "1": rounds numbered from 1)."""
    ledger, flag = run_dir / "run.json", run_dir / "CANCEL"

    def watch() -> None:
        while not (ledger.exists() and '"1": {' in ledger.read_text()):
            time.sleep(0.01)
        flag.touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


class CancelAfterFirstRound(RoundObserver):
    """Pass as ``run_simulation(..., observer=...)``: asks the run to stop (its CANCEL file)
    the moment round 1 is recorded, so that it stops before round 2 starts, every time. A
    watching thread (``cancel_after_first_round``) can be late on a loaded machine, and the
    run then stops inside round 2 or after it."""

    def __init__(self, run_dir: Path) -> None:
        self.flag = run_dir / "CANCEL"

    def round_finished(self, round_index: int, record: RoundRecord) -> None:
        if round_index == 0:
            self.flag.touch()
