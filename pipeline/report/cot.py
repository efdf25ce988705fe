"""The report's audits of chain-of-thought answers (``simpipe.games.cot_audit``): per round,
and reasoning depth by persona attribute, for runs whose prompt asks for reasoning and then
a marked final answer. The audits read the stored answer text (``raw``), which only these
tables need, so it is read here and only for such runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from simpipe.games.cot_audit import audit_many
from simpipe.report.contents import TableSection
from simpipe.report.load import RunData, slug
from simpipe.report.tables import attribute_levels
from simpipe.store.results import read_rounds

ROUND_COLUMNS = ["run", "round", "n", "n_stored_cut", "with_arithmetic", "claims",
                 "wrong_claims", "wrong_share", "with_final", "final_agrees_share",
                 "mean_depth"]
DEPTH_COLUMNS = ["run", "attribute", "level", "n", "mean_depth", "depth_2_or_more",
                 "wrong_share", "final_agrees_share"]
FORMATS = {
    "n_stored_cut": "{:,}", "claims": "{:,}", "wrong_claims": "{:,}", "with_final": "{:,}",
    "with_arithmetic": "{:.1%}", "wrong_share": "{:.1%}", "final_agrees_share": "{:.1%}",
    "depth_2_or_more": "{:.1%}", "mean_depth": "{:.2f}",
}
ROUND_NOTES = [
    "Every answer of the round audited, whatever its status (a chain of thought cut at the "
    "token limit still shows its arithmetic and depth).",
    "with_arithmetic: share of answers stating at least one product (\"2/3 of 50 is 33.3\", "
    "\"50 * 2/3 = 33.3\"); wrong_share: share of those statements whose result is not the "
    "exact product rounded or cut to the digits written.",
    "with_final: answers with a number after the answer marker; final_agrees_share: among "
    "those whose reasoning derives a number, the share whose final answer is that number "
    "rounded either way.",
    "mean_depth: how many times the reasoning applies the game's factor one step after "
    "another (\"2/3 of 50 is 33, 2/3 of 33 is 22\": 2).",
    "n_stored_cut: answers longer than agents.max_raw_chars; only their stored prefix was "
    "audited.",
]


def audited_answers(run: RunData) -> pd.DataFrame | None:
    """One row per answer of the run's finished rounds: ``agent_id``, ``round``,
    ``raw_truncated`` and the audit's columns; None when its prompt asks for no reasoning."""
    answer = run.game.answer()
    if not answer.cot:
        return None
    rows = read_rounds(run.run_dir, columns=["agent_id", "round", "raw", "raw_truncated"])
    rows = rows[rows["round"].isin(run.round_indices)].reset_index(drop=True)
    audits = audit_many(rows["raw"].tolist(), run.game.reasoning_step(), answer.marker)
    return pd.concat([rows.drop(columns="raw"), audits], axis=1)


def _shares(frame: pd.DataFrame) -> dict[str, float]:
    claims = int(frame["claims"].sum())
    return {
        "wrong_share": frame["wrong_claims"].sum() / claims if claims else np.nan,
        "final_agrees_share": frame["final_agrees"].mean(),  # NaN rows are skipped
    }


def round_audit(run: RunData, audits: pd.DataFrame) -> pd.DataFrame:
    records = []
    for r, frame in audits.groupby("round", sort=True):
        records.append({
            "run": run.label, "round": int(r), "n": len(frame),
            "n_stored_cut": int(frame["raw_truncated"].sum()),
            "with_arithmetic": float((frame["claims"] > 0).mean()),
            "claims": int(frame["claims"].sum()), "wrong_claims": int(frame["wrong_claims"].sum()),
            "with_final": int(frame["final"].notna().sum()),
            "mean_depth": float(frame["depth"].mean()), **_shares(frame),
        })
    return pd.DataFrame.from_records(records, columns=ROUND_COLUMNS)


def depth_by_attribute(run: RunData, audits: pd.DataFrame, attribute: str) -> pd.DataFrame:
    """Per level of ``attribute``, pooled over rounds: depth, arithmetic, agreement."""
    levels = attribute_levels(run.population, attribute, run.attribute_order(attribute))
    positions = pd.Index(run.population["agent_id"].to_numpy()).get_indexer(
        audits["agent_id"].to_numpy())
    known = positions >= 0
    frame = audits[known].assign(level=pd.Categorical.from_codes(
        levels.codes[positions[known]], dtype=levels.dtype))
    records = []
    for level, part in frame.groupby("level", observed=True, sort=True):
        records.append({
            "run": run.label, "attribute": attribute, "level": str(level), "n": len(part),
            "mean_depth": float(part["depth"].mean()),
            "depth_2_or_more": float((part["depth"] >= 2).mean()), **_shares(part),
        })
    return pd.DataFrame.from_records(records, columns=DEPTH_COLUMNS)


def cot_sections(runs: Sequence[RunData], attributes: Sequence[str]) -> list[TableSection]:
    """The audit tables: one per round and run, one per attribute; none without a chain of
    thought in any run."""
    audited = [(run, audited_answers(run)) for run in runs]
    audited = [(run, a) for run, a in audited if a is not None]
    if not audited:
        return []
    sections = [TableSection(
        "cot_audit", "Chain of thought audited: arithmetic, final answer, depth",
        pd.concat([round_audit(run, a) for run, a in audited], ignore_index=True),
        notes=list(ROUND_NOTES))]
    for attribute in attributes:
        tables = [depth_by_attribute(run, a, attribute) for run, a in audited
                  if attribute in run.columns]
        if not tables:
            continue
        sections.append(TableSection(
            f"cot_depth_by_{slug(attribute)}", f"Reasoning depth by {attribute}",
            pd.concat(tables, ignore_index=True),
            notes=["All audited answers of the run's rounds, pooled; depth_2_or_more: share "
                   "of answers that iterate the game's factor at least twice."]))
    return sections
