"""Any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, TGI's Messages API.

Prompt requests go to ``/v1/completions`` (or, with ``api = "chat"``, to
``/v1/chat/completions`` as one user message); message requests always go to
``/v1/chat/completions``. ``top_p`` is always sent (an OpenAI-wide field: a stock llama.cpp
server's own default is 0.95, not 1.0); ``top_k`` and ``min_p`` only when set, except to servers
known to be llama.cpp's (``answer_distributions = "llamacpp"``, whose defaults are 40 and
0.05): they get them always (OpenAI itself refuses both fields);
``temperature`` is always sent (0 is valid OpenAI-wide: greedy).

Output constraints (``settings.constraint``), from the servers' sources:
- ``"grammar"``: llama.cpp's top-level ``grammar`` (GBNF).
- ``"lark"``: llama.cpp's top-level ``grammar`` in llguidance's form (``%llguidance``), GBNF
  where the answer has no such form (chain of thought). llama.cpp builds with llguidance
  (xllamacpp's) mask the vocabulary once per token; its GBNF sampler instead decodes every
  one of the 262,144 tokens' text whenever the sampled token breaks the grammar, one slot at
  a time on the server's main thread. Same seeds, same answers as ``"grammar"`` (tested);
  a server built without llguidance aborts (``GGML_ABORT``) on such a grammar, so this is
  never chosen for a server not declared to take it.
- ``"json_schema"``: llama.cpp's top-level ``json_schema`` (converted to a grammar there;
  builds without llguidance ignore a ``number``'s ``minimum``/``maximum``,
  docs/measurements.md).
- ``"guided_regex"``: vLLM's regex, as ``structured_outputs: {"regex": ...}`` (vLLM >=
  0.10.2; the old top-level ``guided_regex`` was removed in 0.12 and is *silently ignored*
  there, so it is not what this sends).
- ``"auto"``: GBNF as ``grammar`` *and* the regex as ``structured_outputs.regex`` in one
  body. This is safe because neither server rejects the other's field: vLLM's request
  models are ``extra="allow"`` (an unknown field is logged as "present in the request but
  ignored" and dropped) and llama.cpp's server reads only the keys it knows. With a
  schema and no GBNF, ``json_schema`` (llama.cpp) and ``structured_outputs.json`` (vLLM)
  are sent instead; some llama.cpp versions refuse ``grammar`` and ``json_schema`` together
  (the xllamacpp build here takes either), so the two are never both sent. llama.cpp's
  ``/v1/completions`` ignores OpenAI's ``response_format`` (measured: unconstrained text),
  which is why the schema goes as top-level ``json_schema``.
- ``"none"``: no constraint; the tolerant parser does the work.

Several samples per request (``n_per_request`` > 1): a round's agents with the same request
are grouped (in agent order, at most ``n_per_request`` each) and each group is one request
with ``"n": k`` and its first agent's seed; choice j goes to the group's agent j. The prompt
is evaluated once per request instead of once per agent. What the servers do with ``n`` and
``seed`` is in docs/shared-answers.md ("What each back-end can expose").
"""

from __future__ import annotations

import contextlib
import functools
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from simpipe.core import aio
from simpipe.inference.answer_checks import (
    MalformedAnswer,
    checked_answer,
    json_object,
    not_an_object,
)
from simpipe.inference.base import AnswerColumns, GenerationRequest, OutputConstraint
from simpipe.inference.cost_model import LLAMACPP_GEMMA3_270M, VLLM_A100_LLAMA3_8B, CostModel
from simpipe.inference.http.backend import HttpBackend, RequestFailed, seed_template
from simpipe.inference.llamacpp import logprobs as llamacpp_logprobs
from simpipe.inference.llamacpp.sampler import next_token as llamacpp_next_token
from simpipe.inference.settings import OpenAISettings
from simpipe.inference.types import AnswerVocab, Probe, ProbeError
from simpipe.inference.vllm import logprobs as vllm_logprobs
from simpipe.inference.vllm import sampler as vllm_sampler

# json.dumps with its cached default encoder measured fastest (ASCII escapes are valid JSON).
_dumps = json.dumps


