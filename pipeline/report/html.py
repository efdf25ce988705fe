"""report.html: one self-contained page (figures embedded as data URIs), readable top to bottom."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from simpipe.core.tables import format_cell
from simpipe.games.validity import source_label
from simpipe.report.contents import FigureItem, Report, TableSection

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 70rem; padding: 0 1rem;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6rem; }
h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.88rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
.wrap { overflow-x: auto; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .note, .cite { font-size: 0.85rem; color: #555; }
tr.flagged td { background: #fdecea; color: #7a2a22; }
.synthetic { background: #fff3cd; border: 1px solid #e0b000; padding: 0.4rem 0.6rem; }
"""


def write_html(report: Report, formats: Mapping[str, str]) -> None:
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>simpipe report</title>", f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title(report))}</h1>",
        f"<p>{_runs_line(report)}<br><span class='note'>generated "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC} by simpipe {_version()}; tables as CSV "
        f"in <code>tables/</code>, figures as PNG in <code>figures/</code>.</span></p>",
    ]
    parts += [f"<p class='{'synthetic' if n.startswith('SYNTHETIC') else 'note'}'>"
              f"{html.escape(n)}</p>" for n in report.notes]
    for section in report.sections:
        parts.append(_section(section, formats))
        parts += [_figure(f) for f in report.figures if f.section == section.key]
        if section.key == "rounds":
            parts += [_figure(f) for f in report.figures
                      if f.run is not None and f.attribute is None and f.section is None]
        if section.attribute is not None:
            parts += [_figure(f) for f in report.figures if f.attribute == section.attribute]
    compare = [f for f in report.figures
               if f.run is None and f.attribute is None and f.section is None]
    if compare:
        parts.append("<h2>Runs side by side</h2>")
        parts += [_figure(f) for f in compare]
    parts.append("</body></html>")
    report.html.write_text("\n".join(parts), encoding="utf-8")


def _section(section: TableSection, formats: Mapping[str, str]) -> str:
    out = [f"<h2>{html.escape(section.title)}</h2>"]
    rows = section.display_rows()
    if rows:
        columns = list(rows[0])
        header = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        out.append(f"<div class='wrap'><table><thead><tr>{header}</tr></thead><tbody>")
        for row in rows:
            cells = []
            for c in columns:
                value = row[c]
                css = " class='text'" if isinstance(value, str) else ""
                cells.append(f"<td{css}>{html.escape(format_cell(value, formats.get(c)))}</td>")
            flagged = row.get("valid_enough") is False
            out.append(("<tr class='flagged'>" if flagged else "<tr>") + "".join(cells)
                       + "</tr>")
        out.append("</tbody></table></div>")
    else:
        out.append("<p class='note'>(no rows)</p>")
    out += [f"<p class='note'>{html.escape(n)}</p>" for n in section.notes]
    if section.citation:
        out.append(f"<p class='cite'>Source: {html.escape(section.citation)}</p>")
    return "\n".join(out)


def _figure(item: FigureItem) -> str:
    data = base64.b64encode(item.path.read_bytes()).decode("ascii")
    alt = html.escape(item.caption)
    return (f"<figure><img src='data:image/png;base64,{data}' alt='{alt}'>"
            f"<figcaption>{alt} (<code>figures/{html.escape(item.path.name)}</code>)"
            "</figcaption></figure>")


def title(report: Report) -> str:
    """The page's heading: says so when any run's answers are synthetic."""
    if any(run.synthetic for run in report.runs):
        return "simpipe report: SYNTHETIC answers (emulated servers, not a model)"
    return "simpipe report"


def _runs_line(report: Report) -> str:
    return "; ".join(
        f"<b>{html.escape(run.label)}</b> (<code>{html.escape(str(run.run_dir))}</code>, "
        + ", ".join(html.escape(w) for w in (run.ledger.state, source_label(run.answers_source))
                    if w) + ")"
        for run in report.runs)


def _version() -> str:
    try:
        return version("simpipe")
    except PackageNotFoundError:
        return "?"
