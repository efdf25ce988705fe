"""``[game]`` as a union of the games' tables, discriminated on ``kind``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError

from simpipe.config.model import config_from_dict
from simpipe.games.config import (
    BeautyContestConfig,
    GameConfig,
    PublicGoodsConfig,
    game_config,
)
from simpipe.games.registry import game_from_dict


class Holder(BaseModel):
    """The ``game`` field as the whole config declares it."""

    game: GameConfig = Field(default_factory=BeautyContestConfig)


def errors(raw: dict) -> list[tuple[tuple, str]]:
    with pytest.raises(ValidationError) as info:
        Holder.model_validate({"game": raw})
    return [(e["loc"], e["msg"]) for e in info.value.errors(include_url=False)]


def test_a_table_without_kind_is_the_beauty_contest() -> None:
    assert Holder().game == BeautyContestConfig()
    assert Holder.model_validate({"game": {"ratio": "1/2"}}).game.ratio_value == 0.5


def test_the_public_goods_defaults_are_the_classic_design() -> None:
    game = game_config({"kind": "public_goods"})
    assert isinstance(game, PublicGoodsConfig)
    assert (game.group_size, game.endowment, game.mpcr, game.rounds) == (4, 20, 0.4, 10)


def test_a_key_of_another_game_is_an_error_naming_that_game() -> None:
    [(loc, msg)] = errors({"kind": "public_goods", "ratio": "2/3"})
    assert loc == ("game", "ratio")
    assert "a key of kind = 'beauty_contest', not of kind = 'public_goods'" in msg
    assert "allowed here: kind, rounds, group_size, prompt, endowment, mpcr" in msg
    [(loc, msg)] = errors({"endowment": 20})  # no kind: the beauty contest
    assert loc == ("game", "endowment") and "kind = 'public_goods'" in msg


def test_every_problem_of_a_table_is_named_at_once() -> None:
    problems = dict(errors({"kind": "public_goods", "ratio": "2/3", "mpcr": 2, "rounds": 0}))
    assert set(problems) == {("game", "ratio"), ("game", "mpcr"), ("game", "rounds")}


def test_a_game_that_is_not_a_table_is_named() -> None:
    [(loc, msg)] = errors(3)
    assert loc == ("game",) and "a table is expected" in msg


def test_an_unknown_key_and_an_unknown_game_are_named() -> None:
    [(loc, msg)] = errors({"kind": "public_goods", "colour": "red"})
    assert loc == ("game", "colour") and "no such key for kind = 'public_goods'" in msg
    [(loc, msg)] = errors({"kind": "ultimatum"})
    assert loc == ("game", "kind")
    assert "allowed: 'beauty_contest', 'public_goods'" in msg


@pytest.mark.parametrize(("raw", "key", "text"), [
    ({"kind": "public_goods", "mpcr": 1.0}, "mpcr", "less than 1"),
    ({"kind": "public_goods", "group_size": 1}, "group_size", "greater than or equal to 2"),
    ({"kind": "public_goods", "endowment": 2_000_000}, "endowment", "less than or equal"),
    ({"kind": "public_goods", "endowment": 2.5}, "endowment", "valid integer"),
    ({"rounds": 0}, "rounds", "greater than or equal to 1"),
])
def test_bad_values_are_named_by_their_key_without_the_union_member(raw, key, text) -> None:
    [(loc, msg)] = errors(raw)
    assert loc == ("game", key) and text in msg


EARLIER_KEYS = {"kind", "ratio", "offset", "low", "high", "rounds", "group_size", "prompt",
                "disclose_variant"}


def test_the_beauty_contest_table_keeps_its_keys() -> None:
    """run.json's config and the results hash are made of these keys: a run made before the
    game interface existed (round-by-round prompts) must still resume with those prompts."""
    assert set(BeautyContestConfig(history_layout="by_round").model_dump()) == EARLIER_KEYS
    assert set(BeautyContestConfig().model_dump()) == EARLIER_KEYS | {"history_layout"}


def test_a_stored_table_without_the_layout_reads_back_as_round_by_round() -> None:
    # run.json of a run made before the split layout has no history_layout key.
    stored = BeautyContestConfig(history_layout="by_round").model_dump(mode="json")
    assert game_from_dict(stored).config.history_layout == "by_round"
    split = BeautyContestConfig().model_dump(mode="json")
    assert game_from_dict(split).config.history_layout == "split"


def test_a_run_of_the_earlier_layout_is_refused_with_the_key_that_resumes_it() -> None:
    earlier = config_from_dict({"game": {"history_layout": "by_round"}})
    hint = config_from_dict({}).resume_hint(earlier.results_hash())
    assert 'game.history_layout = "by_round"' in hint
    other_seed = config_from_dict({"run": {"seed": 1}}).results_hash()
    assert config_from_dict({}).resume_hint(other_seed) == ""


def test_prompt_options_are_stored_only_when_on() -> None:
    # Off, they are left out (the key set above, hence old runs' hashes); on, they are kept
    # and read back.
    game = BeautyContestConfig(rational_players=True, predict_others=True)
    dumped = game.model_dump(mode="json")
    assert dumped["rational_players"] is True and dumped["predict_others"] is True
    assert game_config(dumped) == game
    assert "predict_others" not in BeautyContestConfig(rational_players=True).model_dump()


def test_a_stored_table_reads_back_as_its_game() -> None:
    game = PublicGoodsConfig(mpcr=0.5, rounds=3)
    assert game_config(game.model_dump(mode="json")) == game
    assert game_config(game) == game
    with pytest.raises(ValueError):
        game_config({"kind": "public_goods", "low": 0})