class OpenAIBackend(HttpBackend):
    """``/v1/completions`` and ``/v1/chat/completions`` of an OpenAI-compatible server."""

    def __init__(self, settings: OpenAISettings) -> None:
        super().__init__(settings)
        self.settings = settings
        self.prompt_style = "chat" if settings.api == "chat" else "completion"
        self._model = settings.model
        self._chat = settings.api == "chat"
        self._constraint = settings.constraint
        # Answer distributions over HTTP: only where the servers' kind is known, each with
        # its server's routes and sampler model.
        self._llamacpp = settings.answer_distributions == "llamacpp"
        self.supports_answer_distributions = settings.answer_distributions != "off"
        self.answer_sampler = (llamacpp_next_token if self._llamacpp
                               else vllm_sampler.next_token)
        self._vocabs: dict[frozenset[str], AnswerVocab] = {}
        # A llama.cpp server's sessions run on as many slots as this process may keep
        # requests in flight, batched together in its decodes (measured: docs/benchmarks.md,
        # "Answer trees side by side, answers ended at a maximal answer on a llama.cpp
        # server"). vLLM's stay one at a time: not measured there, and the emulated fleet
        # prices a server's requests in the order they come.
        self.session_concurrency = self._pool.capacity if self._llamacpp else 1

    @classmethod
    def shares_answers(cls, settings: Any) -> bool:
        return settings.answer_distributions != "off"

    @classmethod
    def samples_per_request(cls, settings: Any) -> int:
        return settings.n_per_request

    @classmethod
    def default_costs(cls, settings: Any) -> CostModel:
        if settings.answer_distributions == "llamacpp":
            return LLAMACPP_GEMMA3_270M
        return VLLM_A100_LLAMA3_8B

    def _post(self, path: str, body: dict, prefer: int | None = None) -> Any:
        """One request from a worker thread, through the pool (retries, counters);
        ``prefer``: the endpoint to try first (``EndpointPool._send``)."""
        try:
            return aio.run_async(self._pool.post_json(path, _dumps(body).encode(), prefer))
        except RequestFailed as exc:
            raise ProbeError(f"{path}: {exc}") from None

    def _post_many(self, path: str, bodies: list[dict]) -> list[Any]:
        try:
            return aio.run_async(vllm_logprobs.gather_posts(self._pool.post_json, path, bodies))
        except RequestFailed as exc:
            raise ProbeError(f"{path}: {exc}") from None

    def answer_vocab(self, alphabet: frozenset[str]) -> AnswerVocab:
        """The answer tokens and end-of-generation ids, from the server's ``/tokenize``
        (asked once per alphabet and back-end)."""
        vocab = self._vocabs.get(alphabet)
        if vocab is None:
            vocab = self._vocabs[alphabet] = (
                llamacpp_logprobs.answer_vocab(self._post_many, alphabet) if self._llamacpp
                else vllm_logprobs.answer_vocab(self._post_many, self._model, alphabet))
        return vocab

    @contextlib.contextmanager
    def logprob_session(self, prompt: str, lone: bool = True) -> Iterator[Probe]:
        """``probe(path, top_n)`` after ``prompt`` (``llamacpp_logprobs.session`` or
        ``vllm_logprobs.session``). Every request of the session goes to one server (the
        prompt's hash picks it, while it is up): each probe then finds the prompt in that
        server's prefix cache, where spread over the servers each would evaluate it.
        ``lone`` matters to llama.cpp's server only (a slot of its own, or any)."""
        post = functools.partial(self._post, prefer=zlib.crc32(prompt.encode()))
        if self._llamacpp:
            yield from llamacpp_logprobs.session(post, prompt, lone)
        else:
            yield from vllm_logprobs.session(post, self._model, prompt,
                                             self.settings.max_logprobs)

    def _encode(self, req: GenerationRequest, n: int = 1) -> tuple[str, bytes]:
        body: dict[str, Any] = {"model": self._model}
        if req.messages is not None:
            path = "/v1/chat/completions"
            body["messages"] = list(req.messages)
        elif self._chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            path = "/v1/completions"
            body["prompt"] = req.prompt
        body["max_tokens"] = req.max_tokens
        body["temperature"] = req.temperature
        body["top_p"] = req.top_p
        # Not OpenAI's own parameters, but vLLM, SGLang and llama.cpp's server take them.
        # llama.cpp's server has its own defaults (top_p 0.95, top_k 40, min_p 0.05): to
        # known llama.cpp servers every value goes, so the calls sample what the answer
        # distributions model.
        if req.top_k > 0 or self._llamacpp:
            body["top_k"] = req.top_k
        if req.min_p > 0 or self._llamacpp:
            body["min_p"] = req.min_p
        body["seed"] = req.seed
        if n > 1:  # absent at 1, so a lone agent's body is the per-agent one
            body["n"] = n
        if req.stop:
            body["stop"] = list(req.stop)
        if req.constraint is not None and self._constraint != "none":
            _add_constraint(body, req.constraint, self._constraint)
            if (self._llamacpp and path == "/v1/completions" and n == 1 and not req.stop
                    and req.constraint.ends and "grammar" in body):
                # llama.cpp's own route says which stop string ended the answer (its
                # OpenAI route drops it from the text): the answer's last decode, which
                # only draws the end of generation the grammar forces after a maximal
                # answer (" 27"), is left out. Measured: 3 tokens generated a request
                # instead of 4, 14-21 % more requests a second (docs/benchmarks.md,
                # "Answer trees side by side, answers ended at a maximal answer ...").
                path = LLAMACPP_COMPLETION
                body["stop"] = list(req.constraint.ends)
                del body["model"]
        return path, _dumps(body).encode()

    def _decode(self, data: Any, headers: Mapping[str, str]) -> tuple[str, int, int, str | None]:
        if type(data) is dict and "choices" not in data and self._llamacpp:
            return decode_llamacpp_answer(data)
        return decode_openai_answer(data)

    async def generate_many(self, distinct: Sequence[GenerationRequest], codes: np.ndarray,
                            seeds: np.ndarray, *, reproducible: bool = False) -> AnswerColumns:
        cap = self.settings.n_per_request
        if cap <= 1:
            return await super().generate_many(distinct, codes, seeds,
                                               reproducible=reproducible)
        groups = sample_groups(codes, cap)
        seed_of = seeds.tolist()
        code_of = codes.tolist()
        templates: dict[tuple[int, int], tuple[str, bytes, bytes] | str | None] = {}

        def job(g: int) -> tuple[str, bytes] | str:
            members = groups[g]
            code, k = code_of[members[0]], len(members)
            template = templates.get((code, k), "")
            if template == "":
                template = templates[code, k] = _n_template(self, distinct[code], k)
            if type(template) is tuple:
                path, head, tail = template
                return path, b"%s%d%s" % (head, seed_of[members[0]], tail)
            return template or "cannot encode request: no seed in the body"  # type: ignore[return-value]

        out = AnswerColumns(len(codes))
        await self._pool.run_groups(groups, job, _decode_choices, out)
        return out


