import numpy as np
import pandas as pd
import pytest

from simpipe.personas.config import PopulationConfig
from simpipe.personas.sampling import largest_remainder, partition_bounds, sample_partition


def population(size, partitions, sampling="exact", weights=None):
    weights = weights or {"a": 0.2, "b": 0.2, "c": 0.2, "d": 0.2, "e": 0.2}
    return PopulationConfig(size=size, partitions=partitions, sampling=sampling,
                            attributes={"cat": {"values": weights}, "age": {"min": 18, "max": 80}})


def whole(config, seed=1):
    return pd.concat([sample_partition(config, seed, k) for k in range(config.n_partitions)],
                     ignore_index=True)


def test_largest_remainder_is_exact_and_closest():
    assert list(largest_remainder(10, np.array([1, 1, 1]))) == [4, 3, 3]
    assert list(largest_remainder(1001, np.ones(7))) == [143] * 7
    counts = largest_remainder(1003, np.array([0.5, 0.3, 0.2]))
    assert counts.sum() == 1003 and list(counts) == [501, 301, 201]  # remainders .5, .9, .6


@pytest.mark.parametrize("size,partitions", [(1000, 8), (1001, 7), (13, 5), (5, 5)])
def test_exact_counts_over_the_whole_population(size, partitions):
    config = population(size, partitions)
    frame = whole(config)
    assert list(frame["agent_id"]) == list(range(size))
    expected = dict(zip("abcde", largest_remainder(size, np.ones(5)), strict=True))
    assert frame["cat"].value_counts().to_dict() == expected
    assert frame["age"].between(18, 80).all()


def test_exact_sampling_with_uneven_weights():
    frame = whole(population(1001, 7, weights={"x": 3, "y": 1}))
    assert frame["cat"].value_counts().to_dict() == {"x": 751, "y": 250}


def test_same_seed_same_rows_other_seed_other_rows():
    config = population(500, 4)
    pd.testing.assert_frame_equal(whole(config, 1), whole(config, 1))
    assert not whole(config, 1)["cat"].equals(whole(config, 2)["cat"])


def test_random_sampling_is_iid_with_the_weights():
    frame = whole(population(20000, 4, "random", {"x": 0.7, "y": 0.3}))
    share = frame["cat"].value_counts(normalize=True)
    assert abs(share["x"] - 0.7) < 0.02


def test_partition_bounds_cover_everything_evenly():
    bounds = partition_bounds(1001, 7)
    assert bounds[0][0] == 0 and bounds[-1][1] == 1001
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
