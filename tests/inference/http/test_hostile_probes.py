"""A server's probe answers on the answer-distribution routes are untrusted input.

``agents.openai.answer_distributions = "llamacpp"`` (or ``"vllm"``) builds each prompt's
answer tree from a server's ``/tokenize`` and top log-probabilities. Every value read from
those answers is checked where it is parsed (``simpipe.inference.answer_checks``'s
``probe_*``): a bad one is a ``ProbeError`` naming the field, and the compute paths (the
round plan's chunks, the process cache, the lazy walk) turn it into that prompt's agents
being answered by calls of their own, never the run ending. The whole-run test plays a run
against a fake llama.cpp server (``hostile_server.fake_llamacpp``) that answers each bad
value."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpipe.agents.llm import LLMAgents
from simpipe.answers.shared import SharedAnswers, prompt_hash
from simpipe.config.model import config_from_dict
from simpipe.core import aio
from simpipe.games.answer_format import IntegerAnswers
from simpipe.games.base import Turn
from simpipe.games.registry import game_for
from simpipe.inference.http.backend import RequestFailed
from simpipe.inference.http.openai_compat import OpenAIBackend
from simpipe.inference.llamacpp import completions as llamacpp
from simpipe.inference.llamacpp import logprobs as llamacpp_logprobs
from simpipe.inference.settings import OpenAISettings
from simpipe.inference.types import ChainSettings, Probe, ProbeError
from simpipe.inference.vllm import logprobs as vllm_logprobs
from simpipe.run.console import Console
from simpipe.run.planned_round import plan_chunk
from simpipe.run.simulation import run_simulation
from simpipe.store.layout import RunPaths
from simpipe.store.results import read_ledger, read_rounds

from hostile_server import (
    FAKE_EOS_ID,
    FAKE_IDS,
    HostileServer,
    Request,
    Silences,
    fake_llamacpp,
    good_top_logprobs,
    http,
    llamacpp_completion,
    llamacpp_tokens,
    ok_json,
)
from support import small_config

GOOD = good_top_logprobs()
SPACE = FAKE_IDS[" "]
LANG = IntegerAnswers(0, 100)
SETTINGS = ChainSettings(1.0)

#: Top log-probability lists a server may answer, each with what the error must name.
BAD_TOPS: dict[str, tuple[list[tuple[Any, Any]], str]] = {
    "one NaN": ([(SPACE, math.nan), *GOOD[1:]], "log-probability of token 20 is nan"),
    "all -Infinity": ([(t, -math.inf) for t, _ in GOOD], "is -inf, not a finite number"),
    "one +Infinity": ([(SPACE, math.inf), *GOOD[1:]], "is inf, not a finite number"),
    "+5 for every token": ([(t, 5.0) for t, _ in GOOD], "is 5.0, not a finite number <= 0"),
    "probabilities summing to 14.85": ([(t, math.log(0.99)) for t in range(10, 25)],
                                       "the listed probabilities sum to 14.85"),
    "a token id of 10**25": ([(10**25, -0.1), *GOOD[1:]], "10000000000000000000000000 is "
                             "not a token id"),
    "a negative token id": ([(-3, -0.1), *GOOD[1:]], "-3'? is not a token id"),
    "a token id past int32": ([(2**31, -0.1), *GOOD[1:]], "2147483648 is not a token id"),
    "an empty list": ([], "lists no token"),
}
#: Token counts (``timings.prompt_n`` / ``usage.prompt_tokens``) a server may answer.
BAD_COUNTS = {"-7": -7, "10**20": 10**20, "2**31": 2**31, "2.5": 2.5, "'7'": "7",
              "true": True}


def _wire(data: Any) -> Any:
    """``data`` as it arrives: JSON text parsed by ``json.loads`` (NaN and Infinity are
    Python's JSON extensions, which the client's reader accepts)."""
    return json.loads(json.dumps(data))


def _llamacpp_probe(answer: Any) -> Any:
    """What the llama.cpp server route's probe makes of one ``/completion`` answer."""
    probe = next(llamacpp_logprobs.session(lambda path, body: _wire(answer), "p"))
    return probe((), 16)


