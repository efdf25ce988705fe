"""One rule for setting a dotted key (``simpipe.config.model.set_key``): ``--set key=value`` and an
experiment grid's key give the same config from the same inputs; a value where a section is
expected is refused in both, naming the key (and, for a grid, the file, the cell and the
grid key); a table merges into the section already there; nothing the file wrote is lost."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simpipe.config.keys import joined_key, split_key
from simpipe.config.model import (
    ConfigError,
    apply_override,
    config_from_dict,
    load_config,
    set_key,
)
from simpipe.config.population_mix import resolve
from simpipe.run.experiment import experiment_from_dict

BASE: dict[str, Any] = {
    "run": {"name": "t", "seed": 5, "output_dir": "results"},
    "population": {"size": 200, "partitions": 2,
                   "persona": {"mode": "template", "template": "You are {education}.",
                               "temperature": 0.5},
                   "attributes": {"education": {"values": {"High School": 1, "Ph.D.": 1}}}},
    "game": {"rounds": 3, "ratio": "1/2", "offset": 1},
    "agents": {"backend": "scripted", "temperature": 0.7,
               "scripted": {"tau": 2.0, "noise": 0.5}},
}

# (key, value as TOML text for --set, the same value in Python for a grid)
CASES = [
    ("game.rounds", "4", 4),
    ("game.prompt", "cot", "cot"),  # a bare word is a string
    ("game", '{ratio="2/3"}', {"ratio": "2/3"}),  # merged: rounds and offset kept
    ("agents", "{scripted={tau=1.0}}", {"scripted": {"tau": 1.0}}),  # nested: noise kept
    ("agents.scripted", "{depth_growth=0.1}", {"depth_growth": 0.1}),
    ("population.persona", '{template="You hold a {education}."}',
     {"template": "You hold a {education}."}),
    ("population.attributes.education.values", "{BA=1,MA=3}", {"BA": 1, "MA": 3}),  # replaced
    ("population.attributes.education", "{values={BA=1}}", {"values": {"BA": 1}}),
    # another shape of attribute (numbers instead of labels): replaced
    ("population.attributes.education", "{min=1,max=5}", {"min": 1, "max": 5}),
    ("game", '{kind="beauty_contest", rounds=2}', {"kind": "beauty_contest", "rounds": 2}),
    ("game", '{kind="public_goods", rounds=2}', {"kind": "public_goods", "rounds": 2}),
    # a name with a dot is quoted as in TOML; one with a space still works unquoted
    ('population.attributes.education.values."Ph.D."', "3", 3),
    ("population.attributes.education.values.High School", "2", 2),
]


def _by_set(key: str, text: str) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    apply_override(raw, f"{key}={text}")
    return _comparable(config_from_dict(raw).model_dump(mode="json"))


def _by_grid(key: str, value: Any) -> dict[str, Any]:
    raw = {**copy.deepcopy(BASE), "experiment": {"name": "e", "grid": {key: [value]}}}
    [cell] = experiment_from_dict(raw, source="e.toml").cells
    return _comparable(cell.config.model_dump(mode="json"))


def _comparable(dumped: dict[str, Any]) -> dict[str, Any]:
    # A cell's run name and folder are the experiment's; the rest must be what --set gives.
    dumped["run"].pop("name")
    dumped["run"].pop("output_dir")
    return dumped


@pytest.mark.parametrize(("key", "text", "value"), CASES,
                         ids=[f"{k}={t}" for k, t, _ in CASES])
def test_set_and_a_grid_key_give_the_same_config(key: str, text: str, value: Any) -> None:
    assert _by_set(key, text) == _by_grid(key, value)


def test_a_table_merges_into_the_section_and_keeps_the_keys_it_does_not_name() -> None:
    game = _by_set("game", '{ratio="2/3"}')["game"]
    assert (game["ratio"], game["rounds"], game["offset"]) == ("2/3", 3, 1)
    agents = _by_set("agents", "{scripted={tau=1.0}}")["agents"]
    assert (agents["scripted"]["tau"], agents["scripted"]["noise"]) == (1.0, 0.5)
    assert (agents["backend"], agents["temperature"]) == ("scripted", 0.7)


def test_a_table_of_the_user_s_own_keys_is_replaced() -> None:
    # merged, a label could never be dropped; a dotted key still adds one
    values = _by_set("population.attributes.education.values", "{BA=1,MA=3}")
    assert values["population"]["attributes"]["education"]["values"] == {"BA": 1, "MA": 3}
    raw = copy.deepcopy(BASE)
    apply_override(raw, "population.attributes.education.values.MA=2")
    assert raw["population"]["attributes"]["education"]["values"] == {
        "High School": 1, "Ph.D.": 1, "MA": 2}
    raw = copy.deepcopy(BASE)
    apply_override(raw, 'population.attributes={age={values={"30"=1}}}')
    assert list(raw["population"]["attributes"]) == ["age"]


def test_a_table_of_another_kind_replaces_the_section() -> None:
    game = _by_set("game", '{kind="public_goods", rounds=2}')["game"]
    assert game["kind"] == "public_goods" and game["rounds"] == 2
    assert "ratio" not in game  # a key of the beauty contest's table, not of this game's
    raw = {"cluster": {"kind": "slurm", "queue": "gpu"}}
    apply_override(raw, 'cluster={kind="local", workers=2}')
    assert raw == {"cluster": {"kind": "local", "workers": 2}}
    # the kind the config has without naming one counts as its kind: merged
    raw = {"game": {"rounds": 3}}
    apply_override(raw, 'game={kind="beauty_contest", ratio="2/3"}')
    assert raw == {"game": {"rounds": 3, "kind": "beauty_contest", "ratio": "2/3"}}


def test_a_table_of_another_shape_replaces_the_section() -> None:
    # An attribute is labels (values) or a range (min, max): no one shape holds both, so
    # the table's shape wins, as a new kind does; a key of the same shape still merges.
    education = _by_set("population.attributes.education", "{min=1,max=5}")[
        "population"]["attributes"]["education"]
    assert (education["min"], education["max"]) == (1, 5) and not education.get("values")
    raw = copy.deepcopy(BASE)
    apply_override(raw, 'game={ratoi="2/3"}')  # a misspelled key is still an error
    with pytest.raises(ConfigError, match="ratoi"):
        config_from_dict(raw)


def test_nothing_already_written_is_lost() -> None:
    raw = copy.deepcopy(BASE)
    for item in ("game.rounds=4", "game={prompt=\"cot\"}", "population.persona.temperature=0.9",
                 "agents.scripted={tau=1.5}", "run.seed=7"):
        apply_override(raw, item)
    expected = copy.deepcopy(BASE)
    expected["game"].update(rounds=4, prompt="cot")
    expected["population"]["persona"]["temperature"] = 0.9
    expected["agents"]["scripted"]["tau"] = 1.5
    expected["run"]["seed"] = 7
    assert raw == expected


def test_the_value_set_is_a_copy() -> None:
    value = {"scripted": {"tau": 1.0}}
    raw: dict[str, Any] = {}
    set_key(raw, "agents", value, where="test")
    raw["agents"]["scripted"]["tau"] = 9.0
    assert value == {"scripted": {"tau": 1.0}}
    # a grid's table value is set into each cell's config, never shared between cells
    grid = {"game": [{"ratio": "2/3"}, {"ratio": "1/2", "offset": 5}],
            "agents.temperature": [0.1, 0.2]}
    raw = {**copy.deepcopy(BASE), "experiment": {"name": "e", "grid": grid}}
    experiment = experiment_from_dict(copy.deepcopy(raw), source="e.toml")
    games = [(c.config.game.ratio, c.config.game.offset, c.config.game.rounds,
              c.config.agents.temperature) for c in experiment.cells]
    assert games == [("2/3", 1, 3, 0.1), ("2/3", 1, 3, 0.2),
                     ("1/2", 5, 3, 0.1), ("1/2", 5, 3, 0.2)]


def test_a_value_where_a_section_is_expected_is_refused_by_set() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_override({"game": 3}, "game.rounds=2")
    assert str(caught.value) == (
        "--set 'game.rounds=2': 'game' is a value (3), not a section, so 'game.rounds' "
        "cannot be set in it; make game a table in the config ([game], or "
        "game = { rounds = ... })")
    with pytest.raises(ConfigError, match=r"'agents\.scripted' is a value \('x'\), not a "
                                          r"section, so 'agents\.scripted\.tau\.x'"):
        apply_override({"agents": {"scripted": "x"}}, "agents.scripted.tau.x=1")


def test_a_value_where_a_section_is_expected_is_refused_by_a_grid() -> None:
    raw = {**copy.deepcopy(BASE), "game": 3,
           "experiment": {"name": "e", "grid": {"game.rounds": [2, 4]}}}
    with pytest.raises(ConfigError) as caught:
        experiment_from_dict(raw, source="e.toml")
    [line] = str(caught.value).splitlines()  # one problem, one line, for both cells
    assert line == (
        "e.toml: experiment cell rounds-2 (and 1 more cell): experiment.grid key "
        "'game.rounds': 'game' is a value (3), not a section, so 'game.rounds' cannot be set "
        "in it; make game a table in the config ([game], or game = { rounds = ... })")


def test_the_cli_refuses_a_value_where_a_section_is_expected_in_one_line(
        tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('game = 3\n[agents]\nbackend = "scripted"\n', encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "simpipe.cli", "validate", str(path),
                           "--set", "game.rounds=2"], capture_output=True, text=True)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "--set 'game.rounds=2': 'game' is a value (3), not a section" in line
    assert "make game a table" in line
    assert proc.stdout == ""


def test_a_quoted_part_is_one_key_and_error_messages_quote_it_back() -> None:
    assert split_key('agents.by.model."gemma-t0.3".temperature') == [
        "agents", "by", "model", "gemma-t0.3", "temperature"]
    assert split_key("population.attributes.education.values.High School") == [
        "population", "attributes", "education", "values", "High School"]
    assert joined_key("agents", "by", "model", "gemma-t0.3") == 'agents.by.model."gemma-t0.3"'
    assert _by_set('population.attributes.education.values."Ph.D."', "3")["population"][
        "attributes"]["education"]["values"] == {"High School": 1, "Ph.D.": 3}
    # A mixed population's value named with a dot (examples/mixed-population.toml): --set
    # reaches its table, and the key an error prints is one --set takes as printed.
    example = Path(__file__).resolve().parents[2] / "examples" / "mixed-population.toml"
    key = 'agents.by.model."gemma-t0.3".temperature'
    config = load_config(example, [f"{key}=0.5"])
    assert resolve(config.agents, "gemma-t0.3").temperature == 0.5
    assert resolve(config.agents, "gemma-t1.0").temperature == 1.0
    with pytest.raises(ConfigError) as err:
        load_config(example, ['agents.by.model."gemma-t0.3".max_tokens=2'])
    printed = str(err.value).split(": ", 1)[1].split(" = ")[0]
    assert printed == 'agents.by.model."gemma-t0.3".max_tokens'
    assert resolve(load_config(example, [f"{printed}=5"]).agents, "gemma-t0.3").max_tokens == 5


def test_a_grid_over_a_quoted_key_names_its_cells_by_the_name_and_sees_overlaps() -> None:
    key = 'population.attributes.education.values."Ph.D."'
    raw = {**copy.deepcopy(BASE), "experiment": {"name": "e", "grid": {key: [2, 3]}}}
    cells = experiment_from_dict(raw, source="e.toml").cells
    assert [c.name for c in cells] == ["Ph.D.-2", "Ph.D.-3"]
    assert [c.config.population.attributes["education"].values["Ph.D."] for c in cells] == [2, 3]
    # The table of values beside one of its own names set twice is one key given twice.
    raw["experiment"]["grid"] = {"population.attributes.education.values": [{"Ph.D.": 1}],
                                 key: [2]}
    with pytest.raises(ConfigError, match="overlap"):
        experiment_from_dict(raw, source="e.toml")
