"""How well a built population matches its spec: counts against the requested shares.

Used by ``simpipe population show`` and the tests. For exact sampling the expected counts
are the largest-remainder counts the sampler promises (per parent label for conditionals);
for random sampling a chi-square goodness-of-fit test says whether the observed counts are
plausible draws from the weights.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from simpipe.personas.config import (
    CategoricalAttribute,
    ConditionalAttribute,
    IntegerAttribute,
    PopulationConfig,
    attribute_labels,
)
from simpipe.personas.sampling import largest_remainder


def chi_square_p(observed: np.ndarray, weights: np.ndarray) -> float:
    """p-value of observed counts against shares ``weights`` (labels of weight 0 must be
    empty; they are left out of the test, which has no expected count for them)."""
    observed = np.asarray(observed, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    keep = weights > 0
    if observed[~keep].sum() > 0:
        return 0.0
    if keep.sum() < 2 or observed.sum() == 0:
        return 1.0
    expected = observed[keep].sum() * weights[keep] / weights[keep].sum()
    return float(stats.chisquare(observed[keep], expected).pvalue)


def _table(observed: pd.Series, labels: list[str], weights: np.ndarray, exact: bool,
           parent: str | None = None) -> pd.DataFrame:
    counts = observed.reindex(labels, fill_value=0).to_numpy(dtype=np.int64)
    n = int(counts.sum())
    share = weights / weights.sum()
    frame = pd.DataFrame({
        "label": labels,
        "count": counts,
        "share": counts / n if n else np.zeros(len(labels)),
        "requested": share,
        "expected": largest_remainder(n, weights) if exact else np.round(n * share, 1),
    })
    if parent is not None:
        frame.insert(0, "given", parent)
    return frame


def attribute_report(frame: pd.DataFrame, config: PopulationConfig, name: str
                     ) -> tuple[pd.DataFrame, float | None]:
    """(table of counts vs requested shares, chi-square p for random sampling or None).

    For a conditional attribute the table has one block per parent label and the p-value
    combines the blocks (one test over the pooled statistic)."""
    spec = config.attributes[name]
    exact = config.sampling == "exact"
    if isinstance(spec, CategoricalAttribute):
        weights = np.array(list(spec.values.values()), dtype=np.float64)
        counts = frame[name].value_counts()
        table = _table(counts, spec.labels, weights, exact)
        p = None if exact else chi_square_p(table["count"].to_numpy(), weights)
        return table, p
    if isinstance(spec, ConditionalAttribute):
        blocks, chi2, dof = [], 0.0, 0
        labels = spec.labels
        for parent_label in attribute_labels(config.attributes[spec.given]) or []:
            row = spec.row(parent_label)
            weights = np.array([row.get(label, 0.0) for label in labels], dtype=np.float64)
            sub = frame.loc[frame[spec.given].astype(object) == parent_label, name]
            block = _table(sub.value_counts(), labels, weights, exact, parent=parent_label)
            blocks.append(block[(block["requested"] > 0) | (block["count"] > 0)])
            keep = weights > 0
            n = int(block["count"].sum())
            if n and keep.sum() >= 2:
                expected = n * weights[keep] / weights[keep].sum()
                chi2 += float((((block["count"].to_numpy()[keep] - expected) ** 2)
                               / expected).sum())
                dof += int(keep.sum()) - 1
        table = pd.concat(blocks, ignore_index=True)
        p = None
        if not exact:
            p = float(stats.chi2.sf(chi2, dof)) if dof else 1.0
        return table, p
    if isinstance(spec, IntegerAttribute):
        values = frame[name].to_numpy()
        table = pd.DataFrame({
            "stat": ["min", "max", "mean", "sd"],
            "observed": [values.min(), values.max(), values.mean(), values.std()],
            "requested": [spec.min, spec.max,
                          spec.mean if spec.mean is not None else (spec.min + spec.max) / 2,
                          spec.sd if spec.sd is not None
                          else np.sqrt(((spec.max - spec.min + 1) ** 2 - 1) / 12)],
        })
        return table, None
    raise TypeError(f"unknown attribute kind for {name!r}: {type(spec).__name__}")