def _vllm_completion(top: list[tuple[Any, Any]], prompt_tokens: Any = 7,
                     completion_tokens: Any = 1) -> dict:
    entries = {f"token_id:{t}": lp for t, lp in top}
    return {"choices": [{"index": 0, "text": "x", "logprobs": {"top_logprobs": [entries]}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def _vllm_probe(answer: Any, prompt_tokens: Any = None) -> Any:
    """What vLLM's route makes of its prompt's ``/tokenize`` and one probe answer."""

    def post(path: str, body: dict) -> Any:
        if path == "/tokenize":
            return _wire({"tokens": [2, 5] if prompt_tokens is None else prompt_tokens})
        return _wire(answer)

    with contextlib.closing(vllm_logprobs.session(post, "m", "p", 1024)) as session:
        return next(session)((), 16)


def _embedded_probe(top: list[tuple[Any, Any]], prompt_n: Any = 7) -> Any:
    """What the embedded engine makes of its in-process server's answer."""
    entries = [{"id": t, "token": "x", "bytes": [120], "logprob": lp} for t, lp in top]
    return llamacpp.top_logprobs_of(_wire({
        "choices": [{"logprobs": {"content": [{"top_logprobs": entries}]}}],
        "timings": {"prompt_n": prompt_n}, "usage": {"completion_tokens": 1}}))


PARSERS: dict[str, Callable[[list[tuple[Any, Any]]], Any]] = {
    "llama.cpp server": lambda top: _llamacpp_probe(llamacpp_completion(top)),
    "vLLM": lambda top: _vllm_probe(_vllm_completion(top)),
    "embedded llama.cpp": _embedded_probe,
}


# --- The parsers -----------------------------------------------------------------------------

@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("kind", BAD_TOPS)
def test_a_bad_top_logprob_list_is_a_probe_error_naming_it(parser: str, kind: str) -> None:
    top, reason = BAD_TOPS[kind]
    with pytest.raises(ProbeError, match=f"top_logprobs.*{reason}"):
        PARSERS[parser](top)


@pytest.mark.parametrize("kind", ["a listed token twice", "an id that is text",
                                  "an id that is a boolean", "a log-probability as text"])
def test_a_top_logprob_entry_of_the_wrong_kind_is_a_probe_error(kind: str) -> None:
    top = {"a listed token twice": [*GOOD, GOOD[0]],
           "an id that is text": [("20", -0.1), *GOOD[1:]],
           "an id that is a boolean": [(True, -0.1), *GOOD[1:]],
           "a log-probability as text": [(SPACE, "-0.1"), *GOOD[1:]]}[kind]
    for parser in ("llama.cpp server", "embedded llama.cpp"):
        with pytest.raises(ProbeError, match="top_logprobs"):
            PARSERS[parser](top)


@pytest.mark.parametrize("key", ["token_id:-1", "token_id:\u0663", "token_id: 5",
                                 "token_id:99999999999", "20"])
def test_a_vllm_token_key_that_is_no_token_id_is_a_probe_error(key: str) -> None:
    answer = _vllm_completion(GOOD[1:])
    answer["choices"][0]["logprobs"]["top_logprobs"][0][key] = -0.1
    with pytest.raises(ProbeError, match="top_logprobs.*not a token id"):
        _vllm_probe(answer)


@pytest.mark.parametrize("value", BAD_COUNTS.values(), ids=BAD_COUNTS)
def test_a_bad_token_count_is_a_probe_error_naming_the_field(value: Any) -> None:
    with pytest.raises(ProbeError, match="timings.prompt_n = .* is not a token count"):
        _llamacpp_probe(llamacpp_completion(GOOD, prompt_n=value))
    with pytest.raises(ProbeError, match="tokens_predicted = .* is not a token count"):
        _llamacpp_probe(llamacpp_completion(GOOD, tokens_predicted=value))
    with pytest.raises(ProbeError, match="usage.prompt_tokens = .* is not a token count"):
        _vllm_probe(_vllm_completion(GOOD, prompt_tokens=value))
    with pytest.raises(ProbeError, match="usage.completion_tokens = .* is not a token count"):
        _vllm_probe(_vllm_completion(GOOD, completion_tokens=value))
    with pytest.raises(ProbeError, match="timings.prompt_n = .* is not a token count"):
        _embedded_probe(GOOD, prompt_n=value)


def test_good_probe_answers_at_the_bounds_are_read() -> None:
    """What a real server answers still reads: a log-probability rounded to just above 0,
    probabilities summing to a little above 1, the largest int32 id and count; a list out
    of order comes back most likely first (its last is the floor for unlisted tokens)."""
    top = [(2**31 - 1, -9.0), (SPACE, 1e-7), (FAKE_EOS_ID, math.log(0.0005))]
    for parser in PARSERS.values():
        got, evaluated, generated = parser(top)
        assert got.ids == (SPACE, FAKE_EOS_ID, 2**31 - 1)
        assert got.logprobs == (1e-7, math.log(0.0005), -9.0) and got.floor == -9.0
    got, evaluated, generated = _llamacpp_probe(
        llamacpp_completion(GOOD, prompt_n=2**31 - 1, tokens_predicted=0))
    assert (evaluated, generated) == (2**31 - 1, 0)
    got, evaluated, generated = _llamacpp_probe(
        {"completion_probabilities": [{"top_logprobs": [{"id": 20, "logprob": -0.1}]}]})
    assert (got.ids, evaluated, generated) == ((20,), 0, 0)  # absent counts are 0


def _tokenize_with(text: str, hostile: Any) -> Callable[[str, list[dict]], list[Any]]:
    """``post_many`` of llama.cpp's fake tokenizer, ``text``'s answer replaced."""

    def post_many(path: str, bodies: list[dict]) -> list[Any]:
        assert path == "/tokenize"
        return [_wire(hostile if b["content"] == text else llamacpp_tokens(b)) for b in bodies]

    return post_many


@pytest.mark.parametrize("tokens, reason", [
    ([{"id": 10**25, "piece": "0"}], "tokens.*10000000000000000000000000 is not a token id"),
    ([{"id": -3, "piece": "0"}], "tokens.*-3 is not a token id"),
    ([{"id": "10", "piece": "0"}], "tokens.*'10' is not a token id"),
    ([{"id": True, "piece": "0"}], "tokens.*True is not a token id"),
    ([{"id": 10, "piece": 5}], r"tokens\[0\].piece is a number, not text or bytes"),
], ids=["id 10**25", "id -3", "id as text", "id true", "piece a number"])
def test_a_bad_llamacpp_tokenize_answer_is_a_probe_error(tokens: list, reason: str) -> None:
    with pytest.raises(ProbeError, match=reason):
        llamacpp_logprobs.answer_vocab(_tokenize_with("0", {"tokens": tokens}), LANG.alphabet)


def _vllm_tokenize(hostile_text: str, hostile: Any) -> Callable[[str, list[dict]], list[Any]]:
    def post_many(path: str, bodies: list[dict]) -> list[Any]:
        out = []
        for b in bodies:
            text = b["prompt"]
            if text == hostile_text:
                out.append(_wire(hostile))
            elif text == "<eos>":
                out.append({"tokens": [FAKE_EOS_ID], "token_strs": ["<eos>"]})
            else:
                out.append({"tokens": [FAKE_IDS.get(c, 1000 + ord(c)) for c in text],
                            "token_strs": list(text)})
        return out

    return post_many


@pytest.mark.parametrize("answer, reason", [
    ({"tokens": [-1]}, "tokens: -1 is not a token id"),
    ({"tokens": [2**31]}, "tokens: 2147483648 is not a token id"),
    ({"tokens": [FAKE_EOS_ID], "token_strs": {"<eos>": 1}}, "token_strs is an object"),
    ({"tokens": [FAKE_EOS_ID], "token_strs": 5}, "token_strs is a number"),
], ids=["id -1", "id 2**31", "token_strs an object", "token_strs a number"])
def test_a_bad_vllm_tokenize_answer_is_a_probe_error(answer: dict, reason: str) -> None:
    with pytest.raises(ProbeError, match=reason):
        vllm_logprobs.answer_vocab(_vllm_tokenize("<eos>", answer), "m", LANG.alphabet)


def test_a_bad_vllm_prompt_tokenization_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="/tokenize tokens: 1099511627776 is not a token id"):
        _vllm_probe(_vllm_completion(GOOD), prompt_tokens=[2, 2**40])


def test_a_failed_batch_of_requests_stops_asking() -> None:
    """One failed ``/tokenize`` of the ~1,100 the vocabulary asks fails the batch at once;
    the requests still to send are not sent (before: every one of them, in the
    background, after the error was raised)."""
    sent = 0

    async def post_json(path: str, body: bytes) -> Any:
        nonlocal sent
        sent += 1
        first = sent == 1
        await asyncio.sleep(0)
        if first:
            raise RequestFailed("404 File Not Found")
        return {}

    async def main() -> None:
        with pytest.raises(RequestFailed):
            await vllm_logprobs.gather_posts(post_json, "/tokenize", [{}] * 1000, width=8)
        for _ in range(2000):  # what was left running gets its turns
            await asyncio.sleep(0)

    asyncio.run(main())
    assert sent <= 16


# --- The compute paths -----------------------------------------------------------------------

#: A ``/tokenize`` that fails; "a timeout" answers nothing (the client gives up after its
#: ``timeout_s``, 1 s here).
TOKENIZE_FAULTS = ["404", "tokens not a list", "a timeout"]


def _tokenize_fault(fault: str, silences: Silences) -> Callable[[Request], Any]:
    if fault == "404":
        return lambda req: http(404, b'{"error": {"code": 404, "message": "File Not Found"}}')
    if fault == "tokens not a list":
        return lambda req: ok_json({"tokens": "not a list"})
    return lambda req: silences.answer()


@pytest.fixture
def silences() -> Silences:
    return Silences()
TOKENIZE_REASONS = {"404": "/tokenize: .*404", "tokens not a list": "/tokenize answered "
                    "without a list", "a timeout": "/tokenize: .*(timed out|timeout)"}


def _backend(url: str, **settings: Any) -> OpenAIBackend:
    return OpenAIBackend(OpenAISettings(**{
        "endpoints": [url], "answer_distributions": "llamacpp", "retries": 0,
        "timeout_s": 1.0, **settings}))


@contextlib.contextmanager
def _served(answer: Callable[[Request], Any], silences: Silences | None = None,
            **settings: Any) -> Iterator[OpenAIBackend]:
    with HostileServer(answer) as url:
        backend = _backend(url, **settings)
        try:
            yield backend
        finally:
            aio.run_async(backend.aclose())
            if silences is not None:
                silences.release()


def _bad_completion(kind: str) -> Callable[[Request], bytes]:
    top, _ = BAD_TOPS[kind]
    return lambda req: ok_json(llamacpp_completion(top))


@pytest.mark.parametrize("fault", TOKENIZE_FAULTS)
def test_a_failed_tokenize_costs_the_prompts_their_distributions(
        fault: str, silences: Silences) -> None:
    """``/tokenize`` answering 404 (the key pointed at a vLLM, TGI or OpenAI server), a
    body without a token list, or nothing: before, a ``ProbeError`` out of the vocabulary
    ended the chunk's task, and with it the run."""
    with _served(fake_llamacpp(tokenize=_tokenize_fault(fault, silences)),
                 silences) as backend:
        shared = SharedAnswers(backend)
        chained = shared.compute_chain(["a: ", "b: "], SETTINGS, 8, (0.0, 100.0), 1e-4, [9, 9])
        alone = shared.lookup("c: ", SETTINGS, 8, (0.0, 100.0), 1e-4)
    for found in [*chained, alone]:
        assert found.distribution is None and found.computed
        assert found.problem and (found.tokens_in, found.tokens_out) == (0, 0)
        assert re.search(TOKENIZE_REASONS[fault], found.problem), found.problem


@pytest.mark.parametrize("kind", ["one NaN", "all -Infinity", "one +Infinity",
                                  "+5 for every token", "probabilities summing to 14.85",
                                  "a token id of 10**25"])
def test_a_bad_probe_answer_costs_its_prompt_its_distribution(kind: str) -> None:
    """Before: an IndexError in the draw, an OverflowError in the sampler, or (positive
    log-probabilities) a plausible distribution made of nonsense."""
    with _served(fake_llamacpp(completion=_bad_completion(kind))) as backend:
        found = SharedAnswers(backend).compute_chain(["a: "], SETTINGS, 8, (0.0, 100.0),
                                                     1e-4, [9])[0]
    assert found.distribution is None and BAD_TOPS[kind][1].split(" is ")[0] in found.problem


@pytest.mark.parametrize("prompt_n", [-7, 10**20], ids=["-7", "10**20"])
def test_a_bad_probe_count_costs_its_prompt_its_distribution(prompt_n: int) -> None:
    """Before: ``-7`` was charged (a round of negative tokens failed run.json's check),
    ``10**20`` overflowed the token split."""
    answer = ok_json(llamacpp_completion(GOOD, prompt_n=prompt_n))
    with _served(fake_llamacpp(completion=lambda req: answer)) as backend:
        found = SharedAnswers(backend).compute_chain(["a: "], SETTINGS, 8, (0.0, 100.0),
                                                     1e-4, [9])[0]
    assert found.distribution is None and "timings.prompt_n" in found.problem
    assert (found.tokens_in, found.tokens_out) == (0, 0)


def test_a_good_server_still_gives_distributions() -> None:
    with _served(fake_llamacpp()) as backend:
        found = SharedAnswers(backend).compute_chain(["a: "], SETTINGS, 8, (0.0, 100.0),
                                                     1e-4, [9])[0]
    dist = found.distribution
    assert dist is not None and found.problem is None and dist.unseen_mass == 0.0
    assert math.isclose(float(dist.probs.sum()), 1.0 - dist.pruned_mass, rel_tol=1e-9)
    assert found.tokens_in == 7 * found.calls and found.tokens_out == found.calls


def _vllm_server(prompt_tokens: Any) -> Callable[[Request], Any]:
    """vLLM's routes: ``/tokenize`` of the vocabulary fine, of a prompt ``prompt_tokens``."""

    def answer(req: Request) -> Any:
        body = req.json()
        if req.path == "/tokenize":
            text = body["prompt"]
            if body["add_special_tokens"]:
                return ok_json({"tokens": prompt_tokens})
            if text == "<eos>":
                return ok_json({"tokens": [FAKE_EOS_ID], "token_strs": ["<eos>"]})
            return ok_json({"tokens": [FAKE_IDS.get(c, 1000 + ord(c)) for c in text],
                            "token_strs": list(text)})
        return ok_json(_vllm_completion(GOOD))

    return answer


@pytest.mark.parametrize("prompt_tokens", ["not a list", [1, 2**40]], ids=["text", "id 2**40"])
def test_vllm_prompt_tokenize_failing_costs_the_prompt_its_distribution(
        prompt_tokens: Any) -> None:
    """vLLM's route tokenizes each prompt when its session opens; before, the error there
    was raised outside the per-prompt catch."""
    with _served(_vllm_server(prompt_tokens), answer_distributions="vllm",
                 max_logprobs=64) as backend:
        found = SharedAnswers(backend).compute_chain(["a: "], SETTINGS, 8, (0.0, 100.0),
                                                     1e-4, [9])[0]
    assert found.distribution is None and "/tokenize" in found.problem


def _agents_config(url: str) -> Any:
    return config_from_dict({
        "run": {"seed": 5},
        "game": {"rounds": 2},
        "agents": {"backend": "openai", "openai": {
            "endpoints": [url], "answer_distributions": "llamacpp", "retries": 0,
            "timeout_s": 1.0}}})


@pytest.mark.parametrize("fault", ["/tokenize 404", "one NaN"])
def test_plan_chunk_survives_a_bad_server(fault: str) -> None:
    """The round plan's stage 2 (``plan_chunk``, a worker task): before, a ProbeError or an
    IndexError out of it failed the round."""
    answer = (fake_llamacpp(tokenize=_tokenize_fault("404", Silences()))
              if fault == "/tokenize 404" else fake_llamacpp(completion=_bad_completion(fault)))
    with HostileServer(answer) as url:
        config = _agents_config(url)
        texts = {prompt_hash(p): p for p in ("a: ", "b: ")}
        chunk = plan_chunk(config.agents, game_for(config.game), np.array(list(texts), np.uint64),
                           np.array([9, 9]), texts)
    assert [f.distribution for f in chunk.lookups] == [None, None]
    assert all(f.problem for f in chunk.lookups)


class _ChainedOverHttp(OpenAIBackend):
    """The embedded engine's chain interface (``logprob_chain``) over llama.cpp's server
    routes, so that the lazy walk of ``simpipe.agents.llm`` meets a server's answers."""

    chains_probes = True

    @contextlib.contextmanager
    def logprob_chain(self, vocab: Any = None, settings: Any = None
                      ) -> Iterator[Callable[[str], Probe]]:
        yield lambda prompt: next(llamacpp_logprobs.session(self._post, prompt))


@pytest.mark.parametrize("fault", ["/tokenize 404", "one NaN", "a token id of 10**25"])
def test_the_lazy_walk_answers_by_calls_when_the_probes_are_bad(fault: str) -> None:
    """Agents with prompts of their own are walked lazily (few agents per prompt): before,
    the vocabulary's ProbeError, the draw's IndexError or the sampler's OverflowError ended
    the partition."""
    answer = (fake_llamacpp(tokenize=_tokenize_fault("404", Silences()))
              if fault == "/tokenize 404" else fake_llamacpp(completion=_bad_completion(fault)))
    with HostileServer(answer) as url:
        config = _agents_config(url)
        backend = _ChainedOverHttp(config.agents.openai)
        try:
            agents = pd.DataFrame({"agent_id": np.arange(3, dtype=np.int64),
                                   "persona": [f"You are agent {k}." for k in range(3)]})
            turn = Turn(game_for(config.game), 5, 0, 0, np.empty((3, 0)), np.empty((3, 0)))
            decisions = LLMAgents(backend, config.agents).decide(agents, turn)
        finally:
            aio.run_async(backend.aclose())
    frame = decisions.frame
    assert frame["status"].tolist() == ["ok"] * 3 and frame["guess"].tolist() == [42.0] * 3
    assert not frame["shared"].any() and decisions.stats.fallback_prompts == 3
    assert decisions.stats.problem


# --- A whole run -----------------------------------------------------------------------------

#: The bad answers the fake llama.cpp server gives, in this order: ``/tokenize`` to the
#: first request of each of the first three vocabulary batches, ``/completion`` to the first
#: probe (the root) of the first trees; every other request is answered well.
RUN_TOKENIZE_FAULTS = TOKENIZE_FAULTS
RUN_COMPLETION_FAULTS: list[tuple[str, Callable[[], bytes]]] = [
    *((kind, lambda kind=kind: ok_json(llamacpp_completion(BAD_TOPS[kind][0])))
      for kind in ["one NaN", "all -Infinity", "one +Infinity", "a token id of 10**25",
                   "+5 for every token", "probabilities summing to 14.85"]),
    ("prompt_n -7", lambda: ok_json(llamacpp_completion(GOOD, prompt_n=-7))),
    ("prompt_n 10**20", lambda: ok_json(llamacpp_completion(GOOD, prompt_n=10**20))),
]


class _RunServer:
    """The fake llama.cpp server of the whole-run test; ``served`` lists the faults given."""

    def __init__(self) -> None:
        self.served: list[str] = []
        self.largest_counts = 0
        self.silences = Silences()
        self._tokenize = list(RUN_TOKENIZE_FAULTS)
        self._completion = list(RUN_COMPLETION_FAULTS)
        self._good = fake_llamacpp()

    def __call__(self, req: Request) -> Any:
        body = req.json()
        # A vocabulary batch starts with the text "0" (candidate_pieces' first).
        if req.path == "/tokenize" and body["content"] == "0" and self._tokenize:
            fault = self._tokenize.pop(0)
            self.served.append(fault)
            return _tokenize_fault(fault, self.silences)(req)
        if req.path == "/completion" and len(body["prompt"]) == 1 and self._completion:
            fault, reply = self._completion.pop(0)
            self.served.append(fault)
            return reply()
        if req.path == "/completion" and len(self.served) >= len(RUN_TOKENIZE_FAULTS) + len(
                RUN_COMPLETION_FAULTS) and len(body["prompt"]) == 2:
            # Trees computed after the faults carry the largest valid count on a probe:
            # split over few agents and summed with others it must not wrap the int32
            # column.
            self.largest_counts += 1
            return ok_json(llamacpp_completion(GOOD, prompt_n=2**31 - 1))
        return self._good(req)


def test_a_run_against_a_server_with_bad_probe_answers_finishes(dask_client, tmp_path):
    """``run_simulation`` on real Dask workers against a llama.cpp server answering each
    bad probe value: every agent has its one row per round, the run finishes.

    Four kinds of agents, about 16 of each: each kind's prompt is worth a tree (the round
    plan's), and a kind whose tree fails is answered by calls of their own, all ``42``, so
    its next prompt is again one for all of them: the 11 faults meet 11 tree attempts in
    the first three rounds (``_RunServer``), the fourth round's trees are good."""
    n, rounds = 64, 4
    server = _RunServer()
    with HostileServer(server) as url:
        config = small_config(
            tmp_path,
            population={"size": n, "partitions": 2,
                        "attributes": {"kind": {"values": {f"k{i}": 1 for i in range(4)}}},
                        "persona": {"mode": "template", "template": "You are of kind {kind}."}},
            game={"rounds": rounds},
            agents={"backend": "openai", "openai": {
                "endpoints": [url], "answer_distributions": "llamacpp", "retries": 0,
                "timeout_s": 1.0}},
        )
        try:
            run_simulation(config, client=dask_client, console=Console(quiet=True))
        finally:
            server.silences.release()

    assert server.served == RUN_TOKENIZE_FAULTS + [k for k, _ in RUN_COMPLETION_FAULTS]
    assert server.largest_counts > 0
    ledger = read_ledger(config.run_dir)
    assert ledger.state == "finished"
    rows = read_rounds(config.run_dir)
    assert len(rows) == n * rounds
    assert rows["round"].nunique() == rounds
    for _, frame in rows.groupby("round"):
        assert sorted(frame["agent_id"].tolist()) == list(range(n))
    assert set(rows["status"]) == {"ok"}  # answered: shared or by calls of their own
    assert rows["shared"].any() and not rows["shared"].all()
    assert (rows["tokens_in"] >= 0).all() and (rows["tokens_out"] >= 0).all()
    log = RunPaths(config.run_dir).log
    assert "Traceback" not in (log.read_text() if log.exists() else "")
