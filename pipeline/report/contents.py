"""What a report holds: its tables, its figures and the page, as ``build_report`` made them
and ``simpipe.report.html`` shows them (its own module: the page reads what the build makes,
and the build writes the page)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from simpipe.report.load import RunData


@dataclass
class TableSection:
    """One table as the console, the CSV and the page show it."""

    key: str  # the CSV's stem
    title: str
    frame: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    citation: str = ""
    attribute: str | None = None

    def display_rows(self) -> list[dict[str, object]]:
        frame = self.frame.astype(object).where(self.frame.notna(), None)
        if "rounds_to_within_1" in frame:
            frame["rounds_to_within_1"] = frame["rounds_to_within_1"].map(
                lambda v: "not reached" if v is None else v)
        return frame.to_dict("records")


@dataclass
class FigureItem:
    path: Path
    caption: str
    run: str | None = None  # None: a comparison of all runs
    attribute: str | None = None
    section: str | None = None  # shown right after this table (its key), not with the runs


@dataclass
class Report:
    out: Path
    runs: list[RunData]
    sections: list[TableSection]
    figures: list[FigureItem]
    html: Path
    notes: list[str]

    def section(self, key: str) -> TableSection:
        return next(s for s in self.sections if s.key == key)
