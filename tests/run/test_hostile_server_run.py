"""A whole run against a hostile TGI server: real Dask workers (the ``dask_client``
LocalCluster), a real server on a real socket, real Parquet files. The bad answers cost
their agents, never the run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from simpipe.agents.llm import agent_seeds
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_ledger, read_rounds

from hostile_server import HostileServer, Request, http, ok_json, tgi_answer
from support import small_config

LONG_TEXT = "x" * 5000 + " 33"
# Each request gets the answer of its seed % 10 (seeds are agent_seeds: fixed per run seed).
ANSWERS = {
    0: (tgi_answer(30), "generated_text is a number, not text"),
    1: (ok_json([1, 2]), "the answer is a number, not a JSON object"),
    2: (http(200, b"[" * 100_000 + b"]" * 100_000), "JSON nested too deeply"),
    3: (http(200, b'{"generated_text": "42", "details": {"generated_tokens": 1e999}}'),
        "details.generated_tokens = inf is not a token count"),
    4: (tgi_answer("42", 99_999_999_999), "= 99999999999 is not a token count"),
    5: (tgi_answer("42", -5), "details.generated_tokens = -5 is not a token count"),
    6: (tgi_answer("4" + " " * (3 * 2**19)), "answer larger than 1 MiB from http://127.0.0.1:"),
    7: (tgi_answer(LONG_TEXT), None),  # fine, but too long to store whole
    8: (tgi_answer("42"), None),
    9: (tgi_answer("42"), None),
}


def hostile(req: Request) -> bytes:
    return ANSWERS[json.loads(req.body)["parameters"]["seed"] % 10][0]


def test_a_run_against_a_hostile_server_finishes_with_one_row_per_agent(dask_client, tmp_path):
    n, rounds = 60, 2
    with HostileServer(hostile) as url:
        config = small_config(
            tmp_path,
            population={"size": n, "partitions": 2},
            game={"rounds": rounds},
            agents={"backend": "tgi", "max_raw_chars": 100,
                    "tgi": {"endpoints": [url], "retries": 0, "timeout_s": 30}},
        )
        run_simulation(config, client=dask_client, console=Console(quiet=True))

    assert read_ledger(config.run_dir).state == "finished"
    for part in sorted(RunPaths(config.run_dir).rounds.rglob("*.parquet")):
        table = pq.read_table(part)  # every file is whole and readable on its own
        assert table.schema.field("raw_truncated").type == "bool"
    rows = read_rounds(config.run_dir)
    assert len(rows) == n * rounds
    seen = set()
    for r in range(rounds):
        frame = rows[rows["round"] == r + 1].sort_values("agent_id")  # numbered from 1
        assert frame["agent_id"].tolist() == list(range(n))
        kinds = agent_seeds(config.run.seed, r, frame["agent_id"].to_numpy()) % 10
        for kind, row in zip(kinds.tolist(), frame.itertuples(), strict=True):
            seen.add(kind)
            reason = ANSWERS[kind][1]
            if reason is not None:
                assert row.status == "error" and reason in row.error, (kind, row.error)
                assert np.isnan(row.guess) and pd.isna(row.raw) and not row.raw_truncated
                assert (row.tokens_in, row.tokens_out) == (0, 0)
            elif kind == 7:  # parsed from the whole text, stored as a 100-character prefix
                assert (row.status, row.guess) == ("ok", 33.0)
                assert row.raw == "x" * 100 and row.raw_truncated
            else:
                assert (row.status, row.guess, row.raw, row.raw_truncated) == (
                    "ok", 42.0, "42", False)
                assert (row.tokens_in, row.tokens_out) == (7, 2)
    assert seen == set(ANSWERS)  # every kind of answer was met
