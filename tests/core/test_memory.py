"""``simpipe.core.memory.PeakMemory``: the one RSS sampler of the benchmarks, its peak and its
timeline."""

from __future__ import annotations

import math
import time

from simpipe.core.memory import PeakMemory


def test_the_peak_and_the_timeline_see_an_allocation() -> None:
    size = 256 * 2**20
    before = time.time()
    with PeakMemory(interval_s=0.01, timeline=True) as mem:
        block = bytearray(size)  # zero-filled: its pages are resident
        while not any(rss >= size for _, rss in mem.samples):
            time.sleep(0.01)
        del block
    assert mem.peak_bytes >= size and mem.peak_gib == mem.peak_bytes / 2**30
    assert mem.peak_gib_between(before, math.inf) == max(r for _, r in mem.samples) / 2**30
    assert mem.peak_gib_between(0.0, before - 1) is None


def test_without_a_timeline_no_samples_are_kept() -> None:
    with PeakMemory(interval_s=0.01) as mem:
        pass
    assert mem.samples == [] and 0 < mem.peak_bytes
    assert mem.peak_gib_between(0.0, math.inf) is None
