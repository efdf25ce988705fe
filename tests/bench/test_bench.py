"""The ``simpipe bench client``, ``engine`` and ``share`` commands, end to end, at a size
that runs in seconds: every row present, every request answered. No timing assertions:
the figures themselves are for docs/benchmarks.md, measured on an idle machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import REPO, one_error_line


def _table(stdout: str) -> list[dict[str, str]]:
    """The Markdown table a bench command prints, as one dict per row."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True))
        for ln in lines[2:]
    ]


def _bench(*args: str, timeout: int) -> list[dict[str, str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "simpipe.cli", "bench", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _table(proc.stdout)


def test_bench_client_sends_every_request_through_each_client():
    # 2,000: enough server CPU (about 20 us a request) to show above the 10 ms clock tick
    rows = _bench("client", "--requests", "2000", "--concurrency", "16", timeout=120)
    assert [(r["client"], r["server"]) for r in rows] == [
        ("aiohttp, bare loop", "stub"), ("http_client, bare loop", "stub"),
        ("tgi back-end", "stub"), ("openai back-end", "stub"),
        ("tgi back-end", "emulator, fast profile"), ("openai back-end", "emulator, fast profile"),
    ]
    for row in rows:
        assert row["requests"] == "2000" and row["errors"] == "0"
        assert float(row["requests_per_s"].replace(",", "")) > 0
        assert float(row["cpu_s_per_1k"]) > 0 and float(row["server_cpu_s_per_1k"]) > 0
    assert rows[0]["x_aiohttp"] == "1.00"


def test_bench_client_refuses_nonsense_sizes():
    proc = subprocess.run(
        [sys.executable, "-m", "simpipe.cli", "bench", "client", "--requests", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "Invalid value for '--requests'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--profile", "h200", "--profile h200: unknown emulator profile 'h200'; known:"),
    ("--worker-memory", "lots", "--worker-memory lots: expected an amount of memory"),
    ("--kill-server-at", "5", "--kill-server-at needs --nodes 2 or more"),
])
def test_bench_fleet_refuses_a_bad_option_in_one_line_before_starting_anything(option, value,
                                                                               says):
    proc = subprocess.run(
        [sys.executable, "-m", "simpipe.cli", "bench", "fleet", option, value],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert one_error_line(proc).startswith(f"error: {says}")


@pytest.mark.llm
@pytest.mark.slow
def test_bench_engine_answers_the_same_prompts_every_way():
    rows = _bench("engine", "--agents", "8", "--parallel", "4", timeout=600)
    assert [r["engine"] for r in rows] == [
        "raw engine (xllamacpp, in-process threads)",
        "raw engine, GBNF answer grammar",
        "raw engine, no answer grammar",
        "pipeline: llamacpp back-end via Dask",
        "pipeline: llamacpp, reproducible = true",
        "pipeline: openai back-end -> llama.cpp server",
    ]
    assert all(r["prompts"] == "8" for r in rows)
    # The grammar admits only numbers in range; without it the parser reads what it can.
    assert [rows[i]["valid_share"] for i in (0, 1, 3, 4, 5)] == ["100%"] * 5
    assert rows[2]["valid_share"].endswith("%")
    # Every row is timed against the constrained raw engine.
    assert all(float(r["ratio_to_raw"]) > 0 for r in rows[1:])
    assert all(float(r["peak_rss_gib"]) > 0.1 for r in rows)  # the model is resident


@pytest.mark.llm
@pytest.mark.slow
def test_bench_share_reports_each_round_and_the_per_agent_reference():
    rows = _bench("share", "--agents", "60", "--rounds", "2", "--sample", "6", timeout=900)
    assert [r["case"] for r in rows] == [
        "shared answers, round 1", "shared answers, round 2",
        "one call per agent, round 1 (the reference)",
    ]
    first, second, reference = rows
    assert first["agents"] == second["agents"] == "60" and reference["agents"] == "6"
    # The default population has 10 persona combinations: round 1 has at most 10 prompts.
    assert 1 <= int(first["distinct_prompts"]) <= 10
    assert float(first["sharing_factor"]) >= 6.0
    assert int(second["distinct_prompts"]) > int(first["distinct_prompts"])
    assert reference["model_calls"] == "6" and reference["distinct_prompts"] != ""
    assert all(r["valid"] == "100.0%" for r in rows)
    assert all(float(r["peak_rss_gib"]) > 0.1 for r in rows)


@pytest.mark.slow
def test_bench_share_emulate_reports_gpu_seconds_with_and_without_sharing():
    rows = _bench("share", "--case", "emulate", "--agents", "200", "--rounds", "2",
                  "--servers", "2", timeout=600)
    assert [r["case"] for r in rows] == [
        "emulated 2 x A100 (vLLM), sharing auto, round 1",
        "emulated 2 x A100 (vLLM), sharing auto, round 2",
        "emulated 2 x A100 (vLLM), sharing off, round 1",
        "emulated 2 x A100 (vLLM), sharing off, round 2",
        "emulated GPU-seconds, sharing auto / off",
    ]
    for row in rows[:4]:
        assert row["agents"] == "200" and row["valid"] == "100.0%"
        assert int(row["distinct_prompts"]) >= 1 and int(row["model_calls"].replace(",", "")) >= 1
        assert float(row["gpu_s"]) > 0  # the emulators' modelled work in the round
        # how the plan answered the round's distinct prompts (sharing off: per agent)
        methods = [int(row[f"{m}_prompts"].replace(",", ""))
                   for m in ("tree", "samples", "per_agent")]
        assert sum(methods) == int(row["distinct_prompts"].replace(",", ""))
    assert int(rows[0]["tree_prompts"]) >= 1  # round 1: 10 personas of ~20 agents each
    assert float(rows[0]["predicted_gpu_s"]) > 0 and rows[2]["predicted_gpu_s"] == ""
    assert float(rows[0]["gpu_s_ratio"]) < 1  # round 1: trees against one request each
    # The ratio row divides the two runs' GPU-seconds, whatever the back-end shares.
    total = rows[4]
    on = sum(float(r["gpu_s"]) for r in rows[:2])
    off = sum(float(r["gpu_s"]) for r in rows[2:4])
    assert float(total["gpu_s"]) == pytest.approx(on, abs=0.2)
    assert float(total["gpu_s_ratio"]) == pytest.approx(on / off, rel=0.05)  # from rounded cells


def test_bench_share_emulate_refuses_a_config():
    proc = subprocess.run(
        [sys.executable, "-m", "simpipe.cli", "bench", "share", "--case", "emulate",
         "--set", "game.rounds=2"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "--case emulate builds its own config" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.llm
@pytest.mark.slow
def test_bench_share_openai_runs_through_a_llama_cpp_server():
    rows = _bench("share", "--case", "openai", "--agents", "30", "--rounds", "2", timeout=900)
    assert [r["case"] for r in rows] == ["openai -> llama.cpp server, round 1",
                                         "openai -> llama.cpp server, round 2"]
    assert all(r["agents"] == "30" and int(r["model_calls"]) >= 1 for r in rows)
    assert all(r["valid"].endswith("%") for r in rows)
