"""Config sections of the LLM back-ends: ``[agents.llamacpp]``, ``[agents.tgi]``,
``[agents.openai]``. Parsed once by ``simpipe.config``; nothing here reads files."""

from __future__ import annotations

from typing import Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, StrictInt, field_validator


def parse_base_url(url: str) -> SplitResult:
    """``http://host[:port][/prefix]`` or ``https://...``; ValueError saying what is wrong."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r}: expected http://host:port or https://host[/prefix]")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a base URL has no ?query or #fragment")
    return parts


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LlamaCppSettings(_Section):
    """The embedded llama.cpp engine (xllamacpp), loaded once per worker process."""

    model_path: str | None = None  # None: the default Gemma 3 270M from its PyPI package
    n_parallel: StrictInt = Field(32, ge=1, le=512)  # llama.cpp slots: sequences decoded together
    n_ctx: StrictInt = Field(0, ge=0)  # 0: n_parallel * 512 tokens
    threads: StrictInt = Field(0, ge=0)  # 0: the worker's thread budget (all cores if unknown)
    prompt_style: Literal["completion", "chat"] = "completion"


class HttpSettings(_Section):
    """What the TGI and OpenAI-compatible back-ends share: endpoints and load control."""

    # At least one: a back-end with no server to send to could only fail every agent.
    endpoints: list[str] = Field(default_factory=list, min_length=1)
    # in-flight requests per endpoint per worker process
    max_concurrency: StrictInt = Field(64, ge=1)
    timeout_s: FiniteFloat = Field(120.0, gt=0)
    retries: StrictInt = Field(4, ge=0)  # after the first attempt
    backoff_s: FiniteFloat = Field(0.5, ge=0)  # first back-off; doubles each retry, with jitter
    backoff_max_s: FiniteFloat = Field(20.0, ge=0)
    # The largest answer body accepted (bytes); a larger one is that agent's error. Inference
    # answers are a few KiB; the bound keeps a broken or hostile server from filling memory.
    max_response_bytes: StrictInt = Field(2**20, ge=4096, le=2**30)

    @field_validator("endpoints")
    @classmethod
    def _base_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parse_base_url(url)
        return urls


class TgiSettings(HttpSettings):
    """text-generation-inference servers, ``POST /generate``."""

    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8080"], min_length=1)


class OpenAISettings(HttpSettings):
    """Any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, TGI Messages API)."""

    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"], min_length=1)
    model: str = "default"
    api: Literal["completions", "chat"] = "completions"
    # How the server takes an output constraint: vLLM: "guided_regex"/"structured_outputs";
    # llama.cpp server: "grammar" (GBNF) or "json_schema"; "none": parser only.
    constraint: Literal["auto", "grammar", "json_schema", "guided_regex", "none"] = "auto"


class SamplingSettings(_Section):
    """Sampling shared by every LLM back-end (under ``[agents]``).

    ``top_k`` and ``min_p`` default to off, and are sent to llama.cpp explicitly: its server
    otherwise applies its own defaults (top_k 40, min_p 0.05), so ``temperature = 1.0`` and
    ``top_p = 1.0`` would not mean the model's own distribution.
    """

    temperature: FiniteFloat = Field(1.0, ge=0)
    top_p: FiniteFloat = Field(1.0, gt=0, le=1)
    top_k: StrictInt = Field(0, ge=0)  # 0: off
    min_p: FiniteFloat = Field(0.0, ge=0, lt=1)  # 0: off
    max_tokens: StrictInt = Field(8, ge=1)  # for prompt = "basic"; CoT gets cot_max_tokens
    cot_max_tokens: StrictInt = Field(256, ge=1)
