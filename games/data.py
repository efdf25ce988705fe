"""Data files shipped inside the package (published reference numbers)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=8)
def package_json(name: str) -> dict[str, Any]:
    """``simpipe/games/<name>``, parsed (once per process)."""
    return json.loads(resources.files("simpipe.games").joinpath(name).read_text("utf-8"))
