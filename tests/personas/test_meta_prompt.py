"""The meta-prompt and the checks on what the generator writes (plain Python)."""

import pytest

from simpipe.personas import meta_prompt as mp

RECORD = {"gender": "female", "age": 34, "education": "Ph.D."}


def check(text, finish="stop", record=RECORD, lo=20, hi=300):
    return mp.check_output(text, finish, record, age_key="age", gender_key="gender",
                           min_chars=lo, max_chars=hi)


def test_prompt_is_a_completion_ending_in_the_record_and_the_name_cue():
    prompt = mp.build_prompt(RECORD, "age", "gender")
    assert prompt.endswith('Record: {"gender": "female", "age": 34, "education": "Ph.D."}\n'
                           "BEGIN PERSONA\nI am a 34-year-old woman. My name is")
    assert prompt.count(f"\n{mp.END}\n") == 3  # closes the worked examples, never the open block
    assert mp.stop_sequences() == (mp.END,)


def test_opening_without_age_or_gender():
    assert mp.opening({"x": 1}, None, None) == "I am a person. My name is"
    assert mp.opening({"g": "non-binary"}, None, "g") == "I am a non-binary person. My name is"
    assert mp.opening({"age": 80}, "age", None) == "I am an 80-year-old person. My name is"


def test_a_good_persona_is_kept_with_the_record_facts():
    out = check(" Lena Hart. I teach statistics and I love long walks with my dog.\n")
    assert out.reason is None
    assert out.text == ("I am a 34-year-old woman. My name is Lena Hart. I teach statistics "
                        "and I love long walks with my dog.")


@pytest.mark.parametrize("text,finish,reason", [
    ("", "stop", "empty"),
    (" Lena Hart. I teach statistics and I love walks.", "length", "no end marker"),
    ("\nMy name is\nMy name is", "stop", "more than one paragraph"),
    (" lena. I teach statistics and I love long walks.", "stop", "no name"),
    (" Lena Hart. Short.", "stop", "description length"),
    (" Lena Hart. I am 61 years old and I love long walks and chess.", "stop", "states age 61"),
    (" Lena Hart. He is a kind man who loves his long walks.", "stop", "contradicts the gender"),
    (' Lena Hart. Record: {"gender": "female"} BEGIN PERSONA again.', "stop", "echoes"),
])
def test_bad_outputs_are_rejected_with_a_reason(text, finish, reason):
    out = check(text, finish)
    assert out.text is None and reason in out.reason


def test_the_end_marker_in_the_text_counts_when_the_server_keeps_it():
    assert check(" Lena Hart. I teach statistics and love walks.\nEND PERSONA", None).text


def test_age_bands_are_ranges():
    record = {"age": "30-39", "gender": "male"}
    ok = mp.check_output(" Tom Li. I am 35 years old and I fix bikes for a living.", "stop",
                         record, age_key="age", gender_key="gender", min_chars=10, max_chars=300)
    bad = mp.check_output(" Tom Li. I am 45 years old and I fix bikes for a living.", "stop",
                          record, age_key="age", gender_key="gender", min_chars=10, max_chars=300)
    assert ok.text and bad.text is None


def test_prompt_hash_is_stable_and_short():
    assert mp.prompt_hash() == mp.prompt_hash() and len(mp.prompt_hash()) == 16


def test_a_name_copied_from_the_examples_is_rejected():
    out = check(" Aiko Tanaka. I teach statistics and I love long walks with my dog.")
    assert out.text is None and "example" in out.reason
