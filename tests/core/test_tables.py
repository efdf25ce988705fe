"""Table cells (``simpipe.core.tables``): the one formatter behind the benchmarks' and reports'
Markdown tables and the cells of report.html."""

from __future__ import annotations

import math

from simpipe.core.tables import format_cell, markdown_table
from simpipe.report import html as report_html


def test_a_cell_is_blank_when_missing_formatted_when_a_number_and_text_as_written() -> None:
    assert format_cell(None, "{:.1f}") == ""
    assert format_cell(math.nan, None) == ""
    assert format_cell(0.3333, "{:.1%}") == "33.3%"
    assert format_cell(12_345, "{:,}") == "12,345"
    assert format_cell(2 / 3, None) == "0.667"  # a float without a format: 3 digits
    assert format_cell("abcdef", "{:.2}") == "abcdef"  # a column's format never cuts text
    assert format_cell(True, "{:.1f}") == "1.0"
    assert format_cell([1], "{:.1f}") == "[1]"  # a value the format refuses: as it is


def test_markdown_rows_line_up_under_their_header() -> None:
    table = markdown_table([{"name": "tgi", "share": 0.5}, {"name": "openai", "share": None}],
                           {"share": "{:.0%}"})
    assert table.splitlines() == [
        "| name   | share |",
        "|--------|-------|",
        "| tgi    | 50%   |",
        "| openai |       |",
    ]
    assert markdown_table([]) == "(no rows)"


def test_the_html_report_formats_cells_with_the_same_function() -> None:
    assert report_html.format_cell is format_cell
