"""The one interface every LLM inference back-end implements.

The round loop hands a back-end a whole partition's requests at once; the back-end
decides how to overlap them (continuous batching in-process, bounded concurrency per
HTTP endpoint) and returns one result per request, in order. A back-end never raises
for a single failed request: the failure becomes that agent's ``status="error"``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class OutputConstraint:
    """What the answer is allowed to look like, in each dialect servers accept.

    A back-end uses the first form its server supports (llama.cpp: ``gbnf``; TGI:
    ``regex``; vLLM / OpenAI-compatible: ``regex`` or ``json_schema``) and otherwise sends
    no constraint and relies on the tolerant parser.
    """

    gbnf: str | None = None
    regex: str | None = None
    json_schema: dict | None = None


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


@dataclass
class EndpointCounters:
    """Per-endpoint counters, summed across partitions into ``run.json``."""

    requests: int = 0
    errors: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s_sum: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "retries": self.retries,
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
    #: Why the others cannot is in the README ("Shared answers").
    supports_answer_distributions: bool = False

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

    async def aclose(self) -> None:
        """Release sessions, servers and models."""
