"""Template personas: placeholders checked at config time, rendering vectorised."""

import pandas as pd
import pytest

from simpipe.config.model import ConfigError, config_from_dict
from simpipe.personas.config import PopulationConfig
from simpipe.personas.sampling import sample_partition
from simpipe.personas.templates import (
    default_template,
    render_one,
    render_template,
    template_fields,
)

ATTRS = {"education": {"values": {"High School": 1, "Ph.D.": 1}}, "age": {"min": 18, "max": 80}}


def config(**persona):
    return {"population": {"size": 10, "attributes": ATTRS, "persona": persona}}


def test_fields_in_order_of_use():
    assert template_fields("{b} and {a} then {b}; {{literal}}") == ["b", "a"]


@pytest.mark.parametrize("template,message", [
    ("You are {agee} years old.", r"population.persona.template: placeholders \['agee'\]"),
    ("{age:d}", "only plain {name} placeholders"),
    ("{}", "empty placeholder"),
    ("{age", "not a valid template"),
])
def test_bad_templates_are_config_errors_naming_the_key(template, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(config(mode="template", template=template))


def test_unknown_mode_names_the_allowed_values():
    with pytest.raises(ConfigError, match=r"population.persona.mode.*'none', 'template' or 'llm'"):
        config_from_dict(config(mode="chatty"))


def test_render_matches_str_format_row_by_row():
    population = PopulationConfig(size=50, partitions=1, attributes=ATTRS)
    frame = sample_partition(population, 1, 0)
    template = "Agent {agent_id}: a {age}-year-old with {education}; {{braces}} stay."
    rendered = render_template(template, frame).to_pylist()
    expected = [template.format(**row) for row in frame.to_dict("records")]
    assert rendered == expected


def test_a_value_ending_a_sentence_takes_no_second_full_stop():
    # The quickstart's template ends "... education is {education}."; "Ph.D." read "Ph.D..".
    population = PopulationConfig(size=60, partitions=1, attributes={
        "education": {"values": {"High School": 1, "Ph.D.": 1, "What?": 1}},
        "gender": {"values": {"female": 1, "male": 1}}})
    frame = sample_partition(population, 1, 0)
    template = ("You are a {gender} person whose highest level of education is {education}. "
                "Really {education}...")
    rendered = render_template(template, frame).to_pylist()
    for text, row in zip(rendered, frame.to_dict("records"), strict=True):
        education = row["education"]
        stop = "" if education in ("Ph.D.", "What?") else "."
        assert text == (f"You are a {row['gender']} person whose highest level of education is "
                        f"{education}{stop} Really {education}{stop}..")
        assert render_one(template, row) == text  # the LLM fallback's path renders alike
    assert {"High School", "Ph.D.", "What?"} <= set(frame["education"].astype(str))
    assert not any(".." in t.split(" Really")[0] for t in rendered)


def test_default_template_names_every_attribute():
    assert (default_template(["age", "home_town"])
            == "Your profile: age: {age}; home town: {home_town}.")
    frame = pd.DataFrame({"x": [1, 2]})
    assert render_template("no placeholders", frame).to_pylist() == ["no placeholders"] * 2


def test_attributes_in_prompt_follow_the_persona_mode() -> None:
    from simpipe.personas.config import PopulationConfig

    attributes = {"education": {"values": {"a": 1, "b": 1}}, "age": {"min": 18, "max": 80},
                  "gender": {"values": {"f": 1, "m": 1}}}

    def population(**persona) -> PopulationConfig:
        return PopulationConfig.model_validate({"attributes": attributes, "persona": persona})

    assert population(mode="none").attributes_in_prompt == []
    assert population(mode="template", template="You are {gender}, {age}.") \
        .attributes_in_prompt == ["age", "gender"]  # config order
    assert population(mode="template").attributes_in_prompt == ["education", "age", "gender"]
    assert population(mode="llm").attributes_in_prompt == ["education", "age", "gender"]
