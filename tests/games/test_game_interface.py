"""What every game promises the round loop, the report and the web page (one contract,
checked for each registered game and for the minimum-effort example of docs/extending.md,
built from that page's own code: a game that writes only its rules gets the rest from the
defaults)."""

from __future__ import annotations

import os
import re
import types

import numpy as np
import pandas as pd
import pytest

from simpipe.games import config as game_config
from simpipe.games.base import Game, ScriptedSettings, Turn
from simpipe.games.config import GAME_CONFIGS, BeautyContestConfig, PublicGoodsConfig
from simpipe.games.prompts import PromptBuilder
from simpipe.games.registry import GAMES, game_for, game_from_dict

from support import REPO

CONFIGS = [BeautyContestConfig(rounds=4, group_size=5), PublicGoodsConfig(rounds=4)]
SETTINGS = ScriptedSettings()
N = 400


def test_every_game_has_a_table_and_every_table_a_game() -> None:
    assert set(GAMES) == set(GAME_CONFIGS) == {c.kind for c in CONFIGS}


@pytest.fixture(params=CONFIGS, ids=lambda c: c.kind)
def config(request):
    return request.param


def docs_example(monkeypatch: pytest.MonkeyPatch) -> Game:
    """The minimum-effort game of docs/extending.md "Adding a game", from the page's code
    blocks: its table where the page puts it (``games/config.py``), its class registered."""
    page = (REPO / "docs" / "extending.md").read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    table = next(b for b in blocks if "class MinimumEffortConfig(" in b)
    code = next(b for b in blocks if "class MinimumEffort(Game)" in b)
    namespace = dict(vars(game_config))
    exec(table, namespace)
    monkeypatch.setattr(game_config, "MinimumEffortConfig", namespace["MinimumEffortConfig"],
                        raising=False)
    module = types.ModuleType("minimum_effort_game")
    exec(code, module.__dict__)
    monkeypatch.setitem(GAMES, "minimum_effort", module.MinimumEffort)
    return game_for(namespace["MinimumEffortConfig"](rounds=4))


@pytest.fixture(params=[*CONFIGS, "docs example"],
                ids=lambda c: c if isinstance(c, str) else c.kind)
def game(request, monkeypatch: pytest.MonkeyPatch) -> Game:
    """Each registered game, and the docs' example game (nothing but its rules)."""
    if request.param == "docs example":
        return docs_example(monkeypatch)
    return game_for(request.param)


