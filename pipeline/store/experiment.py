"""``experiment.json``: what an experiment folder holds, as a typed record.

``simpipe experiment`` (``simpipe.run.experiment``) writes it at the top of the experiment
folder, beside one run folder per cell; ``simpipe report EXPERIMENT_DIR`` reads it to know
the cells, the factor values of each and which are finished. Like ``run.json`` it is
untrusted when read back: a regular file of bounded size whose fields have the types
simpipe writes (``simpipe.core.records.read_json_model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from simpipe.core.files import write_json_atomic
from simpipe.core.records import StrictRecord, read_json_model
from simpipe.store.states import CellState, RunState, StoredCellState, StoredRunState

EXPERIMENT_FILE = "experiment.json"
# A thousand cells of a few hundred bytes each: anything much bigger is not ours.
MAX_EXPERIMENT_BYTES = 4 * 2**20
FORMAT = "simpipe-experiment/1"


class CellRecord(StrictRecord):
    """One cell: its folder (under the experiment's), the grid values that make it, and
    the state of its run as this experiment last saw it."""

    model_config = ConfigDict(strict=True, extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    overrides: dict[str, Any]
    state: StoredCellState = CellState.PENDING
    config_hash: str | None = None
    wall_s: float | None = None
    error: str | None = None


class ExperimentRecord(StrictRecord):
    """``experiment.json``: the grid, its cells in order, and the experiment's state."""

    model_config = ConfigDict(strict=True, extra="allow")

    format: str = FORMAT
    name: str
    source: str = ""  # the config file it was made from
    grid: dict[str, list[Any]]
    state: StoredRunState = RunState.CREATED
    created_at: str | None = None
    updated_at: str | None = None
    cells: list[CellRecord] = []

    def cell(self, name: str) -> CellRecord | None:
        return next((c for c in self.cells if c.name == name), None)

    def factors(self) -> list[str]:
        """The grid's keys, in the order the config gives them."""
        return list(self.grid)


def experiment_file(folder: Path) -> Path:
    return Path(folder) / EXPERIMENT_FILE


def is_experiment_dir(folder: str | Path) -> bool:
    """Whether ``folder`` holds an ``experiment.json`` (a regular file)."""
    path = experiment_file(Path(folder))
    return path.is_file() and not path.is_symlink()


def read_experiment(folder: str | Path) -> ExperimentRecord:
    """``experiment.json`` of ``folder``; CorruptFile naming it when it is missing, too big,
    not JSON or a field has the wrong type."""
    return read_json_model(experiment_file(Path(folder)), ExperimentRecord,
                           MAX_EXPERIMENT_BYTES)


def write_experiment(folder: Path, record: ExperimentRecord) -> None:
    write_json_atomic(record.model_dump(mode="json"), experiment_file(folder))
