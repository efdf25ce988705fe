"""Helpers shared by test modules (import as ``from support import ...``; tests/ is on
pytest's pythonpath). Fixtures live in conftest.py."""

from __future__ import annotations

from pathlib import Path

from simpipe.config import Config, config_from_dict

REPO = Path(__file__).resolve().parents[1]


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
