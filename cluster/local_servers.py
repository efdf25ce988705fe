"""Inference servers as processes on this machine, for cluster kinds that start no SLURM
server jobs: the ``local`` launcher of a server kind (``simpipe.cluster.server_kinds``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from simpipe.cluster.config import ServersConfig


@contextmanager
def local_emulators(servers: ServersConfig) -> Iterator[list[str]]:
    """Emulator processes on this machine for ``[cluster.servers]`` (kind ``emulated``):
    ``gpus_per_process`` GPUs each, free ports; their URLs, one per emulated server."""
    # The emulator's server code: only when emulators run on this machine.
    from simpipe.servers.emulator import EmulatorProcess

    emu = servers.emulated
    with ExitStack() as stack:
        urls: list[str] = []
        left = servers.count
        while left:
            gpus = min(left, emu.gpus_per_process)
            proc = EmulatorProcess(gpus=gpus, profile=emu.profile, time_scale=emu.time_scale,
                                   protocol=emu.protocol,
                                   model_id=emu.model_id or servers.model or None,
                                   params=emu.params)
            urls += stack.enter_context(proc).urls
            left -= gpus
        yield urls
