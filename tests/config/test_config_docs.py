"""docs/config.md is what the config models generate, and the generator shows what a user
needs of each key: its type and allowed values, its default and its description."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, StrictInt

from simpipe.config.docs import REGENERATE, config_reference, undescribed_keys

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MD = ROOT / "docs" / "config.md"


def test_docs_config_md_is_what_the_models_generate():
    generated = config_reference()
    on_disk = CONFIG_MD.read_text(encoding="utf-8") if CONFIG_MD.exists() else ""
    if on_disk != generated:
        diff = "".join(list(difflib.unified_diff(
            on_disk.splitlines(keepends=True), generated.splitlines(keepends=True),
            "docs/config.md", "generated"))[:40])
        raise AssertionError(f"docs/config.md is out of date; regenerate it: {REGENERATE}\n"
                             f"{diff}")


def test_every_config_key_has_a_description():
    missing = undescribed_keys()
    assert not missing, ("config keys without Field(description=...) in their model: "
                         f"{missing}")


def test_the_documented_command_prints_the_reference():
    out = subprocess.run([sys.executable, "-m", "simpipe.config.docs"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert out == config_reference()


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Local(_Section):
    """Workers on this machine."""

    kind: Literal["local"] = "local"
    workers: StrictInt = Field(2, ge=1, description="worker processes")


class _Limits(_Section):
    """Per job."""

    memory: str = Field("2GB", description="per job")


class _Slurm(_Section):
    """Workers as SLURM jobs."""

    kind: Literal["slurm"] = "slurm"
    queue: str | None = Field(None, description="the partition")
    limits: _Limits = Field(_Limits(), description="what each job may use")


class _Demo(_Section):
    """A demo file."""

    size: StrictInt = Field(10, ge=1, le=100_000, description="how many | agents")
    share: FiniteFloat = Field(1e-4, gt=0, le=0.01, description="a share")
    mode: Literal["a", "b"] = Field("a", description="which mode")
    hosts: list[str] = Field(default_factory=lambda: ["h:1"], min_length=1)
    where: Annotated[_Local | _Slurm, Field(discriminator="kind")] = Field(
        _Local(), description="where it runs")


def test_a_key_shows_its_type_range_default_and_description():
    text = config_reference(_Demo, title="Demo")
    assert "| `size` | integer, 1 to 100,000 | `10` | how many \\| agents |" in text
    assert "| `share` | finite number, > 0 and <= 0.01 | `0.0001` | a share |" in text
    assert '| `mode` | one of `"a"`, `"b"` | `"a"` | which mode |' in text
    assert '| `hosts` | list of strings, at least 1 | `["h:1"]` |  |' in text


def test_a_union_keyed_on_kind_is_shown_once_per_kind_with_its_own_keys():
    text = config_reference(_Demo, title="Demo")
    local = text.index("\n### `[where]` kind `local`\n")
    slurm = text.index("\n### `[where]` kind `slurm`\n")
    assert "Where it runs." in text[:local]
    assert 'default: kind `local`' in text[:local]
    # Each kind's keys under its own heading, and only there.
    assert text.index("| `workers` |") in range(local, slurm)
    assert text.index("| `queue` |") > slurm
    assert "| `queue` |" not in text[local:slurm]
    assert "\n#### `[where.limits]` (kind `slurm`)\n" in text[slurm:]
    assert text.count("| `memory` |") == 1


def test_undescribed_keys_are_named_by_their_path():
    # A kind union's `kind` says which kind it is; every other key needs its description.
    assert undescribed_keys(_Demo) == ["hosts"]
