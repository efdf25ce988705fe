"""The meta-prompt that turns a sampled record into an LLM-written persona, and the checks
its output must pass.

The default generator is a small base model (Gemma 3 270M), so the prompt is a plain
completion: a one-line task statement, three worked examples, then the agent's record and
the start of its persona block. What the record already fixes (age, gender) opens the
block in our words ("I am a 34-year-old woman. My name is"), so the model only adds a name
and a description; the checks then catch text that contradicts the record (another age,
the other gender), runaway text (no end marker, too long) and empty or echoed output.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

BEGIN = "BEGIN PERSONA"
END = "END PERSONA"
PROMPT_VERSION = "2"  # bump when the wording below changes: it is part of the cache key
CHECKS_VERSION = "1"  # bump when check_output accepts different text: also in the cache key

_INTRO = (
    "Each record below describes one person as JSON. The person introduces themselves "
    f"between {BEGIN} and {END}: their age and gender, their full name, then their "
    "personality and daily life in two or three sentences."
)

# (record, name, description): the opening sentence comes from the record.
_EXAMPLES = (
    ({"gender": "female", "age": 29, "occupation": "Nurse"}, "Maria Lopez",
     "I work night shifts at a city hospital. I am calm under pressure, warm with patients "
     "and careful with details."),
    ({"gender": "male", "age": 52, "occupation": "Carpenter"}, "Thomas Becker",
     "I run a small workshop and build furniture by hand. I am practical and patient, and I "
     "prefer plain talk to theory."),
    ({"gender": "female", "age": 41, "occupation": "Economist"}, "Aiko Tanaka",
     "I study inflation at a central bank. I am analytical and a little shy, and I spend my "
     "weekends hiking with my two dogs."),
)

_FEMALE = {"female", "woman", "f", "girl"}
_MALE = {"male", "man", "m", "boy"}
_FEMALE_WORDS = re.compile(r"\b(she|her|hers|herself|woman|girl|wife|mother|daughter)\b", re.I)
_MALE_WORDS = re.compile(r"\b(he|him|his|himself|man|boy|husband|father|son)\b", re.I)
_AGE = re.compile(r"\b(\d{1,3})[- ]years?[- ]old\b|\baged? (\d{1,3})\b", re.IGNORECASE)
_NAME = re.compile(r"[A-Z][\w'-]*(?: [A-Z][\w'.-]*){1,3}")
NAME_CUE = "My name is"


@dataclass(frozen=True)
class Checked:
    """A validated persona (``text``) or why the output was rejected (``reason``)."""

    text: str | None
    reason: str | None = None


def _gender_of(label: object) -> str | None:
    text = str(label).strip().lower()
    if text in _FEMALE:
        return "female"
    if text in _MALE:
        return "male"
    return None


def opening(record: dict, age_key: str | None, gender_key: str | None) -> str:
    """``"I am a 34-year-old woman. My name is"``: the record's facts, then the name cue."""
    noun = "person"
    if gender_key and gender_key in record:
        gender = _gender_of(record[gender_key])
        noun = {"female": "woman", "male": "man"}.get(gender or "", f"{record[gender_key]} person")
    if age_key and age_key in record:
        age = str(record[age_key])
        article = "an" if age.startswith("8") or age in ("11", "18") else "a"
        about = f"I am {article} {age}-year-old {noun}."
    else:
        about = f"I am a {noun}."
    return f"{about} {NAME_CUE}"


def _block_start(record: dict, age_key: str | None, gender_key: str | None) -> str:
    record_json = json.dumps(record, ensure_ascii=False, default=str)
    return f"Record: {record_json}\n{BEGIN}\n{opening(record, age_key, gender_key)}"


def _prefix() -> str:
    parts = [_INTRO, ""]
    for record, name, description in _EXAMPLES:
        parts.append(f"{_block_start(record, 'age', 'gender')} {name}. {description}")
        parts.append(END)
        parts.append("")
    return "\n".join(parts)


_PREFIX = _prefix()
_EXAMPLE_NAMES = frozenset(name for _record, name, _description in _EXAMPLES)


def build_prompt(record: dict, age_key: str | None, gender_key: str | None) -> str:
    """The completion prompt for one record; the shared examples come first (prefix cache)."""
    return _PREFIX + "\n" + _block_start(record, age_key, gender_key)


def stop_sequences() -> tuple[str, ...]:
    return (END,)


def prompt_hash() -> str:
    """Identifies the meta-prompt wording (part of the population cache key)."""
    text = json.dumps([PROMPT_VERSION, CHECKS_VERSION, _PREFIX, BEGIN, END])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_output(text: str | None, finish_reason: str | None, record: dict, *,
                 age_key: str | None, gender_key: str | None,
                 min_chars: int, max_chars: int) -> Checked:
    """Validate one generation (the text after the prompt's name cue) and build the persona.

    The end marker is the stop sequence, so a server that strips it shows its presence as
    ``finish_reason == "stop"``; one that keeps it shows it in the text.
    """
    if not text or not text.strip():
        return Checked(None, "empty")
    body, ended, _ = text.partition(END)
    if not ended and finish_reason != "stop":
        return Checked(None, "no end marker")
    body = body.strip()
    if "\n" in body:
        return Checked(None, "more than one paragraph")
    name, dot, description = body.partition(". ")
    if not dot or not _NAME.fullmatch(name) or len(name) > 60:
        return Checked(None, "no name")
    if name in _EXAMPLE_NAMES:
        return Checked(None, "copies an example's name")
    description = description.strip()
    if not min_chars <= len(description) <= max_chars:
        return Checked(None, f"description length outside [{min_chars}, {max_chars}]")
    if BEGIN in body or "Record:" in body or "{" in body or NAME_CUE in description:
        return Checked(None, "echoes the prompt")
    if age_key and age_key in record:
        reason = _age_conflict(description, record[age_key])
        if reason:
            return Checked(None, reason)
    if gender_key and gender_key in record:
        gender = _gender_of(record[gender_key])
        fem, mal = len(_FEMALE_WORDS.findall(description)), len(_MALE_WORDS.findall(description))
        if (gender == "female" and mal > fem) or (gender == "male" and fem > mal):
            return Checked(None, "contradicts the gender")
    return Checked(f"{opening(record, age_key, gender_key)} {name}. {description}")


def _age_range(value: object) -> tuple[int, int] | None:
    """An integer age, or a band such as "25-34" / "65+"; None when it is neither."""
    text = str(value).strip()
    if re.fullmatch(r"\d{1,3}", text):
        return int(text), int(text)
    band = re.fullmatch(r"(\d{1,3})\s*[-–]\s*(\d{1,3})", text)
    if band:
        return int(band.group(1)), int(band.group(2))
    plus = re.fullmatch(r"(\d{1,3})\s*\+", text)
    return (int(plus.group(1)), 150) if plus else None


def _age_conflict(description: str, sampled: object) -> str | None:
    allowed = _age_range(sampled)
    if allowed is None:
        return None
    for match in _AGE.finditer(description):
        stated = int(match.group(1) or match.group(2))
        if not allowed[0] <= stated <= allowed[1]:
            return f"states age {stated}, record says {sampled}"
    return None
