"""`simpipe report` as a function: load runs, compute tables, draw figures, write the page."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from simpipe.core.tables import markdown_table
from simpipe.games import validity
from simpipe.report import cot
from simpipe.report import figures as fig
from simpipe.report import tables as tab
from simpipe.report.contents import FigureItem, Report, TableSection
from simpipe.report.experiment import comparison, load_experiment_runs
from simpipe.report.html import title, write_html
from simpipe.report.load import ReportInputError, RunData, load_runs, slug
from simpipe.store.experiment import is_experiment_dir

FLOAT2 = "{:.2f}"
NOT_SHOWN = "not shown to the agents"
FORMATS: dict[str, str] = {
    "n": "{:,}", "n_valid": "{:,}", "n_agents": "{:,}", "run_n": "{:,}", "human_n": "{:,}",
    "tokens_in": "{:,}", "tokens_out": "{:,}", "valid_share": "{:.1%}", "wall_s": "{:.1f}",
    "rounds": "{:d}", "round": "{:d}", "offset": "{:g}", "equilibrium": "{:g}",
    "rounds_to_within_1": "{:.0f}", "paper_value": FLOAT2, "run_value": FLOAT2,
    "endowment": "{:,}", "mpcr": "{:g}", "group_size": "{:d}", "period": "{:d}",
    "n_truncated": "{:,}", "n_no_final_answer": "{:,}", **cot.FORMATS,
    **{c: FLOAT2 for c in ("mean", "median", "sd", "target", "winning_guess", "ci_low", "ci_high",
                            "first_mean", "first_median", "last_mean", "run_mean", "run_median",
                            "human_mean", "human_median", "mean_contribution", "mean_payoff")},
    **{c: "{:.1f}" for c in ("contribution_pct", "first_pct", "last_pct", "run_pct",
                             "human_pct", "human_contribution_pct")},
    # the comparison of an experiment's cells
    **{c: FLOAT2 for c in ("mean_ci_low", "mean_ci_high", "median_ci_low", "median_ci_high",
                           "human_mean", "mean_a", "mean_b", "diff", "rank_biserial",
                           "welch_t", "cohens_d")},
    **{c: "{:.3g}" for c in ("mw_p", "mw_p_holm", "welch_p", "welch_p_holm")},
    "n_a": "{:,}", "n_b": "{:,}", "mw_u": "{:,.0f}",
    # validity, dominated answers, paired tests, tests across an attribute's levels
    **{c: "{:.1%}" for c in ("dominated_share", "top_share", "run_dominated_share",
                             "run_top_share", "identical_share")},
    **{c: FLOAT2 for c in ("run_target", "human_target", "pair_r", "t_stat", "d", "kw_h",
                           "epsilon_sq", "trend_rho", "power_d02", "power_d05")},
    **{c: "{:.3g}" for c in ("rank_p", "rank_p_holm", "t_p", "t_p_holm", "kw_p", "trend_p")},
    "n_pairs": "{:,}", "rank_stat": "{:,.0f}", "levels": "{:d}",
}


VALIDITY_RULE = (f"the validity rule: at least {validity.MIN_VALID_SHARE:.0%} of a group's "
                 f"answers valid and at least {validity.MIN_N} valid answers")


def source_notes(runs: Sequence[RunData]) -> list[str]:
    """The report's first notes: which runs' answers do not come from a model."""
    notes = []
    synthetic = [run.label for run in runs if run.synthetic]
    if synthetic:
        notes.append(f"SYNTHETIC ANSWERS in {', '.join(synthetic)}: made up by emulated or "
                     "stub servers (a dry run, --emulate), not by a model: they measure the "
                     "pipeline, not behaviour; no human or published numbers are set beside "
                     "them")
    scripted = [run.label for run in runs if run.answers_source == validity.RULE_BASED]
    if scripted:
        notes.append(f"rule-based answers in {', '.join(scripted)}: scripted agents (a "
                     "cognitive-hierarchy model of behaviour, no LLM)")
    return notes


def _attribute_test_notes(answers: str) -> list[str]:
    return [
        f"Per run and round, the valid {answers} of the levels that are valid enough "
        f"({VALIDITY_RULE}; the others are named in flag). kw: Kruskal-Wallis H test across "
        "the levels, epsilon_sq = H / (n - 1) (0: no difference, 1: the levels separate the "
        "answers completely).",
        "trend: Spearman's rho between an answer and its level's rank (three levels or "
        "more), in trend_order: numeric ranges by value, labels in the order the config "
        "lists them. Read it only where that order is an order (education: yes; gender or "
        "occupation: no).",
        "power_d02, power_d05: the power of a two-sided t test at 5% between the two "
        "smallest levels (smallest_pair, with their n) to detect a difference of 0.2 or 0.5 "
        "standard deviations: below 0.8, a difference of that size would often go unseen.",
    ]


def available_attributes(runs: Sequence[RunData]) -> list[str]:
    return list(dict.fromkeys(a for run in runs for a in run.attributes))


def build_report(run_dirs: Sequence[str | Path], out: str | Path | None = None,
                 by: Sequence[str] = ()) -> Report:
    """Write tables/*.csv, figures/*.png and report.html under `out`; return what was written.
    An experiment folder (``simpipe experiment``) gets the comparison of its cells
    (``simpipe.report.experiment``)."""
    experiments = [d for d in run_dirs if is_experiment_dir(d)]
    if experiments:
        if len(run_dirs) > 1:
            raise ReportInputError(f"{experiments[0]} is an experiment folder: report it alone "
                                   "(its cells are compared with each other)")
        return build_experiment_report(experiments[0], out, by)
    runs = load_runs(run_dirs)
    attributes = _choose_attributes(runs, by)
    out_dir = Path(out) if out is not None else default_out(runs)
    make_out_dirs(out_dir)
    return assemble_report(runs, out_dir, attributes)


def build_experiment_report(folder: str | Path, out: str | Path | None = None,
                            by: Sequence[str] = ()) -> Report:
    """The report of an experiment folder (default out: ``<folder>/report``): the comparison
    of its cells first (``simpipe.report.experiment``), then every cell's run as in a
    report of several runs; the tables also as Markdown in ``report.md``. Per-attribute
    breakdowns only for the attributes ``by`` names (one per cell would crowd the page)."""
    experiment = load_experiment_runs(folder)
    runs = experiment.runs
    attributes = _choose_attributes(runs, by) if by else []
    out_dir = Path(out) if out is not None else Path(folder) / "report"
    make_out_dirs(out_dir)
    lead, figures, notes = comparison(experiment, out_dir)
    if not by:
        notes.append("per-attribute breakdowns: pass --by ATTR (e.g. --by education)")
    report = assemble_report(runs, out_dir, attributes, lead, figures, notes)
    write_markdown(report, out_dir / "report.md")
    return report


def write_markdown(report: Report, path: Path) -> None:
    """Every table of ``report`` as Markdown, with its notes and citation."""
    parts = [f"# {title(report)}", ""]
    parts += [f"note: {n}" for n in report.notes]
    for section in report.sections:
        parts += ["", f"## {section.title}", "", markdown_table(section.display_rows(), FORMATS)]
        parts += [f"\n{n}" for n in section.notes]
        if section.citation:
            parts.append(f"\nSource: {section.citation}")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def assemble_report(runs: Sequence[RunData], out_dir: Path, attributes: Sequence[str],
                    lead: Sequence[TableSection] = (), lead_figures: Sequence[FigureItem] = (),
                    lead_notes: Sequence[str] = ()) -> Report:
    """The report of ``runs`` (loaded, one game) in ``out_dir`` (made): the tables and
    figures of every run, after the ``lead`` sections, figures and notes a caller puts first
    (an experiment's comparison)."""
    notes: list[str] = list(lead_notes)
    game = runs[0].game  # load_runs: every run plays the same game
    game_notes = game.report_notes()

    round_tables = [tab.round_table(run) for run in runs]
    sections = [
        *lead,
        TableSection("runs", "Per run", tab.run_table(runs, round_tables),
                     notes=game_notes.get("runs", [])),
        TableSection("rounds", "Per round", pd.concat(round_tables, ignore_index=True),
                     notes=game_notes.get("rounds", [])),
    ]
    for ref in tab.reference_tables(runs, round_tables):
        sections.append(TableSection(
            ref.key, ref.title, pd.DataFrame.from_records(ref.records, columns=ref.columns),
            notes=ref.notes, citation=ref.citation))
    figures: list[FigureItem] = list(lead_figures)
    for run, rounds in zip(runs, round_tables, strict=True):
        stem = slug(run.label)
        chart = run.game.round_chart()
        figures.append(FigureItem(
            fig.guesses_figure(run, out_dir / "figures" / f"{stem}-guesses.png"),
            f"{run.label}: distribution of {run.game.answer_plural} per round", run=run.label))
        levels = "".join(f"; {name} {value:g}" for name, value in chart.levels)
        figures.append(FigureItem(
            fig.convergence_figure(run, rounds, out_dir / "figures" / f"{stem}-convergence.png"),
            f"{run.label}: {chart.title}{levels}", run=run.label))

    for attribute in attributes:
        with_attr = [run for run in runs if attribute in run.columns]
        for run in runs:
            if run not in with_attr:
                notes.append(f"{run.label}: no attribute {attribute!r} in its population")
        table = pd.concat([tab.attribute_table(run, attribute) for run in with_attr],
                          ignore_index=True)
        reach = {run.label: run.reaches_agents(attribute) for run in with_attr}
        table.insert(1, "reaches_agents", table["run"].map(
            {label: how or NOT_SHOWN for label, how in reach.items()}))
        attribute_notes = [f"n {game.answer_plural} and n_valid valid ones per level and "
                           "round; 95% Student-t confidence interval of the mean, only where "
                           f"the level is valid enough ({VALIDITY_RULE})."]
        hidden = [label for label, how in reach.items() if how is None]
        title = f"Mean {game.answer_name} by {attribute}"
        if hidden:
            if len(hidden) == len(reach):
                title += f" ({NOT_SHOWN})"
            attribute_notes.insert(0, (
                f"{attribute} was {NOT_SHOWN} in {', '.join(hidden)}: no prompt named it and "
                "no rule used it, so differences between its levels are chance or "
                "correlation with other attributes, not an effect of it."))
        sections.append(TableSection(
            f"by_{slug(attribute)}", title, table, attribute=attribute, notes=attribute_notes))
        sections.append(TableSection(
            f"tests_by_{slug(attribute)}", f"Do the levels of {attribute} differ?",
            pd.concat([tab.attribute_tests(run, attribute) for run in with_attr],
                      ignore_index=True), notes=_attribute_test_notes(game.answer_plural)))
        y_low = game.answer().bounds[0]
        for run in with_attr:
            name = f"{slug(run.label)}-by-{slug(attribute)}.png"
            figures.append(FigureItem(
                fig.attribute_figure(table[table["run"] == run.label], "round",
                                     f"{run.label}: mean {game.answer_name} by {attribute}",
                                     game.answer_name, out_dir / "figures" / name, y_low),
                f"{run.label}: mean {game.answer_name} by {attribute} per round, 95% CI",
                run=run.label, attribute=attribute))
        if len(with_attr) > 1:
            first = table[table["round"] == table.groupby("run")["round"].transform("min")]
            figures.append(FigureItem(
                fig.attribute_figure(first, "run",
                                     f"first round: mean {game.answer_name} by {attribute}",
                                     game.answer_name,
                                     out_dir / "figures" / f"compare-by-{slug(attribute)}.png",
                                     y_low),
                f"all runs: first-round mean {game.answer_name} by {attribute}, 95% CI",
                attribute=attribute))
    if not available_attributes(runs):
        notes.append("no persona attributes in the population: no per-attribute tables")
    flagged = [f"{row['run']} round {row['round']}" for table in round_tables
               for _, row in table.iterrows() if not row["valid_enough"]]
    if flagged:
        notes.insert(0, f"NOT VALID ENOUGH ({VALIDITY_RULE}): {', '.join(flagged[:8])}"
                        f"{f' and {len(flagged) - 8} more' if len(flagged) > 8 else ''}: their "
                        "numbers are shown with their n and flag, without intervals, tests or "
                        "comparisons with published numbers")
    notes[:0] = source_notes(runs)
    sections += cot.cot_sections(runs, attributes)

    if len(runs) > 1:
        figures.append(FigureItem(fig.compare_convergence_figure(
            runs, round_tables, out_dir / "figures" / "compare-convergence.png"),
            f"all runs: {fig.compare_caption(game.round_chart())}"))
        figures.append(FigureItem(fig.compare_guesses_figure(
            runs, out_dir / "figures" / "compare-guesses.png"),
            f"all runs side by side: share of valid {game.answer_plural} per round"))

    for section in sections:
        section.frame.to_csv(out_dir / "tables" / f"{section.key}.csv", index=False)

    report = Report(out_dir, list(runs), sections, figures, out_dir / "report.html", notes)
    write_html(report, FORMATS)
    return report


def make_out_dirs(out_dir: Path) -> None:
    """The report's folders; ReportInputError naming the folder when they cannot be made
    (``--out /proc/self``, a path below a file, a read-only place)."""
    for sub in ("tables", "figures"):
        try:
            (out_dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ReportInputError(
                f"{out_dir}: cannot write the report there ({reason}: {exc.filename}); "
                "pass --out with a folder you can write to") from None


def default_out(runs: Sequence[RunData]) -> Path:
    """One run: RUN_DIR/report; several: a folder beside the first run."""
    if len(runs) == 1:
        return runs[0].run_dir / "report"
    return runs[0].run_dir.parent / "report-compare"


def _choose_attributes(runs: Sequence[RunData], by: Sequence[str]) -> list[str]:
    available = list(dict.fromkeys(c for run in runs for c in run.columns))
    missing = [a for a in by if a not in available]
    if missing:
        raise ReportInputError(
            f"--by {', '.join(missing)}: no such attribute in the population "
            f"(available: {', '.join(available) if available else 'none'})")
    return list(dict.fromkeys(by)) if by else available_attributes(runs)
