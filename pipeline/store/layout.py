"""Where a run's files live (README.md, "Results schema"); the only place paths are spelled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simpipe.files import TEMP_SUFFIX

PART_DIGITS = 5  # part-00003.parquet: lexical order is partition order


def part_name(partition: int) -> str:
    return f"part-{partition:0{PART_DIGITS}d}.parquet"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def population(self) -> Path:
        return self.root / "population"

    @property
    def rounds(self) -> Path:
        return self.root / "rounds"

    @property
    def summary(self) -> Path:
        return self.root / "summary.parquet"

    @property
    def ledger(self) -> Path:
        return self.root / "run.json"

    @property
    def log(self) -> Path:
        return self.root / "run.log"

    @property
    def cancel_flag(self) -> Path:
        return self.root / "CANCEL"

    def round_dir(self, round_index: int) -> Path:
        return self.rounds / f"round={round_index}"

    def round_part(self, round_index: int, partition: int) -> Path:
        return self.round_dir(round_index) / part_name(partition)

    def population_part(self, partition: int) -> Path:
        return self.population / part_name(partition)


# Everything simpipe writes at the top of a run folder, and nothing else: what `--force` may
# delete. Hidden ``.<name>.<id>.tmp`` files are atomic writes a killed run left behind.
#: A population build's spec, beside its parts (leading "_": Parquet readers skip it).
SPEC_FILE = "_population.json"

RUN_DIRS = frozenset({"population", "rounds", "report", "logs"})
RUN_FILES = frozenset({"summary.parquet", "run.json", "run.log", "CANCEL"})


def is_run_entry(path: Path) -> bool:
    """Whether ``path``, directly in a run folder, is one simpipe writes there."""
    if path.is_symlink():
        return False
    if path.name in RUN_DIRS:
        return path.is_dir()
    if path.name in RUN_FILES:
        return path.is_file()
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX) and path.is_file()


def population_cache(output_dir: Path, population_hash: str) -> Path:
    """Shared builds, one per population spec hash; runs link their population here."""
    return output_dir / ".populations" / population_hash
