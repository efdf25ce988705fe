import numpy as np
import pytest

from simpipe.games.groups import assign_groups


@pytest.mark.parametrize("n,size",
                         [(10, 0), (10, 10), (10, 20), (100, 5), (103, 5), (7, 3), (1, 1)])
def test_every_agent_in_exactly_one_group_of_about_the_size(n, size):
    g = assign_groups(n, size, seed=1)
    assert g.shape == (n,)
    counts = np.bincount(g)
    assert counts.sum() == n
    if size == 0 or size >= n:
        assert set(g) == {0}
    else:
        assert len(counts) == n // size
        assert counts.min() >= size and counts.max() - counts.min() <= 1 + (n % size) // (n // size)


def test_groups_are_deterministic_per_seed_and_differ_across_seeds():
    assert np.array_equal(assign_groups(1000, 10, 5), assign_groups(1000, 10, 5))
    assert not np.array_equal(assign_groups(1000, 10, 5), assign_groups(1000, 10, 6))
