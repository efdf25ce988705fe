"""What a round's Dask tasks receive: a ``Turn`` carries the built ``Game`` and survives
the trip to a worker (pickle, cloudpickle); a partition's job carries the pieces of the
config its task reads, never the whole ``Config``."""

from __future__ import annotations

import dataclasses
import pickle
import typing
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from simpipe.agents.llm import prompting
from simpipe.config.model import Config, load_config
from simpipe.games.base import Turn
from simpipe.games.config import BeautyContestConfig, PublicGoodsConfig
from simpipe.games.groups import assign_groups
from simpipe.games.registry import game_for
from simpipe.run.planned_round import plan_chunk
from simpipe.run.round_task import partition_jobs
from simpipe.store.layout import RunPaths

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("table", [BeautyContestConfig(ratio="1/2", rounds=4),
                                   PublicGoodsConfig(rounds=2)], ids=lambda t: t.kind)
def test_a_turn_with_its_game_round_trips_to_a_worker(dumps, table) -> None:
    game = game_for(table)
    turn = Turn(game, 7, 1, 3, np.array([[33.3], [np.nan]]), np.array([[10.0], [20.0]]))
    back = pickle.loads(dumps(turn))
    assert type(back.game) is type(game) and back.game.config == table
    # equal to the process's own game, so caches keyed on the game find it
    assert back.game == game and hash(back.game) == hash(game)
    assert prompting(back.game, "completion") is prompting(game, "completion")
    assert (back.seed, back.round_index, back.partition) == (7, 1, 3)
    np.testing.assert_array_equal(back.past_feedback, turn.past_feedback)
    np.testing.assert_array_equal(back.rng(1).random(3), turn.rng(1).random(3))


def test_a_turn_refuses_a_game_table_where_the_game_belongs() -> None:
    with pytest.raises(TypeError, match="Turn.game must be a Game"):
        Turn(BeautyContestConfig(), 7, 0, 0, np.empty((1, 0)))  # type: ignore[arg-type]


def test_games_are_equal_by_their_table() -> None:
    a, b = BeautyContestConfig(ratio="1/2"), BeautyContestConfig(ratio="2/3")
    assert game_for(a) == pickle.loads(pickle.dumps(game_for(a))) != game_for(b)
    assert game_for(BeautyContestConfig()) != game_for(PublicGoodsConfig())


def _quickstart_jobs(tmp_path: Path):
    config = load_config(REPO / "examples" / "quickstart.toml")
    groups = assign_groups(config.population.size, config.game.group_size, config.run.seed)
    return config, partition_jobs(config, RunPaths(tmp_path), 0, groups, "topic")


def test_a_round_task_receives_no_config(tmp_path: Path) -> None:
    config, jobs = _quickstart_jobs(tmp_path)
    assert [job.partition for job in jobs] == [0, 1]
    assert [job.agent_ids for job in jobs] == [(0, 50), (50, 100)]
    for job in jobs:
        assert not any(isinstance(getattr(job, f.name), Config)
                       for f in dataclasses.fields(job))
        assert job.game == game_for(config.game) and job.agents == config.agents
        assert job.seed == config.run.seed
        payload = pickle.dumps(job)
        # the sections no task reads stay on the client
        assert b"LocalClusterConfig" not in payload and b"PopulationConfig" not in payload
    # stage 2 of a planned round gets the agents' settings and the game, not the config
    hints = typing.get_type_hints(plan_chunk)
    assert Config not in hints.values()
