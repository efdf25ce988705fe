"""Published numbers for the p-beauty contest: human subjects (Nagel 1995 in the lab; the
newspaper experiments of Bosch-Domènech et al. 2002, one-shot play by thousands of readers)
and the LLM agents of the paper this project reproduces (Pan et al. 2024); the data file is
``reference.json`` beside this module."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from simpipe.games.config import parse_ratio
from simpipe.games.data import package_json

DATA_FILE = "beauty_contest/reference.json"


@dataclass(frozen=True)
class HumanRow:
    ratio: str
    n: int
    mean: float
    median: float


@dataclass(frozen=True)
class SessionMeans:
    """One session of Nagel's repeated game: the mean choice in each period."""

    ratio: str
    session: str
    means: tuple[float, ...]


@dataclass(frozen=True)
class HighShare:
    """The share of subjects choosing ``value`` (the top of the range) in later periods."""

    ratio: str
    value: float
    periods: tuple[int, ...]  # 1-based, as in the paper
    shares: tuple[float, ...]


@dataclass(frozen=True)
class NewspaperRow:
    """One newspaper's contest: its readers' number of entries, mean and winning number."""

    source: str
    n: int
    mean: float
    winning: float


@dataclass(frozen=True)
class LlmRow:
    model: str
    prompt: str
    metric: str
    value: float
    approximate: bool
    note: str


@dataclass(frozen=True)
class References:
    human_citation: str
    human: tuple[HumanRow, ...]
    llm_citation: str
    llm_ratio: str
    llm: tuple[LlmRow, ...]
    metrics: dict[str, str]
    sessions: tuple[SessionMeans, ...] = ()
    high_shares: tuple[HighShare, ...] = ()
    newspaper_citation: str = ""
    newspaper_caveat: str = ""
    newspaper_ratio: str = "2/3"
    newspaper: tuple[NewspaperRow, ...] = ()

    def newspaper_for(self, ratio: str, offset: float) -> tuple[NewspaperRow, ...]:
        """The newspaper contests of this game (2/3, no offset), or none."""
        if offset != 0 or parse_ratio(ratio) != parse_ratio(self.newspaper_ratio):
            return ()
        return self.newspaper

    def period_means(self, ratio: str) -> tuple[float, ...] | None:
        """Mean per period, the unweighted average of the sessions' means; None without
        sessions for this ratio."""
        wanted = parse_ratio(ratio)
        rows = [s.means for s in self.sessions if parse_ratio(s.ratio) == wanted]
        if not rows:
            return None
        return tuple(sum(col) / len(col) for col in zip(*rows, strict=True))

    def high_share(self, ratio: str) -> HighShare | None:
        wanted = parse_ratio(ratio)
        return next((h for h in self.high_shares if parse_ratio(h.ratio) == wanted), None)

    def human_for(self, ratio: str, offset: float) -> HumanRow | None:
        """Nagel's row for this game, or None: her games had no offset."""
        if offset != 0:
            return None
        wanted = parse_ratio(ratio)
        return next((row for row in self.human if parse_ratio(row.ratio) == wanted), None)

    def llm_applies(self, ratio: str, offset: float) -> bool:
        return offset == 0 and parse_ratio(ratio) == Fraction(parse_ratio(self.llm_ratio))


def load_references() -> References:
    raw = package_json(DATA_FILE)
    periods = raw["human"]["by_period"]
    paper = raw["newspaper"]
    return References(
        human_citation=raw["human"]["citation"],
        human=tuple(HumanRow(r["ratio"], int(r["n"]), float(r["mean"]), float(r["median"]))
                    for r in raw["human"]["first_round"]),
        llm_citation=raw["llm"]["citation"],
        llm_ratio=raw["llm"]["ratio"],
        llm=tuple(LlmRow(r["model"], r["prompt"], r["metric"], float(r["value"]),
                         bool(r.get("approximate", False)), r.get("note", ""))
                  for r in raw["llm"]["rows"]),
        metrics=dict(raw["metrics"]),
        sessions=tuple(SessionMeans(r["ratio"], r["session"], tuple(map(float, r["means"])))
                       for r in periods["session_means"]),
        high_shares=tuple(HighShare(r["ratio"], float(r["value"]), tuple(map(int, r["periods"])),
                                    tuple(map(float, r["shares"])))
                          for r in periods["share_choosing_high"]),
        newspaper_citation=paper["citation"], newspaper_caveat=paper["caveat"],
        newspaper_ratio=paper["ratio"],
        newspaper=tuple(NewspaperRow(r["source"], int(r["n"]), float(r["mean"]),
                                     float(r["winning"])) for r in paper["rows"]),
    )
