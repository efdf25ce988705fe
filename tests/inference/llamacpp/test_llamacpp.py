"""The embedded llama.cpp back-end and its HTTP server module, on the real Gemma 3 270M
model (no mocks)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import urllib.request

import pytest

from simpipe.config.model import ConfigError, config_from_dict
from simpipe.games.answers import NumberAnswer
from simpipe.inference.base import GenerationRequest, OutputConstraint
from simpipe.inference.llamacpp.backend import LlamaCppBackend
from simpipe.inference.llamacpp.model_files import (
    default_model_path,
    engine_model_path,
    resolve_model_path,
)
from simpipe.inference.settings import LlamaCppSettings
from simpipe.servers.llamacpp_server import LlamaCppProcess

pytestmark = [pytest.mark.llm, pytest.mark.slow]

INT_0_100 = OutputConstraint(gbnf='root ::= "100" | [1-9] [0-9] | [0-9]')
JOBS = ("teacher", "chef", "economist", "pilot")


def _prompt(i: int) -> str:
    return (
        f"Player {i} is a {JOBS[i % 4]} aged {20 + i}. Everyone picks a number; the winner "
        "is closest to 2/3 of the average. Answer with a whole number between 0 and 100.\n"
        "My number:"
    )


def _requests(n: int = 16, temperature: float = 1.0) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt=_prompt(i), max_tokens=4, temperature=temperature,
                          seed=1000 + i, constraint=INT_0_100)
        for i in range(n)
    ]


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=8, threads=1))
    yield b
    _run(b.aclose())


def test_sixteen_grammar_prompts_give_integers(backend):
    results = _run(backend.generate(_requests(16)))
    assert len(results) == 16
    for r in results:
        assert r.status == "ok", r.error
        assert r.text is not None and r.text.isdigit(), r.text
        assert 0 <= int(r.text) <= 100
        assert r.tokens_in > 10 and 1 <= r.tokens_out <= 4
        assert r.latency_s > 0 and r.finish_reason in ("stop", "length")
    counters = backend.counters()["llamacpp"]
    assert counters["requests"] >= 16 and counters["errors"] == 0


def test_the_shipped_engine_takes_the_answer_as_an_llguidance_grammar(backend):
    """The build has llguidance, so the per-agent answer goes as the cheaper llguidance
    grammar, and it admits exactly the game's numbers: 0..20 for the public goods game
    (GBNF for 0..100 sent alongside must not be what the engine used)."""
    assert backend.llguidance
    answer = NumberAnswer(0, 20)
    only_lark = OutputConstraint(gbnf=INT_0_100.gbnf, lark=answer.lark())
    requests = [GenerationRequest(prompt=_prompt(i), max_tokens=4, temperature=1.5,
                                  seed=2000 + i, constraint=only_lark) for i in range(24)]
    results = _run(backend.generate(requests))
    values, statuses = answer.parse_many([r.text for r in results])
    assert (statuses == "ok").all(), [r.text for r in results]
    assert ((values >= 0) & (values <= 20)).all()
    assert len(set(values.tolist())) > 3  # sampled, not one forced answer


def test_chat_messages_request(backend):
    req = GenerationRequest(
        messages=({"role": "system", "content": "You play a number guessing game."},
                  {"role": "user", "content": "Pick a whole number between 0 and 100."}),
        max_tokens=4, seed=7, constraint=INT_0_100,
    )
    (r,) = _run(backend.generate([req]))
    assert r.status == "ok", r.error
    assert r.text.isdigit() and 0 <= int(r.text) <= 100
    assert r.tokens_in > 10  # the ChatML template wrapped the messages


def test_bad_grammar_is_a_per_request_error(backend):
    broken = OutputConstraint(gbnf="root ::= [")
    bad = GenerationRequest(prompt="x", max_tokens=2, constraint=broken)
    good = _requests(1)[0]
    r_bad, r_good = _run(backend.generate([bad, good]))
    assert r_bad.status == "error" and "grammar" in r_bad.error and r_bad.text is None
    assert r_good.status == "ok"


@pytest.mark.parametrize("n_parallel,serial", [(1, False), (8, True)])
def test_same_batch_gives_same_texts_when_serial(n_parallel: int, serial: bool) -> None:
    # llama.cpp is not bit-reproducible when sequences share a batch (results depend on
    # batch composition) or reuse a prefix cached by another request, so reproducibility
    # is promised for serial calls (one slot, or agents.reproducible = true): a batch's
    # first prompt is decoded afresh, so what ran before cannot change its texts.
    b = LlamaCppBackend(LlamaCppSettings(n_parallel=n_parallel, threads=1), serial=serial)
    others = [GenerationRequest(prompt=f"Count to {k}:", max_tokens=4, seed=k)
              for k in range(5)]
    try:
        first = [r.text for r in _run(b.generate(_requests(8)))]
        _run(b.generate(others))
        second = [r.text for r in _run(b.generate(_requests(8)))]
    finally:
        _run(b.aclose())
    assert first == second
    assert len(set(first)) > 1  # different seeds, different texts: not a constant


def test_bad_model_path_names_the_config_key(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ConfigError) as info:  # refused when the config is read
        config_from_dict({"agents": {"backend": "llamacpp",
                                     "llamacpp": {"model_path": str(missing)}}})
    message = str(info.value)
    assert "agents.llamacpp.model_path" in message and str(missing) in message


def test_default_model_path_is_reused(tmp_path, monkeypatch):
    path = default_model_path()
    assert path.is_file() and path.suffix == ".gguf"
    mtime = path.stat().st_mtime_ns
    assert default_model_path() == path and path.stat().st_mtime_ns == mtime
    assert resolve_model_path(LlamaCppSettings()) == engine_model_path()
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path))
    fresh = default_model_path()
    assert fresh == tmp_path / "models" / path.name
    assert fresh.stat().st_size == path.stat().st_size
    # No temp files left: the model, the record of its verified hash, the lock.
    assert sorted(p.name for p in fresh.parent.iterdir()) == sorted(
        [path.name, f".{path.name}.sha256.json", f".{path.name}.lock"])


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def test_server_module_serves_and_stops_on_sigterm():
    server = LlamaCppProcess(parallel=2, threads=1).start()  # --port 0: a free port
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:[1-9][0-9]*", server.url), server.urls
        base = server.url
        with urllib.request.urlopen(f"{base}/health", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as resp:
            assert json.load(resp)["data"]
        out = _post(f"{base}/v1/completions", {
            "model": "default", "prompt": _prompt(0), "max_tokens": 4, "seed": 3,
            "grammar": INT_0_100.gbnf,
        })
        text = out["choices"][0]["text"]
        assert text.isdigit() and 0 <= int(text) <= 100
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert server.proc.stdout.read() == ""  # exactly one line on stdout
    finally:
        server.stop()

