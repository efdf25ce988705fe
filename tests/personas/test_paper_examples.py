"""The paper's two populations as shipped in examples/."""

import pandas as pd
import pytest

from simpipe.config.model import load_config
from simpipe.run.simulation import run_simulation

from support import REPO

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
OCCUPATIONS = ["Professor of Game Theory", "Economist", "Psychologist", "Athlete", "Artist",
               "Writer"]


def example(name, tmp_path, *overrides):
    return load_config(REPO / "examples" / name,
                       [f"run.output_dir={str(tmp_path)!r}", *overrides])


def test_both_examples_validate_with_the_llm_default():
    for name in ("paper-education.toml", "paper-occupation.toml"):
        config = load_config(REPO / "examples" / name)
        assert config.agents.backend == "llamacpp"
        assert config.population.persona.mode == "template"
    education = load_config(REPO / "examples" / "paper-education.toml").population
    assert education.size == 1000
    assert list(education.attributes["education"].values) == EDUCATION
    occupation = load_config(REPO / "examples" / "paper-occupation.toml").population
    assert sorted(occupation.attributes["occupation"].values) == sorted(OCCUPATIONS)


@pytest.mark.parametrize("name,attribute,order", [
    ("paper-education.toml", "education", EDUCATION),
    ("paper-occupation.toml", "occupation", OCCUPATIONS[:2]),
])
def test_scripted_runs_reproduce_the_direction(dask_client, tmp_path, name, attribute, order):
    config = example(name, tmp_path, "agents.backend='scripted'", "game.rounds=1")
    result = run_simulation(config, client=dask_client)
    rounds = result.rounds().merge(pd.read_parquet(config.run_dir / "population"), on="agent_id")
    means = rounds.groupby(attribute, observed=True)["guess"].mean()
    population = pd.read_parquet(config.run_dir / "population")
    assert population[attribute].value_counts().nunique() == 1  # equal shares, exactly
    if attribute == "education":
        assert means.loc[order].is_monotonic_decreasing  # more education, lower guesses
    else:  # game theorists and economists guess lowest
        assert set(means.nsmallest(2).index) == set(order)
