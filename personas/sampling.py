"""Sampling agent attributes, vectorised, one partition at a time.

Every random draw comes from a generator seeded by ``(seed, stream, ...)`` so a partition's
rows depend only on the config and the partition index, never on which worker built it or
in which order.

``sampling = "exact"``: the population-wide count of each label follows the weights exactly
(largest remainder); the counts are split across partitions by a seeded multivariate
hypergeometric draw (so the union is still exact) and shuffled inside each partition.
``sampling = "random"``: i.i.d. draws per agent.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from simpipe.personas.config import CategoricalAttribute, IntegerAttribute, PopulationConfig


def partition_bounds(size: int, n_partitions: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` agent-id ranges, sizes differing by at most one."""
    edges = np.linspace(0, size, n_partitions + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` closest to ``total * weights / sum(weights)``."""
    share = np.asarray(weights, dtype=np.float64)
    quota = total * share / share.sum()
    counts = np.floor(quota).astype(np.int64)
    left = total - int(counts.sum())
    # Ties in the remainder go to the earlier label, so the result never depends on sort order.
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[:left]] += 1
    return counts


def _stream(name: str) -> int:
    return zlib.crc32(name.encode())


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def exact_partition_counts(
    total_counts: np.ndarray, sizes: list[int], seed: int, stream: int
) -> np.ndarray:
    """Split population-wide label counts over partitions: shape (partitions, labels)."""
    rng = _rng(seed, stream, 0xC0FFEE)
    remaining = total_counts.astype(np.int64).copy()
    out = np.zeros((len(sizes), len(total_counts)), dtype=np.int64)
    for k, n in enumerate(sizes):
        if k == len(sizes) - 1:
            out[k] = remaining
        else:
            out[k] = rng.multivariate_hypergeometric(remaining, n)
        remaining -= out[k]
    return out


def sample_partition(config: PopulationConfig, seed: int, partition: int) -> pd.DataFrame:
    """The attribute rows of one partition: ``agent_id`` plus one column per attribute."""
    bounds = partition_bounds(config.size, config.n_partitions)
    start, stop = bounds[partition]
    n = stop - start
    columns: dict[str, object] = {"agent_id": np.arange(start, stop, dtype=np.int64)}
    for name, spec in config.attributes.items():
        stream = _stream(name)
        rng = _rng(seed, stream, partition)
        if isinstance(spec, CategoricalAttribute):
            labels = list(spec.values)
            weights = np.array(list(spec.values.values()), dtype=np.float64)
            if config.sampling == "exact":
                totals = largest_remainder(config.size, weights)
                sizes = [b - a for a, b in bounds]
                counts = exact_partition_counts(totals, sizes, seed, stream)[partition]
                codes = np.repeat(np.arange(len(labels), dtype=np.int32), counts)
                rng.shuffle(codes)
            else:
                codes = rng.choice(len(labels), size=n, p=weights / weights.sum()).astype(np.int32)
            columns[name] = pd.Categorical.from_codes(codes, categories=labels)
        elif isinstance(spec, IntegerAttribute):
            columns[name] = rng.integers(spec.min, spec.max + 1, size=n, dtype=np.int64)
    return pd.DataFrame(columns)
