"""The `simpipe report` command; heavy imports wait until it runs so `simpipe --help` stays fast."""

from __future__ import annotations

import click


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR [RUN_DIR ...]",
                type=click.Path(file_okay=True, dir_okay=True))
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: RUN_DIR/report for one run, "
                   "<parent of the first run>/report-compare for several].")
@click.option("--by", "by", multiple=True, metavar="ATTR",
              help="Persona attribute to break the mean answer down by (repeatable) "
                   "[default: every attribute of the population].")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the tables.")
def report_command(run_dirs: tuple[str, ...], out: str | None, by: tuple[str, ...],
                   quiet: bool) -> None:
    """Tables, figures and report.html for one or several runs.

    Writes OUT/report.html (self-contained), OUT/figures/*.png and OUT/tables/*.csv, and
    prints the tables. Several runs are compared side by side.
    """
    from simpipe.core.tables import markdown_table
    from simpipe.report.build import FORMATS, build_report

    report = build_report(run_dirs, out, by)  # a bad input: ReportInputError, a SimpipeError
    if not quiet:
        for section in report.sections:
            click.echo(f"\n## {section.title}\n")
            click.echo(markdown_table(section.display_rows(), FORMATS))
            for note in section.notes:
                click.echo(f"\n{note}")
            if section.citation:
                click.echo(f"Source: {section.citation}")
        for note in report.notes:
            click.echo(f"\nnote: {note}")
    click.echo(f"\nreport: {report.html}  ({len(report.figures)} figures, "
               f"{len(report.sections)} tables in {report.out / 'tables'})")
