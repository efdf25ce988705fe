"""The one interface every LLM inference back-end implements.

The round loop hands a back-end a whole partition's requests at once; the back-end
decides how to overlap them (continuous batching in-process, bounded concurrency per
HTTP endpoint) and returns one result per request, in order. A back-end never raises
for a single failed request: the failure becomes that agent's ``status="error"``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from simpipe.inference.cost_model import CostModel
from simpipe.inference.llamacpp.sampler import next_token as llamacpp_next_token

T = TypeVar("T")

#: Told of answers as they arrive, ``listener(n)``: n more agents have theirs (the round's
#: progress moves while a partition's calls run, rather than when all have returned). Set
#: around a back-end call with ``listening``; back-ends take it with ``answer_listener()``
#: when a call starts and tell it as each request ends (on the event loop or on an engine
#: thread: a listener is thread-safe).
_LISTENER: ContextVar[Callable[[int], None] | None] = ContextVar("simpipe_answer_listener",
                                                                 default=None)


def answer_listener() -> Callable[[int], None] | None:
    """The listener of the back-end call running in this context, if any."""
    return _LISTENER.get()


async def listening(call: Awaitable[T], listener: Callable[[int], None] | None) -> T:
    """``await call`` with ``listener`` told of its answers as they arrive (this task's own
    context: the requests it spawns inherit it, nothing outside does)."""
    _LISTENER.set(listener)
    return await call


@dataclass(frozen=True)
class OutputConstraint:
    """What the answer is allowed to look like, in each dialect servers accept.

    A back-end uses the first form its server supports (llama.cpp: ``lark``, ``gbnf``; TGI:
    ``regex``; vLLM / OpenAI-compatible: ``regex`` or ``json_schema``) and otherwise sends
    no constraint and relies on the tolerant parser.
    """

    gbnf: str | None = None
    regex: str | None = None
    json_schema: dict | None = None
    #: The same language as an llguidance grammar: the embedded llama.cpp sends it instead
    #: of ``gbnf`` when its build has llguidance (see ``simpipe.games.answer_format``).
    lark: str | None = None
    #: Answers of the grammar that no answer extends, each after its leading space
    #: (``IntegerAnswers.ends``): a server that says which stop string ended a generation
    #: (llama.cpp's ``/completion``) takes them as stop strings, and the answer ends there
    #: instead of a decode later, with the end of generation the grammar would force.
    ends: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One agent's call. Exactly one of ``prompt`` (plain completion) or ``messages``
    (chat, OpenAI message dicts) is set."""

    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    max_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    seed: int = 0
    stop: tuple[str, ...] = ()
    constraint: OutputConstraint | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("GenerationRequest needs exactly one of prompt or messages")


