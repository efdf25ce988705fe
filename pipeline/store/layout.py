"""Where a run's files live (README.md, "Results schema"); the only place paths are spelled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simpipe.core.files import TEMP_SUFFIX

if TYPE_CHECKING:  # the CLI imports this module to name files: pandas is loaded where used
    import pandas as pd

PART_DIGITS = 5  # part-00003.parquet: lexical order is partition order

#: run.json's ``layout``: how a run lays out its files. 1 (a run.json without the field,
#: written first): rounds numbered from 0 on disk. 2: from 1, as the console, the prompts,
#: the report and Nagel's periods count them (the folders ``round=1``, ``round=2``, ...,
#: the ``round`` column of the rounds and of summary.parquet, run.json's round keys).
#: 3: as 2, and a round record in run.json keeps the game's own numbers in its
#: ``game_numbers`` instead of beside its fields (``simpipe.store.round_record``). Code
#: counts rounds from 0 (``round_index``); every reader gives a ``round`` column numbered
#: from 1, whatever the run's layout (``numbered_from_one``).
LAYOUT = 3
#: The first layout whose round records nest the game's numbers (``game_numbers``).
GAME_NUMBERS_NESTED = 3


def first_round(layout: int) -> int:
    """The number a run of this layout gives its first round on disk."""
    return 1 if layout >= 2 else 0


def layout_on_resume(layout: int) -> int:
    """The layout a resumed run of ``layout`` is saved in: the current one where that keeps
    its round numbering (the ledger rewrites every round record in the current form), its
    own otherwise (a run numbered from 0 goes on so)."""
    return LAYOUT if first_round(layout) == first_round(LAYOUT) else layout


def part_name(partition: int) -> str:
    return f"part-{partition:0{PART_DIGITS}d}.parquet"


@dataclass(frozen=True)
class RunPaths:
    root: Path
    #: The number of the first round on disk (``first_round(layout)``: 0 for runs written
    #: before rounds were numbered from 1); ``round_index`` arguments count from 0 always.
    first_round: int = 1

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
        return self.rounds / f"round={round_index + self.first_round}"

    def round_part(self, round_index: int, partition: int) -> Path:
        return self.round_dir(round_index) / part_name(partition)

    def population_part(self, partition: int) -> Path:
        return self.population / part_name(partition)


def numbered_from_one(frame: pd.DataFrame, first_round: int) -> pd.DataFrame:
    """``frame`` (the rows of a run's summary or rounds) with its ``round`` column numbered
    from 1 (int64 where it was the rounds' folder names), from a run whose first round is
    ``first_round`` on disk."""
    import pandas as pd

    if "round" not in frame:
        return frame
    rounds = frame["round"]
    if not pd.api.types.is_integer_dtype(rounds):
        rounds = rounds.astype("int64")
    return frame.assign(round=rounds + (1 - first_round))


def as_stored(frame: pd.DataFrame, first_round: int) -> pd.DataFrame:
    """``frame``, its ``round`` column numbered from 1, as a run whose first round is
    ``first_round`` stores it (the inverse of ``numbered_from_one``)."""
    if first_round == 1 or "round" not in frame:
        return frame
    return frame.assign(round=(frame["round"] - (1 - first_round)).astype(frame["round"].dtype))


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
