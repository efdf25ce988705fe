"""How hard a run presses its servers is not part of what it is: a run whose answers timed
out resumes with a longer ``timeout_s`` (or other concurrency, retries, back-off, answer
bound), while a change of what is asked is still refused; a run folder made when those keys
counted in the results hash still resumes with the values it was made with."""

from __future__ import annotations

import json

import pytest

from simpipe.config.model import load_config
from simpipe.inference.settings import LOAD_CONTROL_KEYS
from simpipe.store.layout import RunPaths
from simpipe.store.ledger import RunDirError, open_run_dir

SERVED = """
[run]
name = "served"
output_dir = "{out}"
[population]
size = 40
partitions = 2
[game]
rounds = 2
[agents]
backend = "tgi"
[agents.tgi]
endpoints = ["http://127.0.0.1:1"]
[cluster]
workers = 1
dashboard_address = ""
"""
#: What 20c691c (load-control keys still in the hash) recorded in run.json for SERVED with
#: these values.
EARLIER = ["agents.tgi.max_concurrency=8", "agents.tgi.timeout_s=30.0"]
EARLIER_HASH = "d609b46a97420fd9"

PRESSED_OTHERWISE = ["agents.tgi.max_concurrency=4", "agents.tgi.timeout_s=600.0",
                     "agents.tgi.retries=10", "agents.tgi.backoff_s=2.0",
                     "agents.tgi.backoff_max_s=60.0", "agents.tgi.max_response_bytes=8192"]


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(SERVED.format(out=(tmp_path / "results").as_posix()))
    return path


def _open(config, resume: bool):
    return open_run_dir(RunPaths(config.run_dir), config, resume=resume, force=False)


def test_every_load_control_key_is_overridden_here():
    assert sorted(k.split("=")[0].rsplit(".", 1)[1] for k in PRESSED_OTHERWISE) == sorted(
        LOAD_CONTROL_KEYS)


def test_a_run_resumes_with_other_load_control_values_but_not_other_questions(config_file):
    first = load_config(config_file)
    _open(first, resume=False)
    again = load_config(config_file, PRESSED_OTHERWISE)
    assert again.results_hash() == first.results_hash()
    _open(again, resume=True)  # accepted
    with pytest.raises(RunDirError, match="different config.*--force"):
        _open(load_config(config_file, ["agents.temperature=0.5"]), resume=True)
    with pytest.raises(RunDirError, match="already holds this run.*--resume"):
        _open(again, resume=False)  # still never replaced silently


def test_a_run_folder_made_when_load_control_counted_resumes_as_it_was_made(config_file):
    made = load_config(config_file, EARLIER)
    _open(made, resume=False)
    ledger = made.run_dir / "run.json"
    data = json.loads(ledger.read_text())
    data["config_hash"] = EARLIER_HASH
    ledger.write_text(json.dumps(data))
    assert made.results_hash() != EARLIER_HASH
    _open(made, resume=True)  # the values it was made with
    with pytest.raises(RunDirError, match=f"hash {EARLIER_HASH} there"):
        _open(load_config(config_file, ["agents.tgi.max_concurrency=16"]), resume=True)
