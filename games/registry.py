"""Every game, keyed on its ``[game] kind``."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from simpipe.games.base import Game
from simpipe.games.beauty_contest.game import BeautyContest
from simpipe.games.config import GAME_CONFIGS, AnyGameConfig, game_config, stored_table
from simpipe.games.public_goods.game import PublicGoods

GAMES: dict[str, type[Game]] = {game.kind: game for game in (BeautyContest, PublicGoods)}
if set(GAMES) != set(GAME_CONFIGS):  # a table without a game, or a game without a table
    raise RuntimeError(f"games {sorted(GAMES)} and [game] tables {sorted(GAME_CONFIGS)} differ")


@lru_cache(maxsize=64)
def game_for(config: AnyGameConfig) -> Game:
    """The game a ``[game]`` table configures (one object per distinct table and process)."""
    return GAMES[config.kind](config)


def game_from_dict(raw: Any) -> Game:
    """The game of a ``[game]`` table as stored in a run's ``run.json``; pydantic's
    ValidationError (a ValueError) when the table is not one. A stored table without a
    prompt setting added later was made with that setting's earlier value."""
    return game_for(game_config(stored_table(raw)))
