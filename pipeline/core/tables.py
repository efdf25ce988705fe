"""Plain Markdown tables for benchmark and report output (pasteable into the docs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def markdown_table(rows: Sequence[Mapping[str, object]],
                   formats: Mapping[str, str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    formats = formats or {}
    columns = list(rows[0])
    cells = [[format_cell(row.get(col), formats.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def format_cell(value: object, fmt: str | None) -> str:
    """One table cell as text, in Markdown and in the HTML report: empty for a missing value
    or NaN; a number through its column's ``fmt`` (``"{:.1f}"``; text is never formatted), a
    float without one to 3 significant digits."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if fmt and not isinstance(value, str):
        try:
            return fmt.format(value)
        except (ValueError, TypeError):
            return str(value)
    return f"{value:.3g}" if isinstance(value, float) else str(value)