def test_the_docs_example_writes_only_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything it leaves out has a default; what it writes is abstract in ``Game``."""
    example = type(docs_example(monkeypatch))
    written = {name for name in vars(example) if callable(vars(example)[name])}
    assert written == set(Game.__abstractmethods__)
    assert not example.__abstractmethods__


def play(game: Game, rounds: int, partitions: int = 3):
    """Scripted rounds through the interface: (answers per round, summary)."""
    config = game.config
    groups = np.arange(N) % (N // config.group_size)
    own = np.empty((N, 0))
    summary = pd.DataFrame()
    for r in range(rounds):
        feedback = game.feedback_table(summary, int(groups.max()) + 1, r)
        answers, partials = [], []
        for k, ids in enumerate(np.array_split(np.arange(N), partitions)):
            turn = Turn(game, 9, r, k, feedback[groups[ids]], own[ids] if r else None)
            a = game.scripted_answers(pd.DataFrame({"agent_id": ids}), turn, SETTINGS)
            status = np.where(ids % 10 == 0, "unparsed", "ok")
            a = np.where(status == "ok", a, np.nan)
            answers.append(a)
            partials.append(game.partial(pd.DataFrame(
                {"group_id": groups[ids], "guess": a, "status": status})))
        own = np.column_stack([own, np.concatenate(answers)])
        summary = pd.concat([summary, game.reduce(partials, r)], ignore_index=True)
    return own, summary


def test_scripted_answers_are_valid_answers(game) -> None:
    own, _ = play(game, 3)
    low, high = game.answer().bounds
    valid = own[~np.isnan(own)]
    assert valid.min() >= low and valid.max() <= high


def test_the_reduce_is_exact_whatever_the_partitions(game) -> None:
    _, summary = play(game, 2, partitions=1)
    _, again = play(game, 2, partitions=5)
    # Scripted draws depend on the partition; replay the same rows split differently.
    rng = np.random.default_rng(0)
    answers = rng.integers(0, 21, N).astype(float)
    rows = pd.DataFrame({"group_id": rng.permutation(N) % 40, "guess": answers,
                         "status": rng.choice(["ok", "ok", "error"], N)})
    rows.loc[rows["status"] != "ok", "guess"] = np.nan
    whole = game.reduce([game.partial(rows)], 0)
    split = game.reduce([game.partial(rows.iloc[i]) for i in
                         np.array_split(np.arange(N), 6)], 0)
    pd.testing.assert_frame_equal(whole, split)
    assert tuple(whole.columns) == game.summary_columns
    assert whole["group_id"].is_monotonic_increasing and whole["n"].sum() == N
    assert tuple(summary.columns) == tuple(again.columns) == game.summary_columns


def test_each_group_is_told_its_own_feedback(game) -> None:
    _, summary = play(game, 2)
    table = game.feedback_table(summary, int(summary["group_id"].max()) + 1, 2)
    assert sorted(summary["round"].unique()) == [1, 2]  # a summary numbers rounds from 1
    told = table[summary["group_id"], summary["round"] - 1]
    np.testing.assert_array_equal(told, summary[game.feedback_column].to_numpy())


@pytest.mark.parametrize("style", ["completion", "chat"])
def test_prompts_share_the_prefix_and_grow_append_only(game, style) -> None:
    config = game.config
    own, summary = play(game, 3)
    groups = np.arange(N) % (N // config.group_size)
    feedback = game.feedback_table(summary, int(groups.max()) + 1, 3)[groups]
    builder = PromptBuilder(config, style)
    histories = game.histories(own, feedback)
    assert game.histories(None, feedback[:, :0]) is None
    if style == "chat":
        messages = builder.render("A nurse.", histories[1], 3)
        assert messages[0]["content"] == builder.system and "A nurse." in messages[1]["content"]
        return
    prompts = [builder.render(p, h[:r], r)
               for p, h in zip(["A nurse.", None], histories[:2], strict=True) for r in range(4)]
    assert os.path.commonprefix(prompts) == builder.prefix
    if game.prompt_texts("").split_history is None:
        for r in range(1, 3):  # round r+1's prompt extends round r's up to its round line
            earlier = builder.render("A.", histories[5][:r], r)
            later = builder.render("A.", histories[5][:r + 1], r + 1)
            assert later.startswith(earlier[:earlier.index(f"Round {r + 1} of")].rstrip("\n"))
        return
    # Split: agents of one group share everything up to the round line (what they were
    # told included); only their own answers follow it.
    same_group = np.nonzero(groups == groups[5])[0]
    a, b = (builder.render("A.", histories[i], 3) for i in same_group[:2])
    assert "Round 4 of" in os.path.commonprefix([a, b])


def test_the_answer_format_admits_exactly_the_range(game) -> None:
    answer = game.answer()
    low, high = (int(b) for b in answer.bounds)
    texts = [f" {v}" for v in range(low, high + 1)]
    values, statuses = answer.parse_many(texts)
    assert (statuses == "ok").all() and values.tolist() == list(range(low, high + 1))
    assert all(answer.language().is_complete(t) for t in texts)
    assert not answer.language().is_prefix(f" {high + 1}")


def test_what_is_shown_of_a_round(game) -> None:
    _, summary = play(game, 3)
    rows0 = summary[summary["round"] == 1]
    numbers = game.round_numbers(rows0)
    assert numbers["mean"] is not None and game.round_text(rows0, numbers)
    assert game.reference_text(0) and game.describe()
    by_round = game.summary_by_round(summary)
    assert list(by_round.index) == [1, 2, 3]
    chart = game.round_chart()
    rounds_rows = pd.DataFrame({"round": np.repeat([1, 2, 3], N), "guess": 5.0,
                                "status": "ok"})
    table = game.report_rounds(rounds_rows, summary)
    assert table["round"].tolist() == [1, 2, 3]
    for column, _ in chart.series:
        assert column in table.columns
    mark = game.round_mark(by_round.iloc[0].to_dict())
    low, high = game.answer().bounds
    assert mark is not None and low <= mark[1] <= high and low <= game.equilibrium() <= high
    assert game.describe_scripted(SETTINGS) and game.variant()
    run = game.report_run(table)
    assert "prompt" in run
    for ref in game.report_references("r", table):
        assert ref.citation and all(set(rec) == set(ref.columns) for rec in ref.records)


def test_a_run_json_game_table_gives_the_game_back(config) -> None:
    game = game_from_dict(config.model_dump(mode="json"))
    assert type(game) is type(game_for(config)) and game.config == config
    human = game_for(config.model_copy(update={"rounds": 10})).human_reference()
    assert human is not None and "American Economic Review" in human.citation


def test_histogram_bins_cover_the_answer_range(game) -> None:
    answer = game.answer()
    low, high = answer.bounds
    edges = answer.bin_edges(20)
    assert edges[0] <= low and edges[-1] >= high and np.all(np.diff(edges) > 0)
    if answer.integer:  # one bin per whole number: 0..20 -> 21 bins centred on them
        assert len(edges) - 1 == high - low + 1 and edges[0] == low - 0.5
    else:
        assert len(edges) == 21


def test_scripted_settings_read_from_a_stored_table() -> None:
    settings = ScriptedSettings.from_table({"tau": 2.0, "latency_s": 0.5,
                                            "depth_shift": {"education": {"Ph.D.": 1.0}}})
    assert settings == ScriptedSettings(tau=2.0, depth_shift={"education": {"Ph.D.": 1.0}})
    assert game_for(BeautyContestConfig()).describe_scripted(settings) == "tau 2.0"
    assert game_for(BeautyContestConfig()).scripted_attributes(settings) == {"education"}
    assert game_for(PublicGoodsConfig()).scripted_attributes(settings) == set()
