"""Persona templates: ``str.format``-style text over attribute names, rendered per column.

Rendering goes column by column in Arrow (cast each placeholder's column to text, then one
element-wise join), never row by row in Python: a million personas take well under a
second and stay out of the Python heap until pandas needs them.

A value that ends a sentence itself is not given a second full stop: with the template's
"... education is {education}." the value "Ph.D." reads "Ph.D.", not "Ph.D..". Where a
placeholder is followed by a literal starting with ".", that "." is left out for the
values ending in ".", "!" or "?" (``TERMINAL``).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_FORMATTER = string.Formatter()
#: Characters that end a sentence: a value ending in one takes no "." after it.
TERMINAL = ".!?"


def template_fields(template: str) -> list[str]:
    """Placeholder names in order of first use; ValueError for anything but ``{name}``."""
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"not a valid template ({exc}); "
                         "write literal braces as {{ }}") from None
    names: list[str] = []
    for _literal, name, spec, conversion in parts:
        if name is None:
            continue
        if not name:
            raise ValueError("empty placeholder {}: name an attribute, e.g. {age}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}}: only plain {{name}} placeholders "
                             "are supported")
        if name not in names:
            names.append(name)
    return names


def default_template(attributes: Sequence[str]) -> str:
    """``"About yourself: age: {age}; education: {education}."`` for the given names."""
    if not attributes:
        return ""
    listed = "; ".join(f"{name.replace('_', ' ')}: {{{name}}}" for name in attributes)
    return f"Your profile: {listed}."


def _as_text(column: pd.Series) -> pa.Array:
    if isinstance(column.dtype, pd.CategoricalDtype):
        # Cast the few categories once, then take them by code.
        cats = pa.array([str(c) for c in column.cat.categories], type=pa.string())
        codes = pa.array(column.cat.codes.to_numpy(), mask=column.isna().to_numpy())
        return pc.take(cats, codes)
    array = pa.array(column.to_numpy() if column.dtype != object else column.tolist())
    return pc.cast(array, pa.string())


def render_template(template: str, frame: pd.DataFrame) -> pa.Array:
    """One persona per row of ``frame`` (an Arrow string array, in row order)."""
    n = len(frame)
    pieces: list[pa.Array | str] = []
    for literal, name, _spec, _conv in _FORMATTER.parse(template):
        if literal:
            if literal.startswith(".") and pieces and not isinstance(pieces[-1], str):
                # The stop only after values that do not end a sentence themselves.
                ends = pc.match_substring_regex(pieces[-1], f"[{TERMINAL}]$")
                pieces.append(pc.if_else(pc.fill_null(ends, False), "", "."))
                literal = literal[1:]
            if literal:
                pieces.append(literal)
        if name is not None:
            pieces.append(_as_text(frame[name]))
    if not pieces:
        return pa.array([""] * n, type=pa.string())
    if all(isinstance(p, str) for p in pieces):
        return pa.array(["".join(pieces)] * n, type=pa.string())  # type: ignore[arg-type]
    # The last argument of binary_join_element_wise is the separator.
    return pc.binary_join_element_wise(*pieces, "")


def render_one(template: str, record: dict) -> str:
    """One persona from one record (the LLM fallback path: a few rows at a time), as
    ``render_template`` renders it."""
    out: list[str] = []
    value = None  # the value rendered just before this literal
    for literal, name, _spec, _conv in _FORMATTER.parse(template):
        if value is not None and literal.startswith(".") and value.endswith(tuple(TERMINAL)):
            literal = literal[1:]
        out.append(literal)
        value = None
        if name is not None:
            value = str(record[name])
            out.append(value)
    return "".join(out)
