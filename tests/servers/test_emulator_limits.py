"""The emulator's bounds, each against a real emulator process: a regex that a backtracking
matcher never finishes, oversized request heads, URLs and bodies, too many body bytes at
once, token budgets beyond the context, queues beyond their bound, and settings that are not
finite numbers. Each of these once froze the process, grew it by gigabytes or ended in a
traceback. Attack sizes are kept just over each limit (tens of MB at most): the test proves
the bound, the process's memory shows it held."""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys

import psutil
import pytest

from simpipe.servers.emulator import EmulatorProcess
from simpipe.servers.http import MAX_BODY, MAX_BUFFERED_BODIES, MAX_HEAD, MAX_URL

#: A frozen server fails the test here instead of hanging it.
TIMEOUT_S = 30
MODEL = "simpipe/emulated"
#: 2**n steps for Python's ``re`` on a text of n characters that does not end in Z.
REDOS = "([^Z]|[^Z])*Z"
MiB = 2**20


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _request(url: str, method: str, path: str, body: object = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*_address(url), timeout=TIMEOUT_S)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}
    finally:
        conn.close()


def _health(url: str) -> int:
    return _request(url, "GET", "/health")[0]


def _connect(url: str) -> socket.socket:
    return socket.create_connection(_address(url), timeout=TIMEOUT_S)


