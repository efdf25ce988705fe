"""The comparison report's statistics (``simpipe.report.stats``) on data whose truth is
known: bootstrap intervals cover the true mean as often as they promise, the tests find a
real difference and not a null one, the effect sizes and Holm's adjustment are right."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from simpipe.report.stats import bootstrap_intervals, compare_samples, holm


def test_the_interval_covers_the_true_mean_and_median_of_a_synthetic_sample() -> None:
    rng = np.random.default_rng(8)
    sample = np.round(rng.normal(40.0, 15.0, 500), 2)
    ci = bootstrap_intervals(sample, key=(1,))
    assert ci["mean_ci_low"] < 40.0 < ci["mean_ci_high"]
    assert ci["median_ci_low"] < 40.0 < ci["median_ci_high"]
    assert ci["mean_ci_high"] - ci["mean_ci_low"] == pytest.approx(
        2 * 1.96 * 15 / np.sqrt(500), rel=0.2)
    assert bootstrap_intervals(sample, key=(1,)) == ci  # fixed seeds: the same intervals


def test_the_interval_covers_the_true_mean_about_95_times_in_100() -> None:
    rng = np.random.default_rng(11)
    true_mean = 1.0 / 0.05 * 0.5  # a skewed sample: exponential, mean 10
    hits = 0
    for i in range(200):
        sample = rng.exponential(true_mean, 200)
        ci = bootstrap_intervals(sample, key=(i,), n_boot=600)
        hits += ci["mean_ci_low"] <= true_mean <= ci["mean_ci_high"]
    assert 0.88 <= hits / 200 <= 0.99


def test_an_empty_sample_has_no_interval() -> None:
    assert all(np.isnan(v) for v in bootstrap_intervals(np.array([np.nan])).values())


def test_the_tests_find_a_real_difference_and_not_a_null_one() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(30, 10, 300), rng.normal(35, 10, 300)
    real = compare_samples(a, b)
    assert real["mw_p"] < 1e-3 and real["welch_p"] < 1e-3
    assert real["diff"] < 0 and real["rank_biserial"] < 0 and -0.8 < real["cohens_d"] < -0.3
    assert real["welch_p"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    null = compare_samples(a, rng.normal(30, 10, 300))
    assert null["mw_p"] > 0.05 and null["welch_p"] > 0.05 and abs(null["cohens_d"]) < 0.2


def test_the_effect_sizes_on_known_data() -> None:
    a, b = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    result = compare_samples(a, b)
    assert result["cohens_d"] == pytest.approx(-3.0)  # diff -3, pooled SD 1
    assert result["rank_biserial"] == pytest.approx(-1.0)  # every a below every b
    x, y = np.array([1.0, 3.0, 5.0, 7.0]), np.array([2.0, 3.0, 4.0])
    # P(x > y) - P(x < y) by counting the 12 pairs: 7 above, 4 below, 1 tie
    assert compare_samples(x, y)["rank_biserial"] == pytest.approx((7 - 4) / 12)
    flat = compare_samples(np.ones(4), np.ones(4))  # no spread: nothing to test, no warning
    assert np.isnan(flat["cohens_d"]) and np.isnan(compare_samples(a[:1], b)["mw_p"])


def test_holm_adjusts_step_down_and_skips_missing_values() -> None:
    assert holm([0.01, 0.04, 0.03, float("nan")]) == pytest.approx(
        [0.03, 0.06, 0.06, float("nan")], nan_ok=True)
    assert holm([0.5, 0.9]) == [1.0, 1.0]
