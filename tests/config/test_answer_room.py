"""``agents.max_tokens`` must hold the game's longest basic answer.

An answer drawn from a shared distribution ends at the token limit like a finished one:
with ``max_tokens = 2`` every quickstart agent answered one digit (" 4" for " 42"), round 1
mean 3.42 where 4 and the default 6 give 43.80, and nothing said so. A sampled call's cut
is flagged "truncated"; the walk's could not be told from a short answer. So the config
refuses a limit below the characters of the longest answer, which no tokenizer exceeds.
"""

from __future__ import annotations

import pytest

from simpipe.config.model import ConfigError, load_config
from simpipe.games.answer_format import IntegerAnswers

from support import REPO

QUICKSTART = REPO / "examples" / "quickstart.toml"
MIXED = REPO / "examples" / "mixed-population.toml"


@pytest.mark.parametrize("low,high,longest", [
    (0, 100, " 100"), (0, 20, " 20"), (-100, 5, " -100"), (0, 9.5, " 10"), (-3, 1000, " 1000"),
])
def test_the_longest_answer_is_the_widest_bound_with_its_space(low, high, longest):
    language = IntegerAnswers(low, high)
    assert language.longest() == longest and language.is_complete(longest)


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_a_limit_below_the_longest_answer_is_refused_naming_key_and_fix(max_tokens):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [f"agents.max_tokens={max_tokens}"])
    text = str(err.value)
    assert len(text.splitlines()) == 1
    assert f"agents.max_tokens = {max_tokens} is below the 4 characters" in text
    assert "' 100'" in text and "set it to 4 or more" in text


def test_the_limit_follows_the_games_range():
    assert load_config(QUICKSTART, ["agents.max_tokens=4"]).agents.max_tokens == 4
    with pytest.raises(ConfigError, match="is below the 5 characters of this game's longest "
                                          "answer, ' 1000'"):
        load_config(QUICKSTART, ["agents.max_tokens=4", "game.high=1000"])
    public_goods = REPO / "examples" / "public-goods-llm.toml"
    assert load_config(public_goods, ["agents.max_tokens=3"]).agents.max_tokens == 3
    with pytest.raises(ConfigError, match="below the 3 characters .* ' 20'"):
        load_config(public_goods, ["agents.max_tokens=2"])


def test_chain_of_thought_and_rule_based_agents_are_not_held_to_it():
    # Chain of thought spends ``cot_max_tokens`` and flags a cut answer; scripted agents
    # have no tokens at all.
    assert load_config(QUICKSTART, ["agents.max_tokens=2", "game.prompt=cot"])
    assert load_config(REPO / "examples" / "scripted.toml", ["agents.max_tokens=1"])


def test_a_mixed_population_names_the_table_that_sets_the_limit(tmp_path):
    text = MIXED.read_text()
    assert "temperature = 0.3\n" in text and "max_tokens = 6\n" in text
    override = tmp_path / "override.toml"
    override.write_text(text.replace("temperature = 0.3\n", "temperature = 0.3\nmax_tokens = 2\n"))
    key = r'agents\.by\.model\."gemma-t0\.3"\.max_tokens'
    with pytest.raises(ConfigError, match=rf"toml: {key} = 2 is below the 4 characters"):
        load_config(override)
    # A group that inherits the limit points at [agents]; the scripted group never counts.
    inherited = tmp_path / "inherited.toml"
    inherited.write_text(text.replace("max_tokens = 6\n", "max_tokens = 3\n").replace(
        "temperature = 0.3\n", "temperature = 0.3\nmax_tokens = 9\n"))
    with pytest.raises(ConfigError, match=r"toml: agents\.max_tokens = 3 is below"):
        load_config(inherited)
    scripted_only = tmp_path / "scripted_low.toml"
    scripted_only.write_text(text.replace('scripted = { tau = 1.5 }\n',
                                          'scripted = { tau = 1.5 }\nmax_tokens = 1\n'))
    assert load_config(scripted_only)
