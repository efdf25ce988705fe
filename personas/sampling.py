"""Sampling agent attributes, vectorised, one partition at a time.

Every random draw comes from a generator seeded by ``(seed, stream, ...)`` so a partition's
rows depend only on the config and the partition index, never on which worker built it or
in which order.

``sampling = "exact"``: the population-wide count of each label follows the weights exactly
(largest remainder); the counts are split across partitions by a seeded multivariate
hypergeometric draw (so the union is still exact) and shuffled inside each partition.
``sampling = "random"``: i.i.d. draws per agent.

Conditional attributes are sampled after their parent. With exact sampling the counts are
exact per parent label: the agents with parent label ``p`` (an exact, known number in each
partition) get ``largest_remainder`` counts of the child labels from the ``p`` row, split
over partitions the same way.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from simpipe.personas.config import (
    CategoricalAttribute,
    ConditionalAttribute,
    IntegerAttribute,
    PopulationConfig,
    attribute_labels,
    sampling_order,
)


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


def _exact_matrix(config: PopulationConfig, seed: int, sizes: list[int]
                  ) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Per labelled attribute: its (partitions x labels) counts and, for conditionals, the
    same split per parent label. Every task computes all partitions (a few draws each) so
    the union over partitions is exact without any coordination."""
    out: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for name in sampling_order(config.attributes):
        spec = config.attributes[name]
        stream = _stream(name)
        if isinstance(spec, CategoricalAttribute):
            totals = largest_remainder(config.size, np.array(list(spec.values.values())))
            out[name] = (exact_partition_counts(totals, sizes, seed, stream), {})
        elif isinstance(spec, ConditionalAttribute):
            parent_spec = config.attributes[spec.given]
            parent_counts = out[spec.given][0]
            labels = spec.labels
            total = np.zeros((len(sizes), len(labels)), dtype=np.int64)
            per_parent: dict[str, np.ndarray] = {}
            for j, parent_label in enumerate(attribute_labels(parent_spec) or []):
                in_parts = parent_counts[:, j]
                weights = _row_weights(spec, parent_label, labels)
                totals = largest_remainder(int(in_parts.sum()), weights)
                split = exact_partition_counts(totals, in_parts.tolist(), seed, stream + j + 1)
                per_parent[parent_label] = split
                total += split
            out[name] = (total, per_parent)
    return out


def _row_weights(spec: ConditionalAttribute, parent_label: str, labels: list[str]) -> np.ndarray:
    row = spec.row(parent_label)
    return np.array([row.get(label, 0.0) for label in labels], dtype=np.float64)


def _integers(spec: IntegerAttribute, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.distribution == "normal":
        draws = np.rint(rng.normal(spec.mean, spec.sd, size=n))
        return np.clip(draws, spec.min, spec.max).astype(np.int64)
    return rng.integers(spec.min, spec.max + 1, size=n, dtype=np.int64)


def sample_partition(config: PopulationConfig, seed: int, partition: int) -> pd.DataFrame:
    """The attribute rows of one partition: ``agent_id`` plus one column per attribute
    (in config order; sampled parents first)."""
    bounds = partition_bounds(config.size, config.n_partitions)
    start, stop = bounds[partition]
    n = stop - start
    exact = config.sampling == "exact"
    matrices = _exact_matrix(config, seed, [b - a for a, b in bounds]) if exact else {}
    codes_of: dict[str, np.ndarray] = {}
    columns: dict[str, object] = {}
    for name in sampling_order(config.attributes):
        spec = config.attributes[name]
        rng = _rng(seed, _stream(name), partition)
        if isinstance(spec, CategoricalAttribute):
            if exact:
                codes = np.repeat(np.arange(len(spec.values), dtype=np.int32),
                                  matrices[name][0][partition])
                rng.shuffle(codes)
            else:
                weights = np.array(list(spec.values.values()), dtype=np.float64)
                codes = rng.choice(len(weights), size=n, p=weights / weights.sum()).astype(np.int32)
            codes_of[name] = codes
            columns[name] = pd.Categorical.from_codes(codes, categories=spec.labels)
        elif isinstance(spec, ConditionalAttribute):
            codes = _conditional_codes(config, spec, codes_of[spec.given], rng, partition,
                                       matrices.get(name))
            codes_of[name] = codes
            columns[name] = pd.Categorical.from_codes(codes, categories=spec.labels)
        elif isinstance(spec, IntegerAttribute):
            columns[name] = _integers(spec, rng, n)
    ordered = {"agent_id": np.arange(start, stop, dtype=np.int64)}
    ordered.update((name, columns[name]) for name in config.attributes)
    return pd.DataFrame(ordered)


def _conditional_codes(config: PopulationConfig, spec: ConditionalAttribute,
                       parent_codes: np.ndarray, rng: np.random.Generator, partition: int,
                       matrix: tuple[np.ndarray, dict[str, np.ndarray]] | None) -> np.ndarray:
    labels = spec.labels
    codes = np.empty(len(parent_codes), dtype=np.int32)
    parent_labels = attribute_labels(config.attributes[spec.given]) or []
    for j, parent_label in enumerate(parent_labels):
        rows = np.flatnonzero(parent_codes == j)
        if rows.size == 0:
            continue
        if matrix is not None:
            counts = matrix[1][parent_label][partition]
            block = np.repeat(np.arange(len(labels), dtype=np.int32), counts)
            rng.shuffle(block)
        else:
            weights = _row_weights(spec, parent_label, labels)
            block = rng.choice(len(labels), size=rows.size,
                               p=weights / weights.sum()).astype(np.int32)
        codes[rows] = block
    return codes