@dataclass
class GenerationResult:
    """One agent's answer (or why there is none)."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    status: Literal["ok", "error"] = "ok"
    error: str | None = None
    finish_reason: str | None = None
    endpoint: str | None = None


class AnswerColumns:
    """Many agents' answers as columns (one list each, one row per agent), filled in place:
    a million-agent round makes no object per answer. ``error`` is None for an answer;
    ``finish`` is the back-end's finish reason ("length": cut at ``max_tokens``), None where
    it gave none."""

    __slots__ = ("error", "finish", "latency_s", "text", "tokens_in", "tokens_out")

    def __init__(self, n: int) -> None:
        self.text: list[str | None] = [None] * n
        self.tokens_in: list[int] = [0] * n
        self.tokens_out: list[int] = [0] * n
        self.latency_s: list[float] = [0.0] * n
        self.error: list[str | None] = [None] * n
        self.finish: list[str | None] = [None] * n

    def __len__(self) -> int:
        return len(self.text)

    def put(self, i: int, result: GenerationResult) -> None:
        self.text[i] = result.text
        self.tokens_in[i] = result.tokens_in
        self.tokens_out[i] = result.tokens_out
        self.latency_s[i] = result.latency_s
        self.finish[i] = result.finish_reason
        if result.status == "error":
            self.error[i] = result.error or "the back-end gave no answer"

    @classmethod
    def of(cls, results: Sequence[GenerationResult]) -> AnswerColumns:
        cols = cls(len(results))
        for i, result in enumerate(results):
            cols.put(i, result)
        return cols


@dataclass
class EndpointCounters:
    """Per-endpoint counters, summed across partitions into ``run.json``."""

    requests: int = 0
    errors: int = 0
    retries: int = 0
    marked_down: int = 0  # times it sat out after connection failures or timeouts in a row
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s_sum: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "retries": self.retries,
            "marked_down": self.marked_down,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "latency_s_sum": round(self.latency_s_sum, 6),
        }


class Backend(abc.ABC):
    """An LLM inference back-end. One instance per worker process, reused across
    partitions and rounds (see ``simpipe.agents.registry``)."""

    #: Which prompt shape suits the model behind it: "completion" (a base model such as
    #: the default Gemma 270M) or "chat" (instruction-tuned models behind a chat API).
    prompt_style: Literal["completion", "chat"] = "completion"

    #: Whether it can return raw next-token log-probabilities for a prompt followed by
    #: token ids, with the vocabulary facts to interpret them (``logprob_session``,
    #: ``answer_vocab``): what sharing one answer distribution per distinct prompt needs.
    #: Why the others cannot is in docs/shared-answers.md ("What each back-end can expose").
    supports_answer_distributions: bool = False

    #: Whether it walks answer trees in one chain of probes on a lone sequence
    #: (``logprob_chain``: the embedded engine): each prompt then costs only what it does
    #: not share with the one probed before it, so a partition walks the prompts few agents
    #: hold lazily itself and the round plan keeps full trees for widely shared ones.
    chains_probes: bool = False

    def answer_vocab(self, alphabet: frozenset[str]) -> Any:
        """The answer tokens spelling ``alphabet`` and the end-of-generation ids
        (``simpipe.inference.llamacpp.gguf_vocab.AnswerVocab``). Only where
        ``supports_answer_distributions``."""
        raise NotImplementedError(f"{type(self).__name__} computes no answer distributions")

    #: How many ``logprob_session``s of one process run well side by side when they need
    #: not be lone (``agents.reproducible`` off): the sessions of a list of prompts then
    #: run that many at a time (``simpipe.answers.shared``), where a server batches their
    #: probes together. 1: one after the other.
    session_concurrency: int = 1

    def logprob_session(self, prompt: str, lone: bool = True) -> AbstractContextManager[Any]:
        """One prompt's ``Probe`` (``simpipe.answers.distribution``). ``lone``: its numbers
        must not depend on what else the engine computes meanwhile (the same calls give the
        same bits on every run); False lets a server place and batch them as it likes. Only
        where ``supports_answer_distributions``."""
        raise NotImplementedError(f"{type(self).__name__} computes no answer distributions")

    def logprob_chain(self, vocab: Any = None, settings: Any = None
                      ) -> AbstractContextManager[Callable[[str], Any]]:
        """Exclusive use of the engine for several prompts' probes in one chain; yields
        ``probe_for(prompt)``. Only where ``chains_probes``."""
        raise NotImplementedError(f"{type(self).__name__} walks no chain of probes")

    #: Whether ``probe_each`` evaluates several prompts' probes together, in batches fixed
    #: by the list of prompts alone (the embedded engine, ``simpipe.inference.llamacpp.batch``):
    #: the answer-tree consumers then hand it a list of prompts at once instead of walking
    #: them one after another in a chain.
    batched_evaluation: bool = False

    def probe_each(self, prompts: Sequence[str], work: Callable[[int, Any], T], vocab: Any,
                   settings: Any, on_result: Callable[[int, T], None] | None = None
                   ) -> list[T]:
        """``work(i, probe)`` for each prompt ``i``, with that prompt's ``Probe``
        (``simpipe.answers.distribution``) for the answer ``vocab`` and sampler
        ``settings``; the results in order, each also told to ``on_result(i, result)`` on
        the calling thread as it is ready. Only where ``batched_evaluation``."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate prompts in batches")

    #: The server's sampler as a model (``next_token`` of ``llamacpp.sampler`` or
    #: ``vllm.sampler``): what the answer-distribution walk applies to the probed tokens.
    answer_sampler: Callable[..., Any] = staticmethod(llamacpp_next_token)

    @classmethod
    def shares_answers(cls, settings: Any) -> bool:
        """Whether a back-end with these settings can compute shared answer distributions
        (without building it)."""
        return cls.supports_answer_distributions

    @classmethod
    def samples_per_request(cls, settings: Any) -> int:
        """The most agents with one prompt it answers with one request of several samples
        (OpenAI's ``n``); 1: one request per agent. The round plan prices that way of
        answering (``simpipe.answers.planner``)."""
        return 1

    @classmethod
    def default_costs(cls, settings: Any) -> CostModel | None:
        """What its requests cost the servers behind it when the config gives no costs
        (``agents.cost``) and the servers are not emulated (the emulator's profile prices
        those); None: nothing to price (the embedded engine decides by its own measured
        costs, ``simpipe.answers.shared.full_tree_pays``)."""
        return None

    @abc.abstractmethod
    async def generate(self, requests: Sequence[GenerationRequest], *,
                       reproducible: bool = False) -> list[GenerationResult]:
        """Answer every request; the result list is in request order.

        ``reproducible``: the same requests give the same texts on every run, where the
        back-end can promise that (the embedded llama.cpp answers them one at a time); the
        HTTP back-ends cannot (the servers batch as they like) and ignore it.
        """

    def counters(self) -> dict[str, dict]:
        """Counters per endpoint name since the back-end was created."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - not abstract: most back-ends hold nothing
        """Release sessions, servers and models."""

    async def generate_many(self, distinct: Sequence[GenerationRequest], codes: np.ndarray,
                            seeds: np.ndarray, *, reproducible: bool = False) -> AnswerColumns:
        """One answer per agent ``i``: request ``distinct[codes[i]]`` with seed ``seeds[i]``.

        The per-agent path of a round: agents share few distinct prompts (all of them in
        round 1 without personas), so a back-end can prepare each distinct request once.
        This default makes one request object per agent and calls ``generate``;
        ``reproducible`` as there.
        """
        requests = [dataclasses.replace(distinct[c], seed=s)
                    for c, s in zip(codes.tolist(), seeds.tolist(), strict=True)]
        return AnswerColumns.of(await self.generate(requests, reproducible=reproducible))
