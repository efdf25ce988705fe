"""When a group of answers may be read as data: the one rule the report (every table, test,
figure), the console's lines and the web page apply.

A group (a run's round, an experiment's cell, the agents with one value of an attribute) is
*valid enough* when

- at most ``COMPARABLE_INVALID_SHARE`` (5%) of its answers are not valid (any status but
  ``ok``): past that the valid ones are a selection (the chains of thought short enough to
  finish, say), not the group's result; and
- it has at least ``MIN_N`` valid answers: fewer give no interval and no test worth reading
  (one answer gives an interval of width zero).

A group that is not valid enough is still shown, with its n and a flag saying why, but no
interval, no test and no comparison with human or published numbers is drawn from it.

Which answers come from a model: ``ANSWER_SOURCES``. ``synthetic`` answers (emulated GPU
servers, the stub server) are made up by a stand-in for a model: they measure the pipeline,
not behaviour, and are never set beside human data or published LLM numbers. ``rule-based``
answers (the scripted back-end) come from a behavioural model (a cognitive hierarchy fitted
to human data): a model of behaviour, not noise, so they are compared like a model's.
"""

from __future__ import annotations

import math

#: The largest share of invalid answers a group may have to be read as data.
COMPARABLE_INVALID_SHARE = 0.05
#: The smallest share of valid answers (the same rule, said the other way round).
MIN_VALID_SHARE = 1.0 - COMPARABLE_INVALID_SHARE
#: The fewest valid answers that give an interval or a test.
MIN_N = 10

#: Where a run's answers come from (run.json's ``answers_source``).
MODEL, SYNTHETIC, RULE_BASED = "model", "synthetic", "rule-based"
ANSWER_SOURCES = (MODEL, SYNTHETIC, RULE_BASED)
#: Why synthetic answers are never set beside published numbers.
SYNTHETIC_WHY = ("its answers are synthetic (made up by emulated or stub servers, not a "
                 "model): they measure the pipeline, not behaviour")


def problem(n: int, n_valid: int) -> str | None:
    """Why a group of ``n`` answers, ``n_valid`` of them valid, is not valid enough (a short
    flag for a table cell); None when it is."""
    n, n_valid = int(n), int(n_valid)
    if n <= 0 or n_valid <= 0:
        return "no valid answers"
    if n - n_valid > COMPARABLE_INVALID_SHARE * n:
        return (f"only {n_valid:,} of {n:,} answers valid ({n_valid / n:.0%}; needs "
                f"{MIN_VALID_SHARE:.0%})")
    if n_valid < MIN_N:
        return f"only {n_valid:,} valid answers (needs {MIN_N})"
    return None


def valid_enough(n: int, n_valid: int) -> bool:
    return problem(n, n_valid) is None


def flags(n: object, n_valid: object) -> tuple[list[bool], list[str]]:
    """``valid_enough`` and ``flag`` ("" where valid enough) for columns of counts."""
    pairs = [(int(a) if _finite(a) else 0, int(b) if _finite(b) else 0)
             for a, b in zip(n, n_valid, strict=True)]  # type: ignore[call-overload]
    found = [problem(a, b) for a, b in pairs]
    return [p is None for p in found], [p or "" for p in found]


def _finite(value: object) -> bool:
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def source_label(source: str) -> str:
    """A run's answers in a few words, "" for a model's (the usual case says nothing)."""
    return {SYNTHETIC: "synthetic answers", RULE_BASED: "rule-based answers"}.get(source, "")
