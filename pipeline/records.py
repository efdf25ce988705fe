"""Files simpipe wrote, read back as untrusted input: ``CorruptFile`` names the file and what
is wrong with it, and ``read_json_record`` checks a JSON file against the shape simpipe
writes. Below the packages that read such files (a run's ``run.json`` in
``simpipe.store``, a persistent cluster's state in ``simpipe.cluster.state``), so both name a
bad file the same way without importing each other.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simpipe.errors import SimpipeError


class CorruptFile(SimpipeError, ValueError):
    """A file that is missing, unreadable or not what simpipe wrote there."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def shown_under(self, root: Path) -> str:
        """The message with the path relative to ``root`` (e.g. the run directory)."""
        try:
            return f"{self.path.relative_to(root)}: {self.problem}"
        except ValueError:
            return str(self)


def error_reason(exc: BaseException) -> str:
    """The first sentence of a library's error, without the path we already name."""
    text = re.sub(r"Could not open Parquet input source '[^']*': ", "", str(exc)).strip()
    first = re.split(r"(?<=[a-z])\. |\n", text, maxsplit=1)[0].rstrip(".")
    return first or type(exc).__name__


NonNegative = Annotated[int, Field(ge=0)]
ProcessId = Annotated[int, Field(ge=1)]  # never 0 or negative: os.kill would reach a group


class StrictRecord(BaseModel):
    """The shape of a JSON record as simpipe writes it. Strict: "12" is not a count and true
    is not a number; unknown keys are kept as they are."""

    model_config = ConfigDict(strict=True, extra="allow")


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, as ``field: what is wrong (found value)``."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if p != "[key]")
    got = repr(err.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    return f"{where}: {err['msg'].lower()} (found {got})"


def read_json_record(path: Path, model: type[StrictRecord], max_bytes: int) -> dict[str, Any]:
    """A JSON object file as a dict whose fields have ``model``'s types; CorruptFile when it
    is missing, bigger than ``max_bytes``, not a JSON object or a field has the wrong type."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise CorruptFile(path, f"{size:,} bytes, more than such a file holds ({max_bytes:,})")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    except UnicodeDecodeError:
        raise CorruptFile(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise CorruptFile(path, f"not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except (OSError, RecursionError) as exc:
        raise CorruptFile(path, f"unreadable ({error_reason(exc)})") from None
    if not isinstance(data, dict):
        raise CorruptFile(path, f"a JSON {_JSON_KINDS.get(type(data), 'value')}, "
                                "expected an object")
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise CorruptFile(path, first_error(exc)) from None
    return data