def _status(sock: socket.socket) -> int:
    """The status of the answer on ``sock`` (0: the server closed without answering)."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _send_all(sock: socket.socket, data: bytes, piece: int = MiB) -> None:
    """Send ``data``, stopping quietly where the server has closed the connection."""
    try:
        for i in range(0, len(data), piece):
            sock.sendall(data[i:i + piece])
    except (BrokenPipeError, ConnectionResetError):
        pass


def _rss(proc: EmulatorProcess) -> int:
    return psutil.Process(proc.proc.pid).memory_info().rss


# --- 1. a regex that freezes a backtracking matcher ------------------------------------------


def test_a_catastrophic_regex_is_answered_and_health_keeps_answering():
    tgi = {"inputs": "Guess a number.", "parameters": {
        "max_new_tokens": 100, "seed": 3, "grammar": {"type": "regex", "value": REDOS}}}
    openai = {"model": MODEL, "prompt": "Guess a number.", "max_tokens": 100, "seed": 3}
    with EmulatorProcess(profile="fast") as emu:
        url = emu.url
        # Sent first on its own connection: the old matcher froze the whole process on it.
        frozen = _connect(url)
        body = json.dumps(tgi).encode()
        frozen.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert _health(url) == 200
        assert _status(frozen) == 200
        frozen.close()
        answers = [
            _request(url, "POST", "/generate", tgi),
            _request(url, "POST", "/v1/completions",
                     {**openai, "structured_outputs": {"regex": REDOS}}),
            _request(url, "POST", "/v1/completions", {**openai, "guided_regex": REDOS}),
        ]
        assert _health(url) == 200
    assert [status for status, _ in answers] == [200, 200, 200]
    # No answer matches (none ends in Z): the plain number, as before, and now at once.
    assert answers[0][1]["generated_text"].isdigit()


def test_a_regex_too_big_to_match_cheaply_is_refused_with_one_line():
    huge = "(a{100}){100}"  # 10,000 copies of `a` once expanded
    with EmulatorProcess(profile="fast") as emu:
        tgi = _request(emu.url, "POST", "/generate", {"inputs": "Guess.", "parameters": {
            "max_new_tokens": 4, "grammar": {"type": "regex", "value": huge}}})
        openai = _request(emu.url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Guess.", "max_tokens": 4,
            "structured_outputs": {"regex": huge}})
        lookahead = _request(emu.url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Guess.", "max_tokens": 4, "guided_regex": "(?=1)1"})
    assert tgi[0] == 422 and tgi[1]["error_type"] == "validation"
    assert tgi[1]["error"].startswith("grammar is too complex: more than 10000 automaton states")
    assert openai[0] == 400 and openai[1]["error"]["param"] == "structured_outputs"
    assert openai[1]["error"]["message"].startswith("regex is too complex")
    assert lookahead[0] == 400
    assert "look-around are not supported" in lookahead[1]["error"]["message"]


# --- 7. request heads, URLs and bodies -------------------------------------------------------


def test_a_header_over_the_limit_gets_431_and_a_long_one_costs_no_memory():
    with EmulatorProcess(profile="fast") as emu:
        sock = _connect(emu.url)
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD + b"\r\n\r\n")
        assert _status(sock) == 431
        sock.close()
        before = _rss(emu)
        sock = _connect(emu.url)  # a 32 MB header value, streamed
        _send_all(sock, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (32 * MiB))
        sock.close()
        grown = _rss(emu) - before
        assert _health(emu.url) == 200
    assert grown < 8 * MiB


def test_a_url_over_the_limit_gets_414_and_a_long_one_costs_no_memory():
    with EmulatorProcess(profile="fast") as emu:
        sock = _connect(emu.url)
        sock.sendall(b"GET /" + b"a" * MAX_URL + b" HTTP/1.1\r\n\r\n")
        assert _status(sock) == 414
        sock.close()
        before = _rss(emu)
        sock = _connect(emu.url)
        _send_all(sock, b"GET /" + b"a" * (32 * MiB))
        sock.close()
        grown = _rss(emu) - before
        assert _health(emu.url) == 200
    assert grown < 8 * MiB


def test_a_body_over_the_limit_gets_413_before_it_is_sent():
    with EmulatorProcess(profile="fast") as emu:
        sock = _connect(emu.url)
        sock.sendall(b"POST /generate HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        assert _status(sock) == 413
        sock.close()
        sock = _connect(emu.url)  # chunked: no length to check, the bytes are counted
        sock.sendall(b"POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (MiB, b"a" * MiB)
        _send_all(sock, piece * (MAX_BODY // MiB + 1))
        assert _status(sock) == 413
        sock.close()


def test_bodies_in_flight_are_bounded_in_total_503_beyond():
    body = MAX_BODY - 1000
    fill = MAX_BUFFERED_BODIES // body  # bodies that fit together; one more does not
    with EmulatorProcess(profile="fast") as emu:
        before = _rss(emu)
        socks = []
        for _ in range(fill + 1):
            sock = _connect(emu.url)
            sock.sendall(b"POST /generate HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % body)
            _send_all(sock, b"a" * (body - 1))  # all but the last byte: kept waiting
            socks.append(sock)
        # Whichever body crossed the bound was refused; the others still wait.
        refused, _, _ = select.select(socks, [], [], TIMEOUT_S)
        statuses = [_status(sock) for sock in refused]
        grown = _rss(emu) - before
        assert _health(emu.url) == 200
        for sock in socks:
            sock.close()
    assert statuses and set(statuses) == {503}
    assert grown < MAX_BUFFERED_BODIES + 16 * MiB


# --- 7. token budgets against the context, queues --------------------------------------------


def test_token_budgets_beyond_the_context_are_refused_as_vllm_and_tgi_do():
    with EmulatorProcess(profile="fast") as emu:
        url = emu.url
        endless = _request(url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Guess.", "max_tokens": 2_000_000, "ignore_eos": True})
        long_chat = _request(url, "POST", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 8,
            "messages": [{"role": "user", "content": "word " * 8000}]})  # + "<|user|>"
        long_tgi = _request(url, "POST", "/generate", {
            "inputs": "word " * 4000, "parameters": {"max_new_tokens": 8}})
        fits = _request(url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Guess.", "max_tokens": 8000, "ignore_eos": True})
    assert endless[0] == 400 and endless[1]["error"]["param"] == "max_tokens"
    assert "maximum context length is 8192 tokens" in endless[1]["error"]["message"]
    assert long_chat[0] == 400 and "10002 input tokens" in long_chat[1]["error"]["message"]
    assert long_tgi == (422, {"error": "`inputs` must have less than 4096 tokens. Given: 5000",
                              "error_type": "validation"})
    assert fits[0] == 200 and fits[1]["usage"]["completion_tokens"] == 8000


def test_samples_times_tokens_is_bounded_per_request():
    """``n`` multiplied the per-choice bound: n = 1,024 of 8,000 tokens was an 8 MB answer and
    1.5 s of the event loop (six at once stalled /health on another port)."""
    from simpipe.servers.contract import MAX_LOGPROB_TOKENS, MAX_SAMPLED_TOKENS

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Guess."}],
            "ignore_eos": True}
    with EmulatorProcess(profile="fast") as emu:
        url = emu.url
        huge = _request(url, "POST", "/v1/chat/completions",
                        {**chat, "n": 1024, "max_tokens": 8000})
        listed = _request(url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Guess.", "n": 64, "max_tokens": 1000, "logprobs": 0})
        fits = _request(url, "POST", "/v1/chat/completions",
                        {**chat, "n": 32, "max_tokens": 8000})
        stats = _request(url, "GET", "/emulator/stats")[1]
    assert huge[0] == 400 and huge[1]["error"]["param"] == "n"
    assert huge[1]["error"]["type"] == "invalid_request_error"
    assert f"at most {MAX_SAMPLED_TOKENS:,} per request" in huge[1]["error"]["message"]
    assert "1024 x 8000" in huge[1]["error"]["message"]
    assert listed[0] == 400
    assert f"at most {MAX_LOGPROB_TOKENS:,} per request with logprobs" in \
        listed[1]["error"]["message"]
    assert fits[0] == 200 and len(fits[1]["choices"]) == 32
    assert fits[1]["usage"]["completion_tokens"] == 32 * 8000 <= MAX_SAMPLED_TOKENS
    assert stats["invalid"] == 2


def test_queued_requests_are_bounded_in_bytes_503_beyond():
    prompt = "word " * 5600  # 7,000 tokens
    request = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(request)
    fit = MiB // len(request)  # what a 1 MiB queue holds; one more does not fit
    # Nothing ever finishes (an hour per step): every request stays queued.
    with EmulatorProcess(profile="fast", params={"step_base_s": 3600.0},
                         max_queued_mb=1) as emu:
        socks = []
        for _ in range(fit + 1):
            sock = _connect(emu.url)
            sock.sendall(head + request)
            socks.append(sock)
        refused, _, _ = select.select(socks, [], [], TIMEOUT_S)
        statuses = [_status(sock) for sock in refused]
        stats = _request(emu.url, "GET", "/emulator/stats")[1]
        for sock in socks:
            sock.close()
    assert statuses == [503]
    assert (stats["queued"] + stats["running"], stats["rejected"]) == (fit, 1)


def _emulator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simpipe.servers.emulator", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S)


# --- 9, 13. settings that are not finite, absurd or spin a core ------------------------------


@pytest.mark.parametrize(("args", "named"), [
    (["--max-concurrent-requests", "1000000"], "max_concurrent_requests = 1000000"),
    (["--max-concurrent-requests", "inf"], "max_concurrent_requests = inf"),
    (["--max-batch", "inf"], "max_batch = inf"),
    (["--step-base-s", "nan"], "step_base_s = nan"),
    (["--prefill-s-per-token", "inf"], "prefill_s_per_token = inf"),
    (["--time-scale", "1e-320"], "--time-scale 1e-320"),
    (["--time-scale", "nan"], "--time-scale nan"),
    (["--sample-s", "0"], "--sample-s 0"),
    (["--tick-s", "inf"], "--tick-s inf"),
    (["--gpus", "100000"], "--gpus 100000"),
    (["--max-queued-mb", "nan"], "--max-queued-mb nan"),
])
def test_settings_that_are_not_finite_or_absurd_are_one_line_at_once(args, named):
    proc = _emulator(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simpipe-emulator: ")
    assert named in lines[0]