def sample_groups(codes: np.ndarray, cap: int) -> list[list[int]]:
    """Agents (indices) grouped by their distinct request, in agent order within each,
    cut into groups of at most ``cap``: the same codes give the same groups every run."""
    order = np.argsort(codes, kind="stable")
    if len(order) == 0:
        return []
    sorted_codes = codes[order]
    cuts = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
    groups: list[list[int]] = []
    for run in np.split(order, cuts):
        members = run.tolist()
        groups.extend(members[i:i + cap] for i in range(0, len(members), cap))
    return groups


def _n_template(backend: OpenAIBackend, req: GenerationRequest,
                n: int) -> tuple[str, bytes, bytes] | str | None:
    try:
        return seed_template(lambda r: backend._encode(r, n), req)
    except (ValueError, TypeError) as exc:
        return f"cannot encode request: {exc}"


def _decode_choices(data: Any, headers: Mapping[str, str]) -> tuple[Any, int, int, Any]:
    """``(texts, tokens_in, tokens_out, finish_reasons)`` of an answer with ``n`` choices,
    in the order of their ``index``; ``MalformedAnswer`` as ``decode_openai_answer``."""
    if type(data) is not dict:
        raise not_an_object(data, "the answer")
    choices = data.get("choices")
    if type(choices) is not list or not choices:
        raise MalformedAnswer("choices is not a non-empty list")
    texts, finishes = [], []
    tokens_in = tokens_out = 0
    for j, choice in enumerate(sorted(choices, key=_choice_index)):
        if _choice_index(choice) != j:
            raise MalformedAnswer(f"choices[{j}].index is not {j}")
        text, t_in, t_out, fin = decode_openai_answer({"choices": [choice],
                                                       "usage": data.get("usage")})
        texts.append(text)
        finishes.append(fin)
        tokens_in, tokens_out = t_in, t_out  # usage is the whole request's
    return tuple(texts), tokens_in, tokens_out, tuple(finishes)


