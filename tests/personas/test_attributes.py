"""Attribute kinds beyond the basics: normal integers, conditionals, dependency order."""

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from simpipe.personas.checks import attribute_report, chi_square_p
from simpipe.personas.config import PopulationConfig, sampling_order
from simpipe.personas.sampling import largest_remainder, sample_partition

SEVEN = {f"c{i}": 1.0 for i in range(7)}
OCCUPATION = {
    "given": "education",
    "values_given": {
        "Elementary School": {"Student": 1.0},
        "Ph.D.": {"Professor of Game Theory": 0.3, "Economist": 0.3, "Writer": 0.4},
        "default": {"Writer": 1.0, "Economist": 1.0, "Artist": 2.0},
    },
}
EDUCATION = {"values": {"Elementary School": 1, "High School": 1, "Ph.D.": 1}}


def whole(config, seed=7):
    return pd.concat([sample_partition(config, seed, k) for k in range(config.n_partitions)],
                     ignore_index=True)


def test_odd_size_over_seven_categories_is_exact():
    config = PopulationConfig(size=1001, partitions=6, attributes={"c": {"values": SEVEN}})
    counts = whole(config)["c"].value_counts().to_dict()
    assert counts == {f"c{i}": 143 for i in range(7)}


@pytest.mark.parametrize("size,partitions", [(1001, 7), (997, 5), (30, 4)])
def test_conditional_counts_are_exact_per_parent(size, partitions):
    config = PopulationConfig(size=size, partitions=partitions,
                              attributes={"occupation": OCCUPATION, "education": EDUCATION})
    frame = whole(config)
    assert list(frame.columns) == ["agent_id", "occupation", "education"]  # config order
    parent_counts = frame["education"].value_counts()
    spec = config.attributes["occupation"]
    for parent, n in parent_counts.items():
        row = spec.row(parent)
        weights = np.array([row.get(label, 0.0) for label in spec.labels])
        expected = dict(zip(spec.labels, largest_remainder(int(n), weights), strict=True))
        got = frame.loc[frame["education"] == parent, "occupation"].value_counts()
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}
    table, p = attribute_report(frame, config, "occupation")
    assert p is None and (table["count"] == table["expected"]).all()


def test_conditional_chain_samples_parents_first():
    attrs = {
        "c": {"given": "b", "values_given": {"default": {"x": 1, "y": 1}}},
        "b": {"given": "a", "values_given": {"a1": {"b1": 1}, "a2": {"b1": 1, "b2": 3}}},
        "a": {"values": {"a1": 1, "a2": 1}},
    }
    config = PopulationConfig(size=1001, partitions=7, attributes=attrs)
    assert sampling_order(config.attributes) == ["a", "b", "c"]
    frame = whole(config)
    assert (frame.loc[frame["a"] == "a1", "b"] == "b1").all()
    assert frame["c"].value_counts().sum() == 1001


def test_a_cycle_is_an_error_naming_it():
    attrs = {
        "a": {"given": "b", "values_given": {"default": {"x": 1}}},
        "b": {"given": "a", "values_given": {"default": {"y": 1}}},
    }
    with pytest.raises(ValidationError, match=r"cycle: a -> b -> a"):
        PopulationConfig(attributes=attrs)


@pytest.mark.parametrize("spec,message", [
    ({"given": "nope", "values_given": {"default": {"x": 1}}}, r"occ.given = 'nope': no such"),
    ({"given": "education", "values_given": {"Ph.D.": {"x": 1}}}, r"no row for education"),
    ({"given": "education", "values_given": {"Mars": {"x": 1}, "default": {"x": 1}}},
     r"rows \['Mars'\] are not labels"),
    ({"given": "age", "values_given": {"default": {"x": 1}}}, r"must name a categorical"),
    ({"given": "education", "values_given": {"default": {"x": 0}}}, r"row 'default'"),
])
def test_conditional_errors_name_the_key(spec, message):
    with pytest.raises(ValidationError, match=message):
        PopulationConfig(attributes={"education": EDUCATION, "age": {"min": 1, "max": 2},
                                     "occ": spec})


def test_normal_integers_are_clipped_and_centred():
    config = PopulationConfig(size=20000, partitions=4, attributes={
        "age": {"min": 18, "max": 80, "distribution": "normal", "mean": 40, "sd": 15}})
    ages = whole(config)["age"]
    assert ages.dtype == np.int64 and ages.between(18, 80).all()
    assert abs(ages.mean() - 40.5) < 1.0  # clipping at 18 lifts the mean a little
    assert (ages == 18).sum() > 100  # the clipped tail piles up at min


@pytest.mark.parametrize("spec,message", [
    ({"min": 0, "max": 9, "distribution": "normal"}, "needs `mean` and `sd`"),
    ({"min": 0, "max": 9, "distribution": "normal", "mean": 20, "sd": 1}, "must lie in"),
    ({"min": 0, "max": 9, "mean": 5}, 'need distribution = "normal"'),
])
def test_normal_errors(spec, message):
    with pytest.raises(ValidationError, match=message):
        PopulationConfig(attributes={"age": spec})


def random_config(size=5000):
    return PopulationConfig(size=size, partitions=5, sampling="random", attributes={
        "c": {"values": {"x": 0.5, "y": 0.3, "z": 0.2}}, "education": EDUCATION,
        "occupation": OCCUPATION})


def test_random_sampling_passes_chi_square_at_a_fixed_seed():
    config = random_config()
    frame = whole(config, seed=11)
    for name in ("c", "occupation"):
        _table, p = attribute_report(frame, config, name)
        assert p > 0.01, name


def test_the_chi_square_check_fails_a_wrong_sampler():
    """The test above can fail: a sampler that ignores the weights is caught."""
    config = random_config()
    frame = whole(config, seed=11)
    rng = np.random.default_rng(0)
    frame["c"] = pd.Categorical(rng.choice(["x", "y", "z"], size=len(frame)))  # uniform: wrong
    frame["occupation"] = frame["occupation"].cat.set_categories(
        config.attributes["occupation"].labels)
    frame.loc[frame["education"] == "Ph.D.", "occupation"] = "Writer"  # ignores the row
    _t, p_c = attribute_report(frame, config, "c")
    _t, p_occ = attribute_report(frame, config, "occupation")
    assert p_c < 1e-6 and p_occ < 1e-6


def test_chi_square_p_rejects_a_zero_weight_label_with_draws():
    assert chi_square_p(np.array([10, 10, 1]), np.array([1.0, 1.0, 0.0])) == 0.0
    assert chi_square_p(np.array([500, 500]), np.array([1.0, 1.0])) == pytest.approx(1.0)
