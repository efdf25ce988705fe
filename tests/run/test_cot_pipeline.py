"""Chain of thought, honestly: answers cut at the token limit or without their marked final
answer are not `ok` through the whole pipeline (a real stub server speaking TGI's and the
OpenAI protocol, real Dask, real files), run.json and the summaries count them, and the
report will not set such a run beside the paper."""

from __future__ import annotations

import numpy as np
import pytest

from simpipe.report.build import build_report
from simpipe.run.agent_prompt import rebuild_prompt
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.contract import REASONING_SHARE
from simpipe.servers.stub import StubProcess
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_ledger, read_rounds, read_summary

from support import small_config

QUIET = Console(quiet=True)


def cot_run(client, tmp_path, name: str, agents: dict) -> tuple:
    with StubProcess() as stub:
        backend = agents["backend"]
        settings = {**agents.get(backend, {}), "endpoints": [stub.url]}
        config = small_config(tmp_path, run={"name": name},
                              population={"size": 40, "partitions": 2},
                              game={"prompt": "cot", "rounds": 2},
                              agents={**agents, backend: settings})
        run_simulation(config, client=client, console=QUIET)
    return config, read_rounds(config.run_dir)


def test_answers_cut_at_the_token_limit_are_truncated_not_ok(dask_client, tmp_path):
    # The stub writes one character per token and reasons for 80% of the budget: 12 tokens
    # hold no "Final answer: N", so every answer ends at the limit, as 98 of 100 did.
    config, rows = cot_run(dask_client, tmp_path, "cut", {"backend": "tgi", "cot_max_tokens": 12})
    assert (rows["status"] == "truncated").all() and rows["guess"].isna().all()
    assert (rows["tokens_out"] == 12).all()
    summary = read_summary(config.run_dir)
    assert summary["n_truncated"].sum() == 80 and summary["n_valid"].sum() == 0
    ledger = read_ledger(config.run_dir)
    assert [ledger.round(r).n_truncated for r in (0, 1)] == [40, 40]
    assert ledger.totals().counts()["truncated"] == 80
    log = RunPaths(config.run_dir).log.read_text()
    assert "truncated 40" in log
    # Round 2's prompts say the first answer was invalid: no number was taken from it.
    second = rebuild_prompt(config.run_dir, 3, 1).prompt
    assert "Winning number of round 1: none announced." in second
    assert "Your number in round 1: invalid." in second
    report = build_report([config.run_dir], tmp_path / "report")
    paper = report.section("paper_reference")
    assert paper.frame.empty
    assert any("80 of its 80 answers (100%) are not valid (80 truncated)" in n
               for n in paper.notes)
    rounds = report.section("rounds").frame
    assert rounds["n_truncated"].tolist() == [40, 40]


def test_answers_without_the_final_answer_form_are_no_final_answer(dask_client, tmp_path):
    # Without the answer constraint the stub answers a bare number: no "Final answer:".
    config, rows = cot_run(dask_client, tmp_path, "bare",
                           {"backend": "openai", "openai": {"constraint": "none"}})
    assert (rows["status"] == "no_final_answer").all() and rows["guess"].isna().all()
    assert rows["raw"].str.fullmatch(r"\d+").all()  # a number the old parser took
    assert read_summary(config.run_dir)["n_no_final_answer"].sum() == 80
    assert read_ledger(config.run_dir).round(1).n_no_final_answer == 40


def test_whole_answers_are_ok_and_audited_by_persona(dask_client, tmp_path):
    config, rows = cot_run(dask_client, tmp_path, "whole", {"backend": "tgi"})
    assert (rows["status"] == "ok").all() and rows["guess"].between(0, 100).all()
    assert rows["raw"].str.contains("Final answer: ").all()
    assert (rows["tokens_out"] < 256 * REASONING_SHARE + 1).all()
    report = build_report([config.run_dir], tmp_path / "report")
    assert report.section("paper_reference").frame["run_value"].notna().all()
    audit = report.section("cot_audit").frame
    assert audit["n"].tolist() == [40, 40] and audit["with_final"].tolist() == [40, 40]
    # The stub's reasoning states no arithmetic: nothing to check, depth 0.
    assert (audit["claims"] == 0).all() and (audit["mean_depth"] == 0).all()
    by_education = report.section("cot_depth_by_education").frame
    assert by_education["n"].sum() == 80
    assert set(by_education["level"]) <= {"High School", "Bachelor's Degree", "Ph.D."}
    assert np.isnan(by_education["wrong_share"]).all()
    assert (tmp_path / "report" / "tables" / "cot_audit.csv").exists()


@pytest.mark.llm
@pytest.mark.slow
def test_the_embedded_models_chain_of_thought_is_flagged_not_ok(dask_client, tmp_path):
    """The case that looked like a result: the embedded base model's reasoning rarely reaches
    "Final answer:" within its budget. Every answer that used the whole budget is truncated,
    none is ok without the marked number, and the report will not compare the run."""
    config = small_config(tmp_path, run={"name": "gemma-cot"},
                          population={"size": 8, "partitions": 2},
                          game={"prompt": "cot", "rounds": 1},
                          agents={"backend": "llamacpp", "cot_max_tokens": 64,
                                  "llamacpp": {"n_parallel": 8}})
    run_simulation(config, client=dask_client, console=QUIET)
    rows = read_rounds(config.run_dir)
    assert len(rows) == 8 and rows["status"].isin(["ok", "truncated", "out_of_range"]).all()
    assert (rows.loc[rows["tokens_out"] >= 64, "status"] == "truncated").all()
    ok = rows["status"] == "ok"
    assert rows.loc[ok, "raw"].str.contains(r"Final answer: ?\d", regex=True).all()
    if (~ok).sum() > 0.05 * len(rows):
        report = build_report([config.run_dir], tmp_path / "report")
        assert report.section("paper_reference").frame.empty
    print("statuses:", rows["status"].value_counts().to_dict())
