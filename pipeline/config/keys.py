"""Dotted config keys (``game.rounds``), as ``--set``, experiment grids and error messages
write them.

A part is a TOML key: bare (letters, digits, ``_`` and ``-``), or quoted where a name holds
anything else, as a mixed population's values may (``agents.by.model."gemma-t0.3".
temperature``: split on every dot, ``gemma-t0`` and ``3"`` were read as two nested keys).
A key without quotes is split on its dots as it always was, so a part with a space
(``...values.High School``) keeps working unquoted.
"""

from __future__ import annotations

import re
import tomllib

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def split_key(key: str) -> list[str]:
    """The parts of ``key``: TOML's reading of a key with quotes (``a."b.c"`` -> a, b.c),
    else the text between its dots."""
    if '"' not in key and "'" not in key:
        return key.split(".")
    try:
        node: object = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        return key.split(".")
    parts = []
    while isinstance(node, dict):
        (part, node), = node.items()
        parts.append(part)
    return parts


def joined_key(*parts: str) -> str:
    """The dotted key of ``parts``, quoting a part that is not a bare TOML key, so that an
    error message's key can be given back to ``--set`` as printed."""
    return ".".join(part if _BARE.fullmatch(part) else f'"{part}"' for part in parts)
