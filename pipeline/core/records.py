"""Files simpipe wrote, read back as untrusted input: ``CorruptFile`` names the file and what
is wrong with it; ``read_bounded`` reads a regular file of bounded size (never a FIFO or a
device, never without end), and ``read_json_object`` / ``read_json_model`` /
``read_json_record`` check a JSON file against the shape simpipe writes. Below the packages
that read such files (a run's ``run.json`` in ``simpipe.store``, a persistent cluster's state
in ``simpipe.cluster.state``, the config file), so all name a bad file the same way without
importing each other.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simpipe.core.errors import SimpipeError

M = TypeVar("M", bound=BaseModel)


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


_FILE_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISDIR, "a directory"))


def first_error(exc: ValidationError) -> str:
    """A validation error as one line: the field, what is wrong, what was found."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if p != "[key]")
    got = repr(err.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    if not where:  # a rule across fields (a model validator): its message says it all
        return str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":  # a closed record: the key itself is the problem
        return f"{where}: unknown key {str(err['loc'][-1])!r}, not one simpipe writes there"
    return f"{where}: {err['msg'].lower()} (found {got})"


def _not_regular(path: Path, mode: int) -> CorruptFile:
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a plain file")
    return CorruptFile(path, f"not a regular file ({kind})")


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (a symlink to one is fine) of at most
    ``max_bytes``; CorruptFile otherwise. Never blocks and never reads without end: a FIFO
    or a device (a symlink to /dev/zero) is refused before it is opened, the open does not
    wait for a FIFO's writer (one swapped in after the check is caught by ``fstat``), and at
    most ``max_bytes + 1`` bytes are read (a file that grows while read)."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):  # refused unopened: opening some devices has effects
            raise _not_regular(path, mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    except OSError as exc:
        raise CorruptFile(path, f"unreadable ({exc.strerror or error_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, info.st_mode)
        if info.st_size > max_bytes:
            raise CorruptFile(path, f"{info.st_size:,} bytes, more than such a file holds "
                                    f"({max_bytes:,})")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise CorruptFile(path, f"unreadable ({exc.strerror or error_reason(exc)})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise CorruptFile(path, f"more than {max_bytes:,} bytes, more than such a file holds")
    return data


def read_json_object(path: Path, max_bytes: int) -> dict[str, Any]:
    """A JSON object file (``read_bounded``); CorruptFile when it is missing, not a regular
    file, bigger than ``max_bytes`` or not a JSON object."""
    raw = read_bounded(path, max_bytes)
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise CorruptFile(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise CorruptFile(path, f"not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise CorruptFile(path, "not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise CorruptFile(path, f"a JSON {_JSON_KINDS.get(type(data), 'value')}, "
                                "expected an object")
    return data


def read_json_model(path: Path, model: type[M], max_bytes: int) -> M:
    """A JSON object file validated as ``model``; CorruptFile naming the file and the first
    field that is wrong (``read_json_object`` for the rest)."""
    data = read_json_object(path, max_bytes)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise CorruptFile(path, first_error(exc)) from None


def read_json_record(path: Path, model: type[StrictRecord], max_bytes: int) -> dict[str, Any]:
    """A JSON object file as a dict whose fields have ``model``'s types; CorruptFile when
    it is missing, not a regular file, bigger than ``max_bytes``, not a JSON object or a
    field has the wrong type."""
    data = read_json_object(path, max_bytes)
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise CorruptFile(path, first_error(exc)) from None
    return data