def _choice_index(choice: Any) -> int:
    index = choice.get("index") if type(choice) is dict else None
    if type(index) is not int:
        raise MalformedAnswer("a choice has no integer index")
    return index


#: llama.cpp's own completion route (per-agent answers that end at a stop string).
LLAMACPP_COMPLETION = "/completion"
#: llama.cpp's ``stop_type`` as OpenAI's ``finish_reason``.
_LLAMACPP_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}
_LLAMACPP_FIELDS = ("content", "tokens_evaluated", "tokens_predicted", "stop_type")


def decode_llamacpp_answer(data: Any) -> tuple[str, int, int, str | None]:
    """(text, tokens_in, tokens_out, finish_reason) of an answer of llama.cpp's
    ``/completion``: the text is ``content`` followed by the stop string that ended it
    (``stopping_word``: the request's only stop strings are the answer's ends, which belong
    to the answer); ``MalformedAnswer`` naming a field that is missing or of the wrong
    type."""
    content, stop_type = data.get("content"), data.get("stop_type")
    if stop_type == "word":
        word = data.get("stopping_word")
        if type(word) is not str or type(content) is not str:
            raise MalformedAnswer("content or stopping_word is not text")
        content += word
    finish = _LLAMACPP_FINISH.get(stop_type, stop_type) if type(stop_type) is str else stop_type
    return checked_answer(content, data.get("tokens_evaluated", 0),
                          data.get("tokens_predicted", 0), finish, _LLAMACPP_FIELDS)


def decode_openai_answer(data: Any) -> tuple[str, int, int, str | None]:
    """(text, tokens_in, tokens_out, finish_reason) of a completions or chat answer; raises
    ``MalformedAnswer`` naming the field that is missing or of the wrong type."""
    if type(data) is not dict:
        raise not_an_object(data, "the answer")
    choices = data.get("choices")
    if type(choices) is not list or not choices:
        raise MalformedAnswer("choices is not a non-empty list")
    choice = choices[0]
    if type(choice) is not dict:
        raise not_an_object(choice, "choices[0]")
    text = choice.get("text")
    if text is None:  # chat: the message content (null when the model said nothing)
        text = json_object(choice.get("message"), "choices[0].message").get("content")
        fields = _CHAT_FIELDS
        if text is None:
            text = ""
    else:
        fields = _COMPLETION_FIELDS
    usage = data.get("usage")
    if usage is None:
        tokens_in = tokens_out = 0
    elif type(usage) is dict:
        tokens_in = usage.get("prompt_tokens", 0)
        tokens_out = usage.get("completion_tokens", 0)
    else:
        raise not_an_object(usage, "usage")
    return checked_answer(text, tokens_in, tokens_out, choice.get("finish_reason"), fields)


_USAGE = ("usage.prompt_tokens", "usage.completion_tokens", "choices[0].finish_reason")
_COMPLETION_FIELDS = ("choices[0].text", *_USAGE)
_CHAT_FIELDS = ("choices[0].message.content", *_USAGE)


def _add_constraint(body: dict, c: OutputConstraint, mode: str) -> None:
    if mode == "grammar":
        if c.gbnf:
            body["grammar"] = c.gbnf
    elif mode == "lark":
        if c.lark or c.gbnf:
            body["grammar"] = c.lark or c.gbnf
    elif mode == "json_schema":
        if c.json_schema:
            body["json_schema"] = c.json_schema
    elif mode == "guided_regex":
        if c.regex:
            body["structured_outputs"] = {"regex": c.regex}
    else:  # auto
        if c.gbnf:
            body["grammar"] = c.gbnf
        elif c.json_schema:
            body["json_schema"] = c.json_schema
        if c.regex:
            body["structured_outputs"] = {"regex": c.regex}
        elif c.json_schema:
            body["structured_outputs"] = {"json": c.json_schema}
