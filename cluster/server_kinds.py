"""``cluster.servers.kind`` as plug-ins: each declares its name, its command template, which
``agents.backend`` its URLs feed, and what ``--emulate`` needs to imitate it.

``SERVER_KINDS`` is the one list: ``[cluster.servers]`` takes its allowed kinds and the
description of ``kind`` from it, the server launcher its command template, ``--emulate`` its
protocol and emulator parameters. Adding a server kind is one entry here.

How servers of a kind run as local processes (clusters without SLURM server jobs) is named
as ``"module:function"`` and imported when first used: the emulator's server code loads only
where emulators run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from simpipe.servers.emulator_profiles import INTEGER_LIMITS

#: TGI's --max-concurrent-requests default.
TGI_MAX_CONCURRENT = 128
#: vLLM (and llama.cpp's server) queue every request and never answer 429; an emulator needs
#: a bound (each waiting request holds memory): the largest it takes.
NO_LIMIT = INTEGER_LIMITS["max_concurrent_requests"]


@dataclass(frozen=True)
class ServerKindPlugin:
    """One ``cluster.servers.kind``."""

    name: str
    #: What it is, for the config reference ("" when the name says it all).
    summary: str = ""
    #: The command line of one server: a template with ``{model} {host} {port} {gpus} {cpus}
    #: {python} {extra_args} {index}`` (and ``{model_flag} {emulator_args}``); "" when there
    #: is none ready-made, so ``cluster.servers.command`` is required.
    template: str = ""
    #: False only for "no servers": nothing is started and no endpoints are replaced.
    starts_servers: bool = True
    #: The ``agents.backend`` whose ``endpoints`` its URLs become; None: whichever back-end
    #: the config chooses (a custom command), or, for the emulator, its ``protocol``.
    endpoint_backend: str | None = None
    #: Needs ``cluster.servers.model`` (or a ``command`` of its own).
    needs_model: bool = False
    #: The emulator itself: several emulated GPUs (ports) per process, no GPUs booked, an
    #: estimate of the real run afterwards.
    emulator: bool = False
    #: ``(servers) -> context manager yielding URLs``: runs them as processes on this machine
    #: (cluster kinds that start no SLURM server jobs); None: SLURM jobs only.
    local: str | None = None
    #: ``--emulate``: the emulator parameters that imitate this kind's own defaults, and its
    #: ``extra_args`` flags that set an emulator parameter (flag -> parameter).
    emulator_params: Mapping[str, float] = field(default_factory=dict)
    emulator_flags: Mapping[str, str] = field(default_factory=dict)
    #: ``cluster.servers.batch_invariant``: the environment that makes this kind's output of
    #: a request independent of what else is in its batch (with the per-request seed: the
    #: same guesses on every run); empty: the kind has no such mode and the key is refused.
    batch_invariant_env: Mapping[str, str] = field(default_factory=dict)
    #: ``"module:function"``, ``(extra arguments) -> slots``: the requests one server of this
    #: kind started with those arguments decodes together (None: arguments it would not
    #: start with); None: the kind does not say (vLLM and TGI batch what arrives).
    slots: str | None = None
    #: ``"module:function"``, ``() -> bool``: whether servers of this kind, started from this
    #: install, take answer grammars in llguidance's form (``agents.openai.constraint =
    #: "lark"``); None: the kind does not say.
    llguidance: str | None = None

    @property
    def needs_command(self) -> bool:
        """Servers are started, but no ready-made command line starts them."""
        return self.starts_servers and not self.template

    @property
    def needs_slurm(self) -> bool:
        """Its servers only run as SLURM jobs (``cluster.kind = "slurm"``)."""
        return self.starts_servers and self.local is None

    def slots_of(self, extra_args: list[str]) -> int | None:
        """One server's slots when started with ``extra_args``; None where not known."""
        if self.slots is None:
            return None
        module, _, function = self.slots.partition(":")
        return getattr(importlib.import_module(module), function)(extra_args)

    def takes_llguidance(self) -> bool:
        """Whether its servers take llguidance grammars (False where the kind does not say)."""
        if self.llguidance is None:
            return False
        module, _, function = self.llguidance.partition(":")
        return bool(getattr(importlib.import_module(module), function)())

    def local_processes(self) -> Callable[[Any], AbstractContextManager[list[str]]]:
        if self.local is None:
            raise ValueError(f"cluster.servers.kind = {self.name!r} runs as SLURM jobs only")
        module, _, function = self.local.partition(":")
        return getattr(importlib.import_module(module), function)


SERVER_KINDS: dict[str, ServerKindPlugin] = {kind.name: kind for kind in (
    ServerKindPlugin("none", starts_servers=False),
    # text-generation-inference; one shard per GPU of the server.
    ServerKindPlugin(
        "tgi", endpoint_backend="tgi", needs_model=True,
        template=("text-generation-launcher --model-id {model} --hostname {host} --port {port} "
                  "--num-shard {gpus} {extra_args}"),
        emulator_params={"max_concurrent_requests": TGI_MAX_CONCURRENT},
        emulator_flags={"--max-concurrent-requests": "max_concurrent_requests",
                        "--max-batch-prefill-tokens": "max_batch_prefill_tokens"}),
    # vLLM's OpenAI-compatible server; tensor parallel over the server's GPUs.
    ServerKindPlugin(
        "vllm", endpoint_backend="openai", needs_model=True,
        template=("vllm serve {model} --host {host} --port {port} --tensor-parallel-size {gpus} "
                  "{extra_args}"),
        emulator_params={"max_concurrent_requests": NO_LIMIT},
        emulator_flags={"--max-num-seqs": "max_batch",
                        "--max-num-batched-tokens": "max_batch_prefill_tokens",
                        "--block-size": "block_size"},
        # vLLM's documented switch (docs "Batch Invariance", beta; NVIDIA GPUs of compute
        # capability 8.0 or higher in its latest docs, 9.0 in earlier ones).
        batch_invariant_env={"VLLM_BATCH_INVARIANT": "1"}),
    # llama.cpp's server through the embedded engine (CPU nodes, tests).
    ServerKindPlugin(
        "llamacpp", "the embedded engine's HTTP server, for CPU nodes", endpoint_backend="openai",
        template=("{python} -m simpipe.servers.llamacpp_server --host {host} --port {port} "
                  "--threads {cpus} {model_flag} {extra_args}"),
        emulator_params={"max_concurrent_requests": NO_LIMIT},
        slots="simpipe.servers.llamacpp_server:slots_of",
        llguidance="simpipe.servers.llamacpp_server:takes_llguidance"),
    ServerKindPlugin("custom", "needs `command`"),
    # Emulated GPU servers (dry runs): one process, several GPUs on ports from {port}.
    ServerKindPlugin(
        "emulated", "simpipe's GPU server emulator: [emulator](emulator.md)", emulator=True,
        template=("{python} -m simpipe.servers.emulator --host {host} --port {port} "
                  "{emulator_args} {extra_args}"),
        local="simpipe.cluster.local_servers:local_emulators"),
)}
#: ``cluster.servers.kind`` when the config names none.
DEFAULT_SERVER_KIND = "none"


def kind_description() -> str:
    """The config reference's text for ``cluster.servers.kind``, from the registry."""
    return ", ".join(f"`{k.name}` ({k.summary})" if k.summary else f"`{k.name}`"
                     for k in SERVER_KINDS.values())
