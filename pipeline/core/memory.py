"""Peak resident memory of this process and all its children (Dask workers included)."""

from __future__ import annotations

import threading
import time

import psutil


def tree_rss_bytes(proc: psutil.Process | None = None) -> int:
    proc = proc or psutil.Process()
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


class PeakMemory:
    """Samples the process tree's RSS in a background thread; use as a context manager.
    ``timeline``: also keep every sample with its time, for the peak of an interval
    (``peak_gib_between``)."""

    def __init__(self, interval_s: float = 0.05, timeline: bool = False) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.samples: list[tuple[float, int]] = []  # (time.time(), bytes) with ``timeline``
        self._timeline = timeline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _take(self) -> None:
        rss = tree_rss_bytes()
        self.peak_bytes = max(self.peak_bytes, rss)
        if self._timeline:
            self.samples.append((time.time(), rss))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2**30

    def peak_gib_between(self, start: float, end: float) -> float | None:
        """The peak of the samples taken from ``start`` to ``end`` (``time.time()``); None
        when none was (or the sampler keeps no timeline)."""
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return max(inside) / 2**30 if inside else None
