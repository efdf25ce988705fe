"""``$SIMPIPE_HOME``: where simpipe keeps what outlives one run (persistent clusters, the
embedded model). Its own module, below the packages that use it, so the inference
back-ends and the cluster read it without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def simpipe_home() -> Path:
    """``$SIMPIPE_HOME`` (``~`` expanded), or ``~/.simpipe`` when unset or empty: the
    clusters here (``simpipe.cluster.state``), and the embedded model
    (``simpipe.inference.llamacpp.model_files``)."""
    return Path(os.environ.get("SIMPIPE_HOME") or "~/.simpipe").expanduser()
