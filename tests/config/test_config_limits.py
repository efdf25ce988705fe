"""Values `simpipe run` cannot play are refused by `simpipe validate`, with the key and the
allowed range on one line; values at the documented bounds are accepted and work."""

import numpy as np
import pytest

from simpipe.agents.llm import agent_seeds
from simpipe.config.model import SEED_MAX, load_config
from simpipe.personas.config import MAX_PARTITION_AGENTS, MAX_POPULATION
from simpipe.personas.sampling import exact_partition_counts, largest_remainder, partition_bounds

from support import SCRIPTED, one_error_line, simpipe_cli


# Each of these passed `simpipe validate` and then crashed `simpipe run` with a traceback
# (or, for game.rounds = true, silently played one round).
@pytest.mark.parametrize("override,key,allowed", [
    ("population.size=1000000000000", "population.size", "less than or equal to 999999999"),
    ("population.size=100000000000000000000000", "population.size", "999999999"),
    ('game.ratio="1e400"', "game.ratio", "finite number > 0"),
    ('game.ratio="1e-400"', "game.ratio", "finite number > 0"),
    ("game.low=nan", "game.low", "finite number"),
    ("game.high=inf", "game.high", "finite number"),
    ("game.high=1e300", "game.high", "less than or equal to 1000000000"),
    ("agents.scripted.tau=inf", "agents.scripted.tau", "finite number"),
    ("agents.scripted.tau=1000", "agents.scripted.tau", "less than or equal to 100"),
    ("agents.scripted.latency_s=inf", "agents.scripted.latency_s", "finite number"),
    ("run.seed=-1", "run.seed", "greater than or equal to 0"),
    ("agents.tgi.endpoints=[]", "agents.tgi.endpoints", "at least 1 item"),
    ('cluster.memory_limit="abc"', "cluster.memory_limit", "amount of memory"),
    ('cluster.dashboard_address="abc"', "cluster.dashboard_address", "host:port"),
    ("game.rounds=true", "game.rounds", "valid integer"),
    ("population.partitions=true", "population.partitions", "valid integer"),
    ("population.size=20000000", "population", "at most 2,000,000"),
])
def test_unplayable_value_exits_2_with_one_line_naming_the_key(override, key, allowed):
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED), "--set", override))
    assert key in line and allowed in line, line


def test_largest_population_validates_and_its_exact_split_works():
    parts = MAX_POPULATION // MAX_PARTITION_AGENTS + 1
    config = load_config(SCRIPTED, [f"population.size={MAX_POPULATION}",
                                    f"population.partitions={parts}"])
    assert config.population.size == MAX_POPULATION
    # The piece of the sampler with the hard limit: the hypergeometric split over partitions.
    sizes = [b - a for a, b in partition_bounds(MAX_POPULATION, config.population.n_partitions)]
    assert sum(sizes) == MAX_POPULATION and max(sizes) <= MAX_PARTITION_AGENTS
    totals = largest_remainder(MAX_POPULATION, np.ones(5))
    counts = exact_partition_counts(totals, sizes, seed=1, stream=2)
    assert counts.sum() == MAX_POPULATION and (counts.sum(axis=1) == sizes).all()
    with pytest.raises(ValueError):  # one more agent and numpy refuses: the bound is real
        exact_partition_counts(largest_remainder(MAX_POPULATION + 1, np.ones(5)),
                               [*sizes[:-1], sizes[-1] + 1], seed=1, stream=2)


def test_largest_seed_validates_and_seeds_every_generator():
    config = load_config(SCRIPTED, [f"run.seed={SEED_MAX}"])
    ids = np.arange(5, dtype=np.int64)
    seeds = agent_seeds(config.run.seed, 3, ids)
    assert ((seeds >= 0) & (seeds < 2**31)).all() and len(set(seeds.tolist())) == 5
    rng = np.random.default_rng([config.run.seed, 1, 2, 3])
    assert 0 <= rng.random() < 1


def test_values_at_the_other_bounds_validate():
    proc = simpipe_cli("validate", str(SCRIPTED), "--set", "agents.scripted.tau=100",
                    "--set", "agents.scripted.latency_s=3600", "--set", "game.low=-1e9",
                    "--set", "game.high=1e9", "--set", 'cluster.memory_limit="4GiB"')
    assert proc.returncode == 0, proc.stderr
