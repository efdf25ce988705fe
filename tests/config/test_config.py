"""Bad configs exit 2 with one line per problem naming the key; no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from simpipe.config.model import ConfigError, apply_override, load_config

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "examples" / "scripted.toml"


def validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simpipe.cli", "validate", *args],
                          capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("override,key,allowed", [
    ("game.foo=1", "game.foo", "allowed here"),
    ("population.colour=1", "population.colour", "allowed here"),
    ("game.rounds='three'", "game.rounds", "valid integer"),
    ("game.ratio=abc", "game.ratio", "fraction"),
    ("game.rounds=0", "game.rounds", "greater than or equal to 1"),
    ("population.size=0", "population.size", "greater than or equal to 1"),
    ("game.low=100", "game.low", "below game.high"),
    ("game.prompt=loud", "game.prompt", "'basic' or 'cot'"),
    ("agents.backend=magic", "agents.backend", "'scripted'"),
    ('population.attributes.education.values={a=0,b=0}', "education.values", "not all be zero"),
    ('population.attributes.education.values={a=-1,b=2}', "education.values", ">= 0"),
])
def test_bad_config_exits_2_naming_key_value_and_allowed(override, key, allowed):
    proc = validate(str(SCRIPTED), "--set", override)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert key in lines[0] and allowed in lines[0]


def test_bad_value_is_echoed():
    proc = validate(str(SCRIPTED), "--set", "game.ratio=abc")
    assert "'abc'" in proc.stderr


def test_toml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[game]\nrounds = = 3\n")
    proc = validate(str(bad))
    assert proc.returncode == 2 and "bad.toml" in proc.stderr and "line 2" in proc.stderr


def test_missing_file():
    proc = validate("nope.toml")
    assert proc.returncode == 2 and "nope.toml" in proc.stderr


def test_valid_config_and_overrides():
    proc = validate(str(SCRIPTED), "--set", "game.rounds=5")
    assert proc.returncode == 0, proc.stderr
    assert "5 rounds" in proc.stdout
    config = load_config(SCRIPTED, ["game.rounds=5", "run.name=other", "game.ratio=0.51"])
    assert (config.game.rounds, config.run.name, config.game.ratio_value) == (5, "other", 0.51)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "game.rounds")
    with pytest.raises(ConfigError, match="not a section"):
        apply_override({"game": 3}, "game.rounds=2")


def test_results_hash_ignores_where_it_runs():
    a = load_config(SCRIPTED)
    b = load_config(SCRIPTED, ["cluster.workers=4", "run.output_dir=/elsewhere"])
    c = load_config(SCRIPTED, ["game.rounds=4"])
    assert a.results_hash() == b.results_hash() != c.results_hash()
